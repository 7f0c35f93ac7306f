"""Telemetry: wait, step, idle share and per-worker figures reflect what happened."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import dloader
from dloader._engine.telemetry import RunDelayClock
from dloader.apps.testbed import PROFILES, EmulatedDataset, run_job
from tests.loader import datasets as D


def test_stats_before_iteration_are_zero() -> None:
    s = dloader.DataLoader(D.Range(10), batch_size=2).stats()
    assert (s.samples, s.batches, s.epoch, s.samples_per_second, s.idle_share) == (
        0,
        0,
        0,
        0.0,
        0.0,
    )
    assert s.batch_size == 2 and s.num_workers == 0 and s.workers == ()


def test_data_bound_loader_shows_high_idle_share() -> None:
    # 5 ms per sample, 4 per batch, a 1 ms "step": the trainer mostly waits.
    loader = dloader.DataLoader(D.Range(60, sleep_s=0.005), batch_size=4)
    for _ in loader:
        time.sleep(0.001)
    s = loader.stats()
    assert s.samples == 60 and s.batches == 15 and s.epoch == 1
    assert s.idle_share > 0.7
    assert s.wait_total_seconds == pytest.approx(60 * 0.005, rel=0.5)
    # the window starts when the first batch arrived: it holds the 14 steps after it
    assert s.step_seconds == pytest.approx(s.window_seconds / 14, rel=0.01)


def test_a_window_of_few_steps_shows_their_whole_compute() -> None:
    """A starved job delivers few batches a window: its compute per step (``step * (1 -
    idle)``, what the sidecar's model takes its accelerator limit from) must not lose a step's
    compute to the first batch's wait (3 steps of 10 ms computed showed 6.7 ms each). Sleeps
    only run long on a slow machine, so the bound holds on any."""
    loader = dloader.DataLoader(D.Range(40, sleep_s=0.02), batch_size=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
        time.sleep(0.01)
    next(it)
    s = loader.stats()
    assert s.step_seconds * (1 - s.idle_share) >= 0.0095


@pytest.mark.integration
def test_compute_bound_loader_shows_low_idle_share() -> None:
    loader = dloader.DataLoader(D.Range(40), batch_size=4, num_workers=2)
    for _ in loader:
        time.sleep(0.02)
    s = loader.stats()
    assert s.idle_share < 0.2
    assert s.samples_per_second == pytest.approx(4 / 0.02, rel=0.35)


def test_window_forgets_old_steps() -> None:
    loader = dloader.DataLoader(D.Range(400), batch_size=1, stats_window_s=0.2)
    it = iter(loader)
    start = time.monotonic()
    for _ in range(5):
        next(it)
        time.sleep(0.1)
    s = loader.stats()
    elapsed = time.monotonic() - start
    # the window (0.2 s) keeps the last step or two, never all five, however slow the machine
    assert 0 < s.window_seconds < elapsed - 0.09
    assert s.batches == 5


@pytest.mark.integration
def test_per_worker_stats() -> None:
    loader = dloader.DataLoader(EmulatedDataset(64, io_ms=2, cpu_ms=1), batch_size=4, num_workers=2)
    it = iter(loader)
    for _ in range(10):
        next(it)
    workers = loader.stats().workers
    assert [w.slot for w in workers] == [0, 1]
    for w in workers:
        assert w.pid is not None and w.state == "ready" and w.batches >= 4
        assert w.fetch_seconds >= 4 * 0.003 * 0.9  # 4 samples x (2 ms sleep + 1 ms CPU)
        assert 4 * 0.001 * 0.8 <= w.cpu_seconds < w.fetch_seconds
    del it


class _MarkingCollate:
    """Collates, then leaves a file named by the batch's first sample: the batch is made, and
    its worker sends it next."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, samples: list[int]) -> Any:
        batch = torch.utils.data.default_collate(samples)
        (self.folder / str(int(batch[0]))).touch()
        return batch


@pytest.mark.integration
def test_batches_ahead_of_their_turn_count_in_their_workers_timings(tmp_path: Path) -> None:
    """Workers fill the prefetch ahead of a slow trainer: each worker's second batch (its first
    timed one) is made at once and then waits its turn. Its timing counts when it arrives, not
    when its turn comes (an 8-worker job at 3 batches a second reported no timed batch for its
    first 2.3 s, and the sidecar placed it that much later). The waits are for events (the
    batches made), with a deadline only against a hang, and half a second more for a
    one-sample batch to be sent (and for the loader's next look, due 0.1 s after its last)."""
    workers, prefetch = 3, 2
    loader = dloader.DataLoader(
        D.Range(40),
        batch_size=1,
        num_workers=workers,
        prefetch_factor=prefetch,
        collate_fn=_MarkingCollate(tmp_path),
    )
    it = iter(loader)
    next(it)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.iterdir())) < workers * prefetch:
        assert time.monotonic() < deadline, "the workers made no prefetch in 60 s"
        time.sleep(0.05)
    time.sleep(0.5)
    assert int(next(it)[0]) == 1  # worker 1's first batch: in order, as ever
    for w in loader.stats().workers:
        assert w.batches >= prefetch and w.window_batches >= 1, w
    assert list(map(int, it)) == list(range(2, 40))
    del it


@pytest.mark.integration
def test_testbed_run_job_measures_the_emulated_accelerator() -> None:
    profile = PROFILES["gpu_bound"]
    loader = dloader.DataLoader(
        EmulatedDataset.from_profile(profile, 10_000), batch_size=8, num_workers=1
    )
    r = run_job(loader, profile, max_steps=8)
    assert r.steps == 8 and r.samples == 64
    # Step time is 40 + 5*8 = 80 ms: throughput cannot exceed the accelerator limit.
    assert r.samples_per_second <= profile.limit(8) * 1.05


@pytest.mark.integration
@pytest.mark.skipif(RunDelayClock().read() is None, reason="the kernel gives no schedstat")
@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")  # 1 CPU
def test_worker_timings_leave_out_the_start_up_batch_and_count_waits_for_a_cpu() -> None:
    """Two CPU-bound workers on one CPU: each waits, runnable, for about half its wall time,
    and each batch's run-queue wait, timed by the worker, accounts for its wall time beyond its
    CPU (there is no I/O); the windowed means leave out each worker's first batch (0.5 s of
    start-up): what a sidecar reads from one window is the steady state."""
    loader = dloader.DataLoader(
        D.SpinAfterSlowStart(400, cpu_s=0.004, start_s=0.5), batch_size=4, num_workers=2,
        stats_window_s=600,
    )  # fmt: skip
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the workers fork with it
    try:
        it = iter(loader)
        for _ in range(30):
            next(it)
        workers = loader.stats().workers
        del it
    finally:
        os.sched_setaffinity(0, cpus)
    for w in workers:
        assert w.window_batches == w.batches - 1 >= 3
        assert w.window_fetch_seconds < 0.25  # no 0.5 s start-up in the mean
        assert w.window_cpu_seconds >= 4 * 0.004 * 0.9
        delay = w.window_run_delay_seconds
        assert delay is not None and delay > 0.25 * w.window_fetch_seconds
        beyond_cpu = w.window_fetch_seconds - w.window_cpu_seconds
        assert delay == pytest.approx(beyond_cpu, rel=0.25)


@pytest.mark.integration
@pytest.mark.skipif(RunDelayClock().read() is None, reason="the kernel gives no schedstat")
def test_a_sleeping_worker_waits_for_no_cpu() -> None:
    loader = dloader.DataLoader(D.Range(64, sleep_s=0.01), batch_size=4, num_workers=1)
    it = iter(loader)
    for _ in range(12):
        next(it)
    (w,) = loader.stats().workers
    del it
    assert w.window_run_delay_seconds is not None
    assert w.window_run_delay_seconds < 0.2 * w.window_fetch_seconds


def test_the_share_of_the_declared_epochs_done() -> None:
    """``epochs=N``: ``done`` counts the epochs before this one and this one's batches over its
    length, also across a break, and for an iterable dataset (whose epoch counts
    when it ends); without it, None; a bad count is refused."""
    loader = dloader.DataLoader(D.Range(100), batch_size=10, epochs=4)
    assert loader.stats().done == 0.0
    for i, _ in enumerate(loader):
        if i == 4:  # five batches of ten in the first of four epochs
            assert loader.stats().done == pytest.approx(0.125)
    assert loader.stats().done == pytest.approx(0.25)
    it = iter(loader)
    next(it), next(it)
    del it  # a break two batches into the second epoch
    assert loader.stats().done == pytest.approx(0.3)
    for _ in range(3):
        for _ in loader:
            pass
    assert loader.stats().done == 1.0  # never more, even past the declared epochs
    stream = dloader.DataLoader(D.Sharded(30), batch_size=10, epochs=2)
    for i, _ in enumerate(stream):
        assert stream.stats().done == 0.0, i
    assert stream.stats().done == 0.5
    assert dloader.DataLoader(D.Range(10)).stats().done is None
    with pytest.raises(ValueError, match="epochs=0 must be >= 1"):
        dloader.DataLoader(D.Range(10), epochs=0)
