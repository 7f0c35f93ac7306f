"""Loader telemetry: how long the trainer waits for data, and what the workers spend.

Recording is O(1) per batch (amortised) and :meth:`Telemetry.snapshot` is O(number of
workers): windowed sums are kept incrementally, so calling ``loader.stats()`` every step is cheap.

Each worker times its batches: wall time, CPU time and, on Linux, the time it waited runnable
for a CPU (:class:`RunDelayClock`, ``/proc/thread-self/schedstat``): what separates a CPU-bound
worker on a crowded node from one waiting for storage.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["LoaderStats", "RunDelayClock", "Telemetry", "WorkerStats"]

_EMA = 0.2  # weight of the newest batch in per-worker moving averages


class RunDelayClock:
    """Seconds this thread has waited, runnable, on a CPU run queue (the kernel's schedstat
    ``run_delay``; ~2 us a read). :meth:`read` is ``None`` where the kernel does not say (not
    Linux, schedstats off): the timings then carry no wait. Open it in the thread it times."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None
        if self.read() is None:
            self.close()

    def read(self) -> float | None:
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(frozen=True)
class WorkerStats:
    """One loader worker, as seen from the main process."""

    slot: int
    """Worker id (``get_worker_info().id`` inside the worker)."""
    pid: int | None
    """Process id, ``None`` until the worker has reported that it is up."""
    state: str
    """``"starting"``, ``"ready"`` (receives tasks) or ``"retiring"`` (finishing its last tasks)."""
    batches: int
    """Batches this worker has fetched."""
    in_flight: int
    """Tasks sent to this worker and not yet returned."""
    fetch_seconds: float
    """Moving average of the wall time to fetch and collate one batch, seconds."""
    cpu_seconds: float
    """Moving average of the worker's CPU time per batch, seconds."""
    cpu_total_seconds: float
    """CPU seconds this worker has spent fetching."""
    remote: bool = False
    """A remote worker (a Ray actor on another node: its ``pid`` is there)."""
    window_batches: int = 0
    """Batches it delivered in the recent window, its first batch ever not counted (the
    worker's start-up: imports, opening files, warming caches)."""
    window_fetch_seconds: float = 0.0
    """Mean wall time per batch over those batches (0: none)."""
    window_cpu_seconds: float = 0.0
    """Mean CPU time per batch over those batches."""
    window_run_delay_seconds: float | None = None
    """Mean time per batch it waited, runnable, for a CPU over those batches (Linux schedstat:
    contention from other processes); ``None``: unknown (no batch, or the kernel does not
    say)."""
    place: str = ""
    """A remote worker's place: ``""`` the pool (``RayWorkers.resources``), else the id of the
    node lending it a core (``DataLoader.resize_remote``)."""


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a loader's telemetry (``loader.stats()``). Times in seconds."""

    timestamp: float
    """``time.monotonic()`` when the snapshot was taken."""
    num_workers: int
    """Worker count the loader is set to (the target of the last resize)."""
    batch_size: int | None
    """Batch size of the next batch to be dispatched."""
    samples: int
    """Samples delivered to the trainer since the loader was created."""
    batches: int
    """Batches delivered since the loader was created."""
    epoch: int
    """Iterators started over this loader (0 before the first ``iter()``)."""
    wait_total_seconds: float
    """Total time the trainer spent inside ``next()`` waiting for data."""
    window_seconds: float
    """Length of the recent window the following fields cover (at most the configured window)."""
    samples_per_second: float
    """Delivered samples per second over the recent window."""
    wait_seconds: float
    """Time waited for data within the recent window."""
    step_seconds: float
    """Mean time between batch requests (the training step, data wait included), recent window."""
    idle_share: float
    """Share of wall time the trainer waited for data in the recent window (accelerator idle)."""
    queue_depth: int
    """Batches fetched and waiting in the main process to be delivered."""
    in_flight: int
    """Tasks dispatched to workers and not yet returned."""
    workers: tuple[WorkerStats, ...] = field(default_factory=tuple)
    """Per-worker figures (empty when loading in-process)."""
    tuner: str = ""
    """With ``num_workers="auto"``: what the tuner is doing and why (else empty)."""
    remote_workers: int = 0
    """Remote worker count the loader is set to (``RayWorkers``; 0: none)."""
    done: float | None = None
    """The share of its declared epochs done (``DataLoader(epochs=N)``; None: none declared)."""


@dataclass
class _WorkerRecord:
    pid: int | None = None
    state: str = "starting"
    batches: int = 0
    in_flight: int = 0
    fetch_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cpu_total_seconds: float = 0.0
    remote: bool = False
    place: str = ""
    # the recent window's batches after the first: (received, fetch, cpu, run delay or None)
    recent: deque[tuple[float, float, float, float | None]] = field(default_factory=deque)
    sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # fetch, cpu, delay
    unknown_delays: int = 0  # of ``recent``: batches without a run delay

    def add(self, at: float, fetch: float, cpu: float, delay: float | None) -> None:
        self.recent.append((at, fetch, cpu, delay))
        self.sums[0] += fetch
        self.sums[1] += cpu
        if delay is None:
            self.unknown_delays += 1
        else:
            self.sums[2] += delay

    def evict(self, horizon: float) -> None:
        while self.recent and self.recent[0][0] < horizon:
            _, fetch, cpu, delay = self.recent.popleft()
            self.sums[0] -= fetch
            self.sums[1] -= cpu
            if delay is None:
                self.unknown_delays -= 1
            else:
                self.sums[2] -= delay
        if not self.recent:  # no drift of the float sums over a long run
            self.sums[:] = [0.0, 0.0, 0.0]


class Telemetry:
    """Accumulates per-step timings; shared by a loader and the iterators it creates."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"stats_window_s={window_s!r} must be > 0")
        self.window_seconds = window_s
        self.samples = 0
        self.batches = 0
        self.wait_total_seconds = 0.0
        # (exit time, wait, samples) per delivered batch within the window, with running sums
        self._recent: deque[tuple[float, float, int]] = deque()
        self._recent_wait = 0.0
        self._recent_samples = 0
        self._last_exit: float | None = None
        self._first_in_window: float | None = None
        self.workers: dict[int, _WorkerRecord] = {}
        self.queue_depth = 0
        self.in_flight = 0
        self.lock = threading.Lock()

    def begin_epoch(self) -> None:
        """Forgets the time between epochs, so that evaluation pauses do not count as steps."""
        with self.lock:
            self._last_exit = None

    def record_batch(self, enter: float, exit_: float, samples: int) -> None:
        """Records one delivered batch: ``next()`` entered at ``enter``, returned at ``exit_``."""
        wait = exit_ - enter
        with self.lock:
            self.samples += samples
            self.batches += 1
            self.wait_total_seconds += wait
            if self._last_exit is None:
                # The first batch of a run of steps (of the loader, or after a pause between
                # epochs): the window starts when it arrived. Its wait (the workers starting)
                # and what came before are not the run's steady state, and a window from its
                # request would hold one wait more than steps: a job with few batches a window
                # would show almost no compute, so an accelerator limit far above its own.
                self._last_exit = self._first_in_window = exit_
                self._recent.clear()
                self._recent_wait, self._recent_samples = 0.0, 0
                return
            self._last_exit = exit_
            recent = self._recent
            recent.append((exit_, wait, samples))
            self._recent_wait += wait
            self._recent_samples += samples
            self._evict(exit_)

    def _evict(self, now: float) -> None:
        recent, horizon = self._recent, now - self.window_seconds
        while recent and recent[0][0] < horizon:
            t, wait, samples = recent.popleft()
            self._recent_wait -= wait
            self._recent_samples -= samples
            self._first_in_window = t

    def worker(self, slot: int) -> _WorkerRecord:
        """The record for worker ``slot``, created on first use."""
        rec = self.workers.get(slot)
        if rec is None:
            with self.lock:  # snapshot() iterates the dict under this lock
                rec = self.workers.setdefault(slot, _WorkerRecord())
        return rec

    def record_fetch(
        self,
        slot: int,
        fetch_seconds: float,
        cpu_seconds: float,
        run_delay_seconds: float | None = None,
    ) -> None:
        """Records one batch fetched by worker ``slot``: its wall and CPU time, and how long
        the worker waited for a CPU meanwhile (``None``: unknown)."""
        rec = self.worker(slot)
        if rec.batches == 0:
            rec.fetch_seconds, rec.cpu_seconds = fetch_seconds, cpu_seconds
        else:
            rec.fetch_seconds += _EMA * (fetch_seconds - rec.fetch_seconds)
            rec.cpu_seconds += _EMA * (cpu_seconds - rec.cpu_seconds)
            with self.lock:  # snapshot() reads the window's sums under this lock
                now = time.monotonic()
                rec.add(now, fetch_seconds, cpu_seconds, run_delay_seconds)
                rec.evict(now - self.window_seconds)
        rec.batches += 1
        rec.cpu_total_seconds += cpu_seconds

    def snapshot(
        self,
        *,
        num_workers: int,
        batch_size: int | None,
        epoch: int,
        tuner: str = "",
        remote_workers: int = 0,
        done: float | None = None,
    ) -> LoaderStats:
        """A consistent :class:`LoaderStats` at this moment."""
        now = time.monotonic()
        with self.lock:
            recent = self._recent
            if recent:
                start = self._first_in_window if self._first_in_window is not None else recent[0][0]
                window = max(recent[-1][0] - start, 1e-9)
                n = len(recent)
                samples_per_second = self._recent_samples / window
                step_seconds = window / n
                wait = max(self._recent_wait, 0.0)
                idle = min(wait / window, 1.0)
            else:
                window = samples_per_second = step_seconds = wait = idle = 0.0
            workers = tuple(
                self._worker_stats(slot, r, now) for slot, r in sorted(self.workers.items())
            )
            return LoaderStats(
                timestamp=now,
                num_workers=num_workers,
                batch_size=batch_size,
                samples=self.samples,
                batches=self.batches,
                epoch=epoch,
                wait_total_seconds=self.wait_total_seconds,
                window_seconds=window,
                samples_per_second=samples_per_second,
                wait_seconds=wait,
                step_seconds=step_seconds,
                idle_share=idle,
                queue_depth=self.queue_depth,
                in_flight=self.in_flight,
                workers=workers,
                tuner=tuner,
                remote_workers=remote_workers,
                done=done,
            )

    def _worker_stats(self, slot: int, r: _WorkerRecord, now: float) -> WorkerStats:
        r.evict(now - self.window_seconds)
        n = len(r.recent)
        fetch, cpu, delay = (v / n if n else 0.0 for v in r.sums)
        return WorkerStats(
            slot,
            r.pid,
            r.state,
            r.batches,
            r.in_flight,
            r.fetch_seconds,
            r.cpu_seconds,
            r.cpu_total_seconds,
            r.remote,
            window_batches=n,
            window_fetch_seconds=fetch,
            window_cpu_seconds=cpu,
            window_run_delay_seconds=delay if n and not r.unknown_delays else None,
            place=r.place,
        )
