"""The daemons' files on a shared node: sockets, folders, modes, and broken state files."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from dloader._daemon.paths import SocketClaim, own_folder
from dloader.allocator.cli import main as allocator_main
from dloader.errors import ConfigError
from dloader.sidecar.cli import main as sidecar_main
from dloader.sidecar.store import SidecarStore
from tests.sidecar.conftest import Sidecar

pytestmark = pytest.mark.integration


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_second_daemon_on_a_live_socket_refuses_and_the_first_keeps_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Sidecar(tmp_path / "a")
    try:
        sock = first.socket
        code = sidecar_main(["--socket", sock, "--state-dir", str(tmp_path / "b")])
        assert code == 2 and "is in use" in capsys.readouterr().err
        assert os.path.exists(sock)
        from dloader.v1 import node_pb2 as pb

        assert list(first.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == []
    finally:
        first.stop()


def test_a_live_socket_without_lock_is_not_taken_and_a_stale_one_is(tmp_path: Path) -> None:
    path = tmp_path / "run" / "s.sock"
    path.parent.mkdir()
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    with pytest.raises(ConfigError, match="a live daemon answers"):
        SocketClaim(path)
    live.close()  # now stale: nobody answers
    claim = SocketClaim(path)
    assert not path.exists()
    claim.release()


def test_a_regular_file_at_the_socket_path_is_never_removed(tmp_path: Path) -> None:
    path = tmp_path / "precious.txt"
    path.write_text("keep me")
    with pytest.raises(ConfigError, match="is not a socket"):
        SocketClaim(path)
    assert path.read_text() == "keep me"


def test_new_folders_and_files_are_private(tmp_path: Path) -> None:
    s = Sidecar(tmp_path)
    s.stop()
    assert mode(Path(s.state_dir)) == 0o700
    assert mode(Path(s.state_dir) / "sidecar.db") == 0o600
    assert mode(Path(s.socket).parent) == 0o750


def test_folders_of_others_or_writable_by_others_are_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ConfigError, match="writable by other users"):
        own_folder(shared, mode=0o700, what="state")
    if os.geteuid() == 0:  # only root can give a folder away
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4242, 4242)
        with pytest.raises(ConfigError, match="belongs to uid 4242"):
            own_folder(theirs, mode=0o700, what="state")
        # another user who creates the default socket folder first: the message says what to do
        with pytest.raises(ConfigError, match=r"someone else created it first\. Give --socket"):
            own_folder(theirs, mode=0o750, what="socket")
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    with pytest.raises(ConfigError, match="writable by its group"):
        own_folder(group, mode=0o700, what="state")
    own_folder(group, mode=0o770, what="socket")  # a folder made group-writable on purpose


def test_an_empty_state_file_is_refused_with_a_way_out(tmp_path: Path) -> None:
    (tmp_path / "sidecar.db").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"empty \(0 bytes\).*move it away"):
        SidecarStore(tmp_path / "sidecar.db")
    (tmp_path / "sidecar.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ConfigError, match=r"sidecar\.db is not usable"):
        SidecarStore(tmp_path / "sidecar.db")


@pytest.mark.parametrize("main", [sidecar_main, allocator_main])
def test_bad_paths_end_in_a_message_not_a_traceback(
    tmp_path: Path, main: object, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for argv in (
        ["--socket", str(tmp_path / "s.sock"), "--state-dir", str(a_file)],
        ["--socket", str(a_file / "s.sock"), "--state-dir", str(tmp_path / "st")],
        ["--socket", str(tmp_path / "s2.sock"), "--state-dir", str(tmp_path / "st2"),
         "--listen", "127.0.0.1:99999", "--token", "t"],
        ["--socket", str(tmp_path / "s3.sock"), "--state-dir", str(tmp_path / "st3"),
         "--listen", "127.0.0.1:0", "--token", "t", "--tls-cert", "/nope", "--tls-key", "/nope"],
    ):  # fmt: skip
        assert main(argv) == 2  # type: ignore[operator]
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip(), argv


def _overwrite_after_first_page(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[4096:] = bytes((i * 37) % 251 for i in range(len(data) - 4096))
    db.write_bytes(bytes(data))


def _drop_a_column(db: Path) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:  # the jobs table rebuilt without its "token" column
        cols = [r[1] for r in conn.execute("PRAGMA table_info(jobs)") if r[1] != "token"]
        conn.execute(f"CREATE TABLE jobs2 AS SELECT {', '.join(cols)} FROM jobs")
        conn.execute("DROP TABLE jobs")
        conn.execute("ALTER TABLE jobs2 RENAME TO jobs")


@pytest.mark.parametrize("corrupt", [_overwrite_after_first_page, _drop_a_column])
@pytest.mark.parametrize(
    ("main", "name"), [(sidecar_main, "sidecar"), (allocator_main, "allocator")]
)
def test_a_corrupt_state_file_ends_in_one_line_naming_it(
    tmp_path: Path, main: object, name: str, corrupt: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """S8: pages after the first overwritten, or a table missing a column, ended in a traceback;
    now in the daemons' one-line message naming the file."""
    from dloader.allocator.store import AllocatorStore

    state = tmp_path / "state"
    store = (SidecarStore if name == "sidecar" else AllocatorStore)(state / f"{name}.db")
    for i in range(200):  # more than one page of settings
        store.set_setting(f"k{i}", "v" * 100)
    store.close()
    corrupt(state / f"{name}.db")  # type: ignore[operator]
    argv = ["--socket", str(tmp_path / "d.sock"), "--state-dir", str(state)]
    assert main(argv) == 2  # type: ignore[operator]
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert f"{name}.db" in err and "not usable" in err, err
