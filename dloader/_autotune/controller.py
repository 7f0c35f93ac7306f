"""``num_workers="auto"``: a background thread that measures a loader and sets its worker count.

It needs no sidecar and nothing beyond the DataLoader's own install. Every
:data:`POLL_S` it reads ``loader.stats()``; once the last resize has taken effect (no worker
starting or retiring, the backlog of the old count drained) it measures a window: at least
:data:`SEARCH_WINDOW_S` (:data:`HOLD_WINDOW_S` once settled) and :data:`MIN_BATCHES` batches.
With the window it reads what the process may use (:mod:`dloader._shared.host`: CPUs by affinity and
cgroup quota, the CPU time the machine left idle on them, the cgroup's and the machine's free
memory, each worker's private memory) and what this user's other tuned loaders on the machine
published (:mod:`dloader._autotune.peers`), publishes its own, and asks
:class:`dloader._autotune.tuner.WorkerTuner` what to do.

A pause in training (evaluation, checkpointing: no batch for :data:`PAUSE_S`) discards the
window being measured. A user's own ``loader.resize()`` stops the tuner: the user decides.
"""

from __future__ import annotations

import logging
import os
import threading

from dloader._autotune.peers import PeerBoard
from dloader._autotune.tuner import Peer, Room, Window, WorkerTuner
from dloader._engine.control import LoaderControls
from dloader._engine.telemetry import LoaderStats
from dloader._shared import host

__all__ = ["AutoTuner", "start_count"]

log = logging.getLogger("dloader")

POLL_S = 0.1
SEARCH_WINDOW_S = 2.0
HOLD_WINDOW_S = 5.0
MIN_BATCHES = 8
MAX_WINDOW_S = 30.0
SETTLE_S = 0.3
PAUSE_S = 2.0
#: Memory kept free beyond every limit, bytes.
MEMORY_MARGIN = 256 * 2**20


def usable_cpus() -> float:
    """CPUs this process may use: its affinity, within its cgroup's CPU quota."""
    cpus = float(len(os.sched_getaffinity(0)))
    quota = host.limits().cpu_quota
    return min(cpus, quota) if quota else cpus


def start_count(minimum: int, maximum: int) -> int:
    """Where the search starts: as many workers as usable CPUs, at most 4, within bounds."""
    return min(max(min(4, round(usable_cpus())), minimum, 1), maximum)


class _Mark:
    """The counters a window is measured between."""

    def __init__(self, s: LoaderStats, busy: float | None, own: dict[int | str, float]) -> None:
        # Batches fetched and not yet delivered count as produced: a window that starts with
        # a full queue would otherwise credit this count with the previous count's work.
        self.samples = s.samples + s.queue_depth * (s.batch_size or 1)
        self.time, self.batches = s.timestamp, s.batches
        self.wait = s.wait_total_seconds
        self.busy, self.own = busy, own


class AutoTuner:
    """Tunes one loader's worker count in a daemon thread (see the module's docstring)."""

    def __init__(
        self,
        controls: LoaderControls,
        *,
        start: int,
        minimum: int,
        maximum: int,
        peers: bool = True,
    ) -> None:
        self._controls = controls
        self.tuner = WorkerTuner(start=start, minimum=minimum, maximum=maximum)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dloader-autotune", daemon=True)
        self._clock = host.CpuClock()
        self._peers = peers
        self.stopped_because: str | None = None
        self.search_s: float | None = None
        """Seconds from the tuner's start to the end of its first search (None: searching)."""
        # what poll() carries from one look at the loader to the next (times: the stats' clock)
        self._window_mark: _Mark | None = None
        self._settled_at: float | None = None
        self._began: float | None = None
        self._last_change = 0.0
        self._last_batches = -1
        self._bound = maximum
        self._up_to: int | None = None
        """A ceiling set from outside (:meth:`limit`), applied by the tuner's own thread."""

    @property
    def summary(self) -> str:
        """What the tuner is doing and why, for ``loader.stats().tuner``."""
        if self.stopped_because:
            return f"auto: stopped ({self.stopped_because})"
        return f"auto: {self.tuner.reason}"

    def start(self) -> None:
        """Starts the thread (idempotent)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def stop(self, why: str) -> None:
        """Stops tuning; the loader keeps its current worker count."""
        if not self._stop.is_set():
            self.stopped_because = why
            self._stop.set()  # the thread takes its file off the board as it ends
            log.info("dloader: num_workers='auto' stopped: %s", why)

    def limit(self, up_to: int) -> None:
        """Searches within ``[minimum, up_to]`` from now on (the sidecar's guided policy sets
        it): the tuner's thread applies it at its next look, moving down at once if the count
        is above it."""
        self._up_to = up_to

    def _apply_limit(self) -> int | None:
        up_to, self._up_to = self._up_to, None
        if up_to is None:
            return None
        return self.tuner.limit(min(up_to, self._bound), "the sidecar's")

    # ------------------------------------------------------------------ measuring

    def _own_cpu(self, s: LoaderStats) -> dict[int | str, float]:
        pids: list[int | str] = ["self", *(w.pid for w in s.workers if w.pid)]
        out: dict[int | str, float] = {}
        for pid in pids:
            used = host.cpu_seconds(pid)
            if used is not None:
                out[pid] = used
        return out

    def _mark(self, s: LoaderStats) -> _Mark:
        return _Mark(s, self._clock.busy_seconds(), self._own_cpu(s))

    @staticmethod
    def _settled(s: LoaderStats, prefetch: int) -> bool:
        if any(w.state != "ready" for w in s.workers) or len(s.workers) != s.num_workers:
            return False
        return s.in_flight + s.queue_depth <= prefetch * max(s.num_workers, 1)

    @staticmethod
    def _worker_cpus(a: _Mark, b: _Mark) -> float:
        """CPUs' worth of time the workers used between the two marks."""
        span = b.time - a.time
        used = sum(b.own[p] - a.own[p] for p in b.own if p != "self" and p in a.own)
        return max(used, 0.0) / span if span > 0 else 0.0

    def _room(self, a: _Mark, b: _Mark, s: LoaderStats, ceiling: int, board: PeerBoard) -> Room:
        span = b.time - a.time
        limits = host.limits()
        idle = None
        if a.busy is not None and b.busy is not None and span > 0:
            idle = len(self._clock.cpus) - (b.busy - a.busy) / span
            if limits.cpu_quota:
                own = sum(b.own[p] - a.own[p] for p in b.own if p in a.own) / span
                idle = min(idle, limits.cpu_quota - own)
            idle = max(idle, 0.0)
        rooms = [r for r in (limits.memory_room, host.memory_available()) if r is not None]
        memory = min(rooms) - MEMORY_MARGIN if rooms else None
        private = [host.private_bytes(w.pid) for w in s.workers if w.pid]
        measured = [p for p in private if p]
        return Room(
            ceiling=ceiling,
            idle_cpus=idle,
            memory=memory,
            worker_memory=max(measured) if measured else None,
            peers=board.peers(),
        )

    @staticmethod
    def _window(a: _Mark, b: _Mark, s: LoaderStats) -> Window:
        ready = [w for w in s.workers if w.batches]
        return Window(
            num_workers=s.num_workers,
            seconds=b.time - a.time,
            samples=b.samples - a.samples,
            batches=b.batches - a.batches,
            wait_seconds=b.wait - a.wait,
            fetch_seconds=sum(w.fetch_seconds for w in ready) / len(ready) if ready else 0.0,
            worker_cpu_seconds=sum(w.cpu_seconds for w in ready) / len(ready) if ready else 0.0,
        )

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        board = PeerBoard(enabled=self._peers)
        try:
            while not self._stop.wait(POLL_S) and self.poll(board):
                pass
        finally:
            board.close()

    def poll(self, board: PeerBoard) -> bool:
        """One look at the loader (the thread's, every :data:`POLL_S`): measures the window
        under way and, once it is long enough, asks the tuner and applies its count. Every
        time it reads is the loader's stats' (``LoaderStats.timestamp``), so a test drives it
        with stats of its own clock. False once the tuner is done (the loader is gone, or the
        user's ``resize()`` stopped it)."""
        s, limits = self._controls.stats(), self._controls.limits()
        if s is None or limits is None:
            return False  # the loader is gone
        now = s.timestamp
        lower = self._apply_limit()
        if lower is not None:
            self._window_mark = self._settled_at = None
            log.info("dloader: num_workers='auto': %s", self.tuner.reason)
            return self._controls.resize(lower, unless=self._stop)
        if self._began is None:
            self._began = self._last_change = now
        if s.batches != self._last_batches:
            self._last_batches, self._last_change = s.batches, now
        elif now - self._last_change > PAUSE_S:
            if self._window_mark is not None:  # training paused: this window would lie
                board.publish(Peer(0.0, 0.0, False))
            self._window_mark = self._settled_at = None
            return True
        if s.num_workers != self.tuner.num_workers or not self._settled(s, limits.prefetch_factor):
            self._window_mark = self._settled_at = None
            return True
        if self._settled_at is None:
            self._settled_at = now
        if now - self._settled_at < SETTLE_S:
            return True
        mark = self._window_mark
        if mark is None:
            self._window_mark = self._mark(s)
            return True
        length = SEARCH_WINDOW_S if self.tuner.phase == "search" else HOLD_WINDOW_S
        enough = s.batches - mark.batches >= MIN_BATCHES or now - mark.time > MAX_WINDOW_S
        if now - mark.time < length or not enough:
            return True
        end = self._mark(s)
        window = self._window(mark, end, s)
        board.publish(Peer.of(window, self._worker_cpus(mark, end), self.tuner))
        room = self._room(mark, end, s, limits.worker_bound, board)
        phase = self.tuner.phase
        decision = self.tuner.observe(window, room)
        if self.search_s is None and self.tuner.phase == "hold":
            self.search_s = now - self._began
        self._window_mark = end
        if decision is not None:
            self._window_mark = self._settled_at = None
            if not self._controls.resize(decision, unless=self._stop):
                return False  # stopped by the user's resize(), or the loader is gone
        if decision is not None or self.tuner.phase != phase:
            log.info("dloader: num_workers='auto': %s", self.tuner.reason)
        return True
