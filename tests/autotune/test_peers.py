"""The board through which one user's ``num_workers="auto"`` loaders see each other
(dloader._autotune.peers), on a real directory: what is read, what is skipped, and when a loader
works alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dloader._autotune.peers import MAX_BYTES, MAX_PEERS, STALE_S, PeerBoard
from dloader._autotune.tuner import Peer
from dloader._shared import env
from dloader.errors import ConfigError

PEER = Peer(worth=0.3, cpus=1.25, starved=True, busy=0.4, yielding=True, settled=True)


def test_loaders_see_each_others_records_but_not_their_own(tmp_path: Path) -> None:
    a, b = PeerBoard(tmp_path), PeerBoard(tmp_path)
    assert a.usable and b.usable and a.dir == b.dir and a.path != b.path
    assert oct(a.dir.stat().st_mode & 0o777) == "0o700"
    a.publish(PEER)
    assert a.peers() == () and b.peers() == (PEER,)
    b.publish(Peer(0.1, 0.5, False))
    assert a.peers() == (Peer(0.1, 0.5, False),)
    a.publish(Peer(0.4, 0.0, False))  # a newer record replaces the older
    assert b.peers() == (Peer(0.4, 0.0, False),)
    a.close()
    assert b.peers() == () and not a.path.exists()


def test_stale_dead_and_malformed_records_are_skipped(tmp_path: Path) -> None:
    me, other = PeerBoard(tmp_path), PeerBoard(tmp_path)
    other.publish(PEER, now=1000.0)
    assert me.peers(now=1000.0 + STALE_S - 1) == (PEER,)
    assert me.peers(now=1000.0 + STALE_S + 1) == ()  # not rewritten for too long
    assert other.path.exists()  # kept a while: its loader may be between windows
    assert me.peers(now=1e9) == () and not other.path.exists()  # long gone: removed

    def record(name: str, **fields: object) -> Path:
        path = me.dir / name
        base = {
            "pid": os.getpid(),
            "time": 1000.0,
            "worth": 0.3,
            "cpus": 1.0,
            "starved": True,
            "busy": 0.5,
            "yielding": False,
            "settled": True,
        }
        path.write_text(json.dumps({**base, **fields}))
        return path

    dead = record("dead.json", pid=2**22 + 12345)  # beyond pid_max: no such process
    record("nan.json", worth=float("nan"))
    record("negative.json", cpus=-1.0)
    record("huge.json", cpus=1e9)
    record("busier.json", busy=1.5)
    record("yielding.json", yielding=1)
    record("settled.json", settled=None)
    record("bool.json", starved="yes")
    record("pid.json", pid="1")
    (me.dir / "garbage.json").write_text("{not json")
    (me.dir / "big.json").write_text(json.dumps({"pad": "x" * MAX_BYTES}))
    (me.dir / "other.txt").write_text("ignored: not a record")
    os.symlink(dead, me.dir / "link.json")
    assert me.peers(now=1000.0) == ()
    assert not dead.exists()  # its process is gone
    good = record("good.json")
    assert me.peers(now=1000.0) == (Peer(0.3, 1.0, True, 0.5, settled=True),)
    good.unlink()


def test_at_most_max_peers_records_are_read(tmp_path: Path) -> None:
    boards = [PeerBoard(tmp_path) for _ in range(MAX_PEERS + 10)]
    for b in boards:
        b.publish(PEER)
    reader = PeerBoard(tmp_path)
    assert len(reader.peers()) == MAX_PEERS


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o707])
def test_a_directory_open_to_others_makes_a_loader_work_alone(
    tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / f"dloader-auto-{os.getuid()}"
    folder.mkdir()
    folder.chmod(mode)
    board = PeerBoard(tmp_path)
    assert not board.usable
    assert f"mode {mode:o}" in caplog.text and "works alone" in caplog.text
    board.publish(PEER)
    assert board.peers() == () and list(folder.iterdir()) == []


def test_a_symlinked_directory_makes_a_loader_work_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / f"dloader-auto-{os.getuid()}").symlink_to(target)
    assert not PeerBoard(tmp_path).usable


def test_disabled_and_unwritable_boards_work_alone(tmp_path: Path) -> None:
    off = PeerBoard(tmp_path, enabled=False)
    off.publish(PEER)
    assert not off.usable and off.peers() == () and not (tmp_path / off.dir.name).exists()
    assert not PeerBoard(tmp_path / "missing" / "deeper").usable


def test_dloader_auto_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLOADER_AUTO_PEERS", raising=False)
    assert env.auto_peers() is True
    monkeypatch.setenv("DLOADER_AUTO_PEERS", "0")
    assert env.auto_peers() is False
    monkeypatch.setenv("DLOADER_AUTO_PEERS", "no")
    with pytest.raises(ConfigError, match=r"DLOADER_AUTO_PEERS='no': expected 1 or 0"):
        env.auto_peers()
