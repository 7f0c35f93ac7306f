"""``num_workers="auto"`` on a real loader: it converges with real worker processes without
losing, repeating or reordering a sample, follows the CPU affinity it is given, stands aside for
a sidecar or a user's resize(), and refuses what it cannot do, clearly."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dloader
from dloader._autotune import peers
from dloader._autotune.controller import start_count
from dloader._autotune.tuner import Peer
from dloader._dataloader import auto_ceiling
from dloader.apps.testbed import EmulatedDataset
from dloader.errors import ConfigError
from tests.loader import datasets as D


def _train(loader: dloader.DataLoader[object], seconds: float, step_s: float) -> list[int]:
    seen: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for batch in loader:
            seen += batch.tolist()
            time.sleep(step_s)
            if time.monotonic() > end:
                break
    return seen


@pytest.mark.integration
def test_auto_resizes_a_real_loader_without_losing_a_sample(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The tuner's thread drives a real loader's live resizes: every sample arrives once, in
    order. Where it converges, and how fast, is tested on a simulated loader with a clock of its
    own (test_controller.py): here it only has to move at all, which one window does on any
    machine."""
    # I/O-bound: a worker fetches a batch of 8 in ~32 ms; the trainer steps in 4 ms, so it
    # needs about 8 workers.
    loader = dloader.DataLoader(
        EmulatedDataset(400_000, io_ms=4.0), batch_size=8, num_workers="auto"
    )
    start = loader.num_workers
    assert start == start_count(1, auto_ceiling())
    with caplog.at_level(logging.INFO, logger="dloader"):
        seen = _train(loader, 8.0, 0.004)
    assert seen == list(range(len(seen)))  # in order, none lost or repeated
    tuner = loader.autotuner
    assert tuner is not None
    counts = {n for n, _ in tuner.tuner.history}
    assert len(counts) >= 2 and max(counts) > start, tuner.tuner.history  # it measured, and grew
    assert loader.stats().tuner.startswith("auto: ")
    assert any("num_workers='auto': " in r.getMessage() for r in caplog.records)


_AFFINITY_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, os.getcwd())
    cpus = json.loads(sys.argv[1])
    if cpus:
        os.sched_setaffinity(0, cpus)
    import dloader
    from dloader.apps.testbed import EmulatedDataset
    # CPU-bound: a worker burns 16 ms per batch; the trainer asks for one every 2 ms.
    loader = dloader.DataLoader(EmulatedDataset(10**6, cpu_ms=2.0), batch_size=8,
                                num_workers="auto")
    counts, end = [], time.monotonic() + 9
    for batch in loader:
        counts.append(loader.num_workers)
        time.sleep(0.002)
        if time.monotonic() > end:
            break
    steps = [b - a for a, b in zip(counts, counts[1:]) if b > a]
    print(json.dumps({"first": counts[0], "steps": steps, "tuner": loader.stats().tuner}))
    """
)


@pytest.mark.integration
def test_a_cpu_bound_job_stays_within_its_cpu_affinity() -> None:
    def run(cpus: list[int]) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-c", _AFFINITY_JOB, json.dumps(cpus)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(out.stdout.splitlines()[-1])

    # One CPU: the search starts at one worker, and a CPU-bound worker is added only into CPU
    # time nobody uses, or as the one more worker a waiting trainer may try (kept only if it
    # pays): one at a time, never the doubling an I/O-bound job gets (the rules themselves:
    # test_tuner.py, on synthetic windows). How far it climbs in the 9 s depends on the
    # machine's load (with another process on the CPU, one more worker is a larger share of
    # it, and may pay): not asserted.
    pinned = run([0])
    assert pinned["first"] == 1 and set(pinned["steps"]) <= {1}, pinned


@pytest.mark.integration
def test_a_tuned_loader_is_on_the_peer_board_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It publishes its record with each window it measures, sees a peer's, and takes its own
    off the board when it stops; with ``DLOADER_AUTO_PEERS=0`` it works alone."""
    monkeypatch.setattr(peers, "default_root", lambda: tmp_path)
    neighbour = peers.PeerBoard(tmp_path)
    neighbour.publish(Peer(worth=0.5, cpus=1.0, starved=False))
    loader = dloader.DataLoader(
        EmulatedDataset(100_000, io_ms=1.0, cpu_ms=0.5), batch_size=8, num_workers="auto"
    )
    _train(loader, 5.0, 0.004)
    # Records only: the tuner's thread may be between writing its next record and renaming it
    # into place (a ``.tmp`` file that readers skip, as the board itself does).
    mine = [p for p in neighbour.dir.glob(f"*{peers._SUFFIX}") if p != neighbour.path]
    assert len(mine) == 1 and mine[0].name.startswith(f"{os.getpid()}-"), mine
    record = json.loads(mine[0].read_text())
    assert record["pid"] == os.getpid() and record["cpus"] >= 0
    assert len(neighbour.peers()) == 1
    assert loader.autotuner is not None
    loader.autotuner.stop("test over")
    deadline = time.monotonic() + 5
    while mine[0].exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mine[0].exists()
    del loader

    monkeypatch.setenv("DLOADER_AUTO_PEERS", "0")
    alone = dloader.DataLoader(
        EmulatedDataset(100_000, io_ms=1.0), batch_size=8, num_workers="auto"
    )
    _train(alone, 3.0, 0.004)
    assert [p for p in neighbour.dir.iterdir() if p != neighbour.path] == []
    monkeypatch.setenv("DLOADER_AUTO_PEERS", "yes")
    with pytest.raises(ConfigError, match="DLOADER_AUTO_PEERS='yes'"):
        dloader.DataLoader(D.Range(10), num_workers="auto")


@pytest.mark.integration  # the sidecar agent starts its helper with the loader
def test_a_sidecar_decides_instead() -> None:
    loader = dloader.DataLoader(
        D.Range(10), batch_size=2, num_workers="auto", sidecar="unix:///nonexistent.sock"
    )
    assert loader.autotuner is None and loader.num_workers >= 1
    assert loader.stats().tuner == ""


@pytest.mark.integration  # the sidecar agent starts its helper with the loader
def test_the_sidecars_guided_policy_starts_the_tuner_within_a_ceiling_and_stops_it() -> None:
    from dloader._dataloader import _Controls

    loader = dloader.DataLoader(
        D.Range(10), batch_size=2, num_workers=2, sidecar="unix:///nonexistent.sock"
    )
    controls = _Controls(loader)
    assert controls.tune(3) and loader.autotuner is not None  # a fixed count: tuned now
    tuner = loader.autotuner
    deadline = time.monotonic() + 30  # the tuner's thread applies the ceiling at its next look
    while tuner.tuner.maximum != 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tuner.tuner.maximum == 3 and loader.stats().tuner.startswith("auto: ")
    assert not controls.tune(None) and loader.autotuner is None  # the sidecar sets counts again
    assert tuner.stopped_because == "the sidecar sets the count"
    loader.resize(2)
    assert controls.tune(4) and loader.autotuner is not None  # guided again: a new tuner
    loader.resize(2)  # the user's count: a tuner the user stopped is not restarted
    assert not controls.tune(4)
    iterable = dloader.DataLoader(D.Sharded(10), batch_size=2, num_workers=2)
    assert not _Controls(iterable).tune(4) and iterable.autotuner is None


def test_a_users_resize_stops_the_tuner() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2, num_workers="auto")
    assert loader.autotuner is not None
    loader.resize(3)
    assert loader.stats().tuner == "auto: stopped (resize(3) called)"


@pytest.mark.integration
def test_lightning_re_instantiation_keeps_auto_and_its_bounds() -> None:
    """Lightning rebuilds a train loader with its DistributedSampler from the arguments it
    captured: the rebuilt loader tunes itself again, within the same ``max_workers``."""
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.data import _replace_dunder_methods, _update_dataloader
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data import DistributedSampler

    with _replace_dunder_methods(TorchLoader, "dataset"):
        loader = dloader.DataLoader(D.Range(40), batch_size=4, num_workers="auto", max_workers=3)
    sampler = DistributedSampler(D.Range(40), num_replicas=2, rank=1, shuffle=False)
    rebuilt = _update_dataloader(loader, sampler)
    assert isinstance(rebuilt, dloader.DataLoader) and rebuilt.sampler is sampler
    assert rebuilt.autotuner is not None and rebuilt.worker_bound() == 3
    assert [int(x) for b in rebuilt for x in b] == list(range(1, 40, 2))
    assert rebuilt.stats().tuner.startswith("auto: ")


def test_bounds_and_bad_values() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2, num_workers="auto", max_workers=1)
    assert loader.num_workers == 1 and loader.worker_bound() == 1
    loader = dloader.DataLoader(D.Range(10), batch_size=2, num_workers="auto", min_workers=3)
    assert loader.num_workers >= 3
    with pytest.raises(ValueError, match=r"num_workers='many' must be an int >= 0 or 'auto'"):
        dloader.DataLoader(D.Range(10), num_workers="many")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_workers=0"):
        dloader.DataLoader(D.Range(10), num_workers="auto", max_workers=0)


def test_an_iterable_dataset_keeps_a_fixed_count_and_says_so() -> None:
    with pytest.warns(UserWarning, match="num_workers='auto' needs a map-style dataset"):
        loader = dloader.DataLoader(D.Sharded(10), batch_size=2, num_workers="auto")
    assert loader.autotuner is None and loader.num_workers >= 1
