"""The decisions of ``num_workers="auto"``: which worker count to measure next, and when to hold.

Pure logic (no clock, no I/O): :mod:`dloader._autotune.controller` measures windows and feeds them
here.

The search is measured, not modelled: every candidate count runs for a window, and the count
kept is the smallest one whose measured throughput is within :data:`TOLERANCE` of the best
measured. A model only says where to look first:

1. **Climb.** While the trainer waits for data (idle share at least :data:`IDLE_LOW`) and the
   last step up paid off, jump to the count that would feed it if workers scaled linearly: a
   worker's time per batch over the trainer's own time per step, plus 10% (at most 8x at once;
   ``n / (1 - idle)`` when the workers' times are unknown).
2. **Refine.** Around the best count, try ``best - step`` and ``best + step`` from a step of
   15% of it, halving the step down to 1. Counts above the best only while the trainer still
   waits there; counts below it not when, at the best, the trainer waited while CPU time was
   left idle (:data:`SPARE_CPU`): the workers then produced all the trainer got without
   contending for CPU, so fewer of them would produce less, and measuring that costs a window
   at a lower rate.
3. **Hold**, and check: the first window at the count held must confirm its measurement (else
   the measurements are averaged and the best chosen again). Then watch: when the trainer's
   compute per step, the workers' fetch time per sample, or the idle share drift from what they
   were when the search ended, two windows in a row, search again from the current count.
   After :data:`PROBE_EVERY` windows in a row in which the trainer waited, if the room allows,
   try one more worker for a window; if it pays off, search again from there.

Growth is bounded by what the process may use: never more workers than the memory room allows
at the largest private memory a worker has been measured at, and a CPU-hungry worker is only
added into CPU time that nobody used in the window (so two tuned loaders on one machine, each
seeing the other's use, do not outbid each other): as many as that time holds at the workers'
CPU share, rounded. While the trainer waits, one more is always measured: into at least
:data:`SPARE_CPU` left idle, or, with no peer on the board, into no idle CPU at all (CPU-bound
workers also leave gaps in the in-order stream that one more fills: the text pipeline here
delivered 13% more at 3 workers than at 2 on 2 CPUs, with no CPU left idle at 2). A count is
kept only if it measured better. When the memory room goes below zero, the tuner sheds
workers, whatever the phase.

**Peers.** The "auto" loaders of one user on one machine publish what a CPU-second is worth to
each (:attr:`Window.worth`: seconds of the trainer's compute fed per second of a worker's CPU)
and whether their trainer waits for CPU-bound workers (:class:`Peer`). A loader outranked by a
waiting peer (whose worth is :data:`PEER_MARGIN` above its own) while no CPU is idle, both
holding their counts (so that what the machine's trainers do next is the yield's doing, not a
search's), yields: it halves its workers, one yield after another, until CPU is left idle or
the peer no longer waits (or it is at its minimum, where it yields in place: its worker's CPU
is the peer's to take); the peer grows into the idle CPU. The node's CPU then goes where it
feeds the most accelerator time, as the sidecar's policy would place it. A yield is a trial:
over the :data:`YIELD_JUDGE` windows after it (the first left out), the machine's trainers (this
one's and the peers' :attr:`Peer.busy`) must be busier than over the windows before it, else
the loader takes its workers back. No loader takes a peer's CPU unasked: CPU changes hands only
by a yield that paid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["IDLE_LOW", "TOLERANCE", "Peer", "Room", "Window", "WorkerTuner"]

#: Candidates within this share of the best measured throughput count as equal (the fewest
#: workers among them wins).
TOLERANCE = 0.015
#: A step up must gain this share to count as paying off: above the noise of a two-second
#: window on a shared machine.
GAIN = 0.03
#: The count held is measured again; below this share of the best it is looked at once more.
CONFIRM = 0.03
#: Held windows in a row in which the trainer waited before a probe of one more worker (when
#: there is room): what changed around the job (a neighbour left, a quota grew) is found so.
PROBE_EVERY = 6
#: Below this idle share the trainer is not waiting for data: more workers cannot help it.
IDLE_LOW = 0.03
#: A relative change of the trainer's step or the workers' cost that starts a new search.
DRIFT = 0.25
#: Idle share above the settled one that starts a new search.
IDLE_DRIFT = 0.10
#: A worker using less than this share of a CPU while fetching is not CPU-bound.
CPU_LIGHT = 0.05
#: CPUs' worth of time left idle in a window above which the workers were not short of CPU.
SPARE_CPU = 0.25
#: A worker using at least this share of a CPU while fetching is CPU-bound.
CPU_BOUND = 0.5
#: A peer's CPU-second must be worth this share less than this loader's for this loader to take
#: it: above the noise of the two measurements, so that near-equal loaders never trade CPU.
PEER_MARGIN = 0.2
#: A change of the CPU that outranked peers' workers use (CPUs) after which the measurements so
#: far were taken under other neighbours: the search starts again from the current count.
PEER_SHIFT = 0.25
#: Windows after a yield at which it is judged: over them, the first left out (the peer is
#: still growing into the CPU), the trainers' busy time on the machine (its own and its peers')
#: must have risen by :data:`GAIN` over the (up to two) windows before the yield, else the
#: loader takes its workers back. Means of two windows: one window's busy time on a shared
#: machine moves by about as much as a yield gains.
YIELD_JUDGE = 3
#: Windows during which a loader whose yield did not pay does not yield again; doubled after
#: each such yield, up to :data:`YIELD_BAN_MAX`.
YIELD_BAN = 6
YIELD_BAN_MAX = 48


@dataclass(frozen=True)
class Window:
    """What one measurement window saw, at a fixed worker count."""

    num_workers: int
    seconds: float
    samples: int
    batches: int
    wait_seconds: float
    """Time the trainer spent waiting for data."""
    fetch_seconds: float = 0.0
    """Mean wall time a worker took per batch (0: unknown)."""
    worker_cpu_seconds: float = 0.0
    """Mean CPU time a worker used per batch."""

    @property
    def rate(self) -> float:
        """Delivered samples per second."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def idle(self) -> float:
        """Share of the window the trainer waited for data."""
        return min(self.wait_seconds / self.seconds, 1.0) if self.seconds > 0 else 0.0

    @property
    def compute_seconds(self) -> float:
        """The trainer's own time per step (the step minus its data wait)."""
        return max(self.seconds - self.wait_seconds, 0.0) / self.batches if self.batches else 0.0

    @property
    def fetch_per_sample(self) -> float:
        """A worker's wall time per sample (0: unknown)."""
        if not self.batches or not self.samples:
            return 0.0
        return self.fetch_seconds * self.batches / self.samples

    @property
    def cpu_share(self) -> float:
        """Share of a CPU a worker uses while it fetches (0: unknown)."""
        return min(self.worker_cpu_seconds / self.fetch_seconds, 1.0) if self.fetch_seconds else 0.0

    @property
    def worth(self) -> float:
        """Seconds of the trainer's own compute one second of a worker's CPU feeds (0: unknown,
        or the workers are not CPU-bound, so CPU is not what they lack)."""
        if self.cpu_share < CPU_LIGHT or not self.worker_cpu_seconds:
            return 0.0
        return self.compute_seconds / self.worker_cpu_seconds


@dataclass(frozen=True)
class Peer:
    """Another "auto" loader of the same user on this machine, as of its last window."""

    worth: float
    """Its :attr:`Window.worth` (0: unknown or not CPU-bound)."""
    cpus: float
    """CPUs' worth of time its workers used."""
    starved: bool
    """Its trainer waited for data while its workers used CPU."""
    busy: float = 0.0
    """Share of its window its trainer computed (did not wait for data)."""
    yielding: bool = False
    """It gave up workers to an outranking peer (:attr:`WorkerTuner.yielding`): the CPU its
    workers still use is the outranking peer's to take."""
    settled: bool = False
    """Its tuner held its count over the window (:attr:`WorkerTuner.settled`): a change of its
    trainer's busy time from here on is not its own search's doing."""

    @classmethod
    def of(cls, w: Window, cpus: float, tuner: WorkerTuner | None = None) -> Peer:
        """What a loader publishes after measuring ``w`` (its workers used ``cpus``; ``tuner``:
        its tuner, before it takes ``w``)."""
        starved = w.idle >= IDLE_LOW and w.cpu_share >= CPU_LIGHT
        yielding, settled = (tuner.yielding, tuner.settled) if tuner else (False, False)
        return cls(w.worth, cpus, starved, 1.0 - w.idle, yielding, settled)

    def outranks(self, worth: float) -> bool:
        """Whether a CPU-second is worth :data:`PEER_MARGIN` more to this peer than ``worth``."""
        return _outranks(self.worth, worth)


def _outranks(a: float, b: float) -> bool:
    """Whether worth ``a`` is :data:`PEER_MARGIN` above worth ``b`` (both known)."""
    return b > 0 and a > b * (1 + PEER_MARGIN)


@dataclass(frozen=True)
class Room:
    """What the process may still use, measured over the same window."""

    ceiling: int
    """The most workers allowed at all (``max_workers``, open files)."""
    idle_cpus: float | None = None
    """CPUs' worth of time nobody used, on the CPUs (and within the quota) this process may use."""
    memory: int | None = None
    """Bytes that may still be taken, safety margin deducted (negative: over it already)."""
    worker_memory: int | None = None
    """The largest private memory measured of one worker, bytes."""
    peers: tuple[Peer, ...] = ()
    """The other "auto" loaders of this user on this machine."""

    def peer_cpus(self, worth: float) -> float:
        """CPUs' worth the workers of yielding peers outranked by a loader of ``worth`` use."""
        return sum(p.cpus for p in self.peers if p.yielding and _outranks(worth, p.worth))

    def outranked(self, w: Window, settled: bool = False) -> Peer | None:
        """A peer that is starved and outranks the loader of ``w`` (and holds its count, if
        ``settled``), while no CPU is idle and the loader's workers use CPU (so fewer of them
        free some); ``None`` if there is none."""
        if self.idle_cpus is None or self.idle_cpus >= SPARE_CPU or w.worth <= 0:
            return None
        starved = [
            p
            for p in self.peers
            if p.starved and p.outranks(w.worth) and (p.settled or not settled)
        ]
        return max(starved, key=lambda p: p.worth) if starved else None

    def busy(self, w: Window) -> float:
        """The trainers' busy time on the machine: the loader's of ``w`` and its peers'."""
        return 1.0 - w.idle + sum(p.busy for p in self.peers)


@dataclass
class WorkerTuner:
    """Chooses a loader's worker count from measured windows (see the module's docstring)."""

    start: int
    minimum: int = 1
    maximum: int = 64
    num_workers: int = field(init=False)
    phase: str = field(init=False, default="search")
    """``search`` or ``hold``."""
    reason: str = field(init=False, default="")
    """Why the current count, in words (``loader.stats().tuner``, the INFO log)."""
    measured: dict[int, float] = field(init=False, default_factory=dict)
    """Throughput measured per worker count in the current search."""
    history: list[tuple[int, float]] = field(init=False, default_factory=list)
    """Every window, in order: (workers, samples/s)."""
    searches: int = field(init=False, default=1)
    _idle: dict[int, float] = field(init=False, default_factory=dict)
    _spare: dict[int, float] = field(init=False, default_factory=dict)
    _share: dict[int, float] = field(init=False, default_factory=dict)
    _climbing: bool = field(init=False, default=True)
    _step: int = field(init=False, default=0)
    _reference: Window | None = field(init=False, default=None)
    _drifts: int = field(init=False, default=0)
    _held: int = field(init=False, default=0)
    _probe: tuple[int, float] | None = field(init=False, default=None)
    _peer_cpus: float = field(init=False, default=0.0)
    _yield: tuple[int, float, float, tuple[float, ...]] | None = field(init=False, default=None)
    """The last yield until judged: (count before, its rate, the machine's busy time before,
    the machine's busy time in each window since)."""
    _busy: list[float] = field(init=False, default_factory=list)
    """The machine's busy time in the last (up to two) windows at the current count."""
    _no_yield: int = field(init=False, default=0)
    yielding: bool = field(init=False, default=False)
    """It holds fewer workers than it had because it yielded (until it takes them back or
    searches again): a peer that outranks it may take the CPU its workers use."""
    _yield_ban: int = field(init=False, default=YIELD_BAN)

    @property
    def settled(self) -> bool:
        """It holds its count: its search ended, and no probe nor yield is being measured."""
        return self.phase == "hold" and self._probe is None and self._yield is None

    def __post_init__(self) -> None:
        if not 0 <= self.minimum <= self.maximum:
            raise ValueError(f"need 0 <= minimum={self.minimum} <= maximum={self.maximum}")
        self.num_workers = min(max(self.start, self.minimum), self.maximum)
        self.reason = f"searching: measuring {self.num_workers} workers first"

    # ------------------------------------------------------------------ helpers

    def best(self) -> int:
        """The fewest workers measured within :data:`TOLERANCE` of the best throughput, passing
        over a count at which CPU-bound workers left the trainer waiting while CPU they could
        take was left (:meth:`_feeding`) when a larger count did about as well: the workers
        there lacked workers, not CPU (gaps in the in-order stream, which one more fills)."""
        peak = max(self.measured.values())
        near = sorted(n for n, r in self.measured.items() if r >= peak * (1 - TOLERANCE))
        for n in near[:-1]:
            if not (self._feeding(n) and self._share.get(n, 0.0) >= CPU_BOUND):
                return n
        return near[-1]

    def _cap(self, w: Window, room: Room) -> int:
        """The most workers the room allows growing to from ``w.num_workers``."""
        n = w.num_workers
        cap = min(self.maximum, room.ceiling)
        if room.memory is not None:
            if room.worker_memory:
                cap = min(cap, n + max(room.memory // room.worker_memory, 0))
            elif n > 0:
                cap = min(cap, n + 1)  # no worker measured yet: one at a time
        share = w.cpu_share
        if room.idle_cpus is not None and share >= CPU_LIGHT:
            free = room.idle_cpus + room.peer_cpus(w.worth)
            grow = max(math.floor(free / share + 0.5), 0)
            if w.idle >= IDLE_LOW and (free >= SPARE_CPU or not room.peers):
                grow = max(grow, 1)  # the trainer waits: one more is measured, kept if it pays
            cap = min(cap, n + grow)
            if room.outranked(w) is not None:
                cap = min(cap, n)
        return max(cap, n if n >= self.minimum else self.minimum)

    def _feeding(self, n: int) -> bool:
        """Whether at ``n`` workers the trainer waited while CPU time was left idle (or given up
        by a yielding peer)."""
        return self._idle.get(n, 0.0) >= IDLE_LOW and self._spare.get(n, 0.0) >= SPARE_CPU

    def _move(self, n: int, reason: str) -> int | None:
        self.reason = reason
        if n == self.num_workers:
            return None
        self.num_workers, self._busy = n, []
        return n

    def limit(self, maximum: int, whose: str) -> int | None:
        """A new ceiling (``whose``, in words), at least :attr:`minimum`: the count to move to
        now if the current one is above it (searching again from there), else None."""
        self.maximum = max(maximum, self.minimum)
        if self.num_workers <= self.maximum:
            return None
        self._probe = self._yield = None
        self._restart()
        return self._move(
            self.maximum, f"searching within a ceiling of {self.maximum} workers ({whose})"
        )

    # ------------------------------------------------------------------ the decision

    def observe(self, w: Window, room: Room) -> int | None:
        """Takes one window measured at ``w.num_workers``; returns the count to set next, or
        ``None`` to keep the current one."""
        if w.num_workers != self.num_workers or w.batches == 0:
            return None  # measured before the last change applied, or nothing delivered
        self.history.append((w.num_workers, w.rate))
        self._busy = [*self._busy[-1:], room.busy(w)]
        if room.memory is not None and room.memory < 0 and w.num_workers > self.minimum:
            per = room.worker_memory or 1
            shed = max(1, math.ceil(-room.memory / per))
            n = max(self.minimum, w.num_workers - shed)
            self.phase, self.measured = "hold", {}
            self._reference = None
            return self._move(
                n, f"limited by memory: {-room.memory / 2**20:.0f} MiB over the room, shed {shed}"
            )
        before, self._peer_cpus = self._peer_cpus, room.peer_cpus(w.worth)
        self._no_yield = max(self._no_yield - 1, 0)
        if self._yield is not None:
            return self._judge_yield(w, room)
        peer = room.outranked(w, settled=True) if self.settled else None
        fewer = w.num_workers > self.minimum
        if peer is not None and (fewer or not self.yielding) and not self._no_yield:
            # At its minimum it cannot shed a worker, but it can say that its workers' CPU is
            # the peer's to take (as a yield to fewer, judged the same way).
            n = max(self.minimum, w.num_workers // 2)
            busy = sum(self._busy) / len(self._busy)
            self._yield, self.yielding = (w.num_workers, w.rate, busy, ()), True
            self.phase, self.measured, self._probe = "hold", {}, None
            self._reference = None
            return self._move(
                n,
                f"yielding CPU: another loader on this machine makes {peer.worth / w.worth:.1f}x "
                "as much of a CPU-second and waits for data; "
                + (f"down to {n} workers" if fewer else f"its {n} workers' CPU is its to take"),
            )
        if abs(self._peer_cpus - before) > PEER_SHIFT:
            self._probe = None  # measured under other neighbours: measure again from here
            self._restart()
            return self._search(w, room)
        if self.phase == "hold":
            if self._probe is not None:
                return self._probed(w, room)
            if self._reference is None and self.measured and w.num_workers in self.measured:
                return self._confirm(w)
            if self.yielding or not self._drifted(w):
                # A yielding loader's windows drift as its peer grows into the CPU: a search
                # would undo the yield. A probe finds the CPU a leaving peer frees.
                return self._maybe_probe(w, room)
            self._restart()
        return self._search(w, room)

    def _judge_yield(self, w: Window, room: Room) -> int | None:
        """Measured truth over the worth rule: :data:`YIELD_JUDGE` windows after a yield, the
        machine's trainers must be busier by :data:`GAIN` (the peer made more of the CPU than
        this loader did), else the loader takes its workers back and does not yield again for
        a while (:data:`YIELD_BAN` windows, doubled each time, up to :data:`YIELD_BAN_MAX`)."""
        assert self._yield is not None
        n, rate, busy, after = self._yield
        after = (*after, room.busy(w))
        if len(after) < YIELD_JUDGE:
            self._yield = (n, rate, busy, after)
            return None  # the peer is still growing into the CPU, or one window is too few
        self._yield, now = None, sum(after[1:]) / (len(after) - 1)
        if now > busy * (1 + GAIN):
            self._yield_ban = YIELD_BAN
            return None
        self._no_yield, self._yield_ban = self._yield_ban, min(2 * self._yield_ban, YIELD_BAN_MAX)
        self._restart({n: rate, w.num_workers: w.rate})  # no longer yielding
        return self._move(
            n,
            f"taking CPU back: yielding {n} -> {w.num_workers} workers left this machine's "
            f"trainers no busier ({busy:.2f} -> {now:.2f} of a trainer); no yield for "
            f"{self._no_yield} windows",
        )

    def _restart(self, measured: dict[int, float] | None = None) -> None:
        self.phase, self.measured = "search", dict(measured or {})
        self._idle, self._spare, self._share = {}, {}, {}
        self.yielding = False
        self._climbing, self._reference, self.searches = True, None, self.searches + 1

    def _maybe_probe(self, w: Window, room: Room) -> int | None:
        n = w.num_workers
        self._held = self._held + 1 if w.idle >= IDLE_LOW else 0
        if self._held < PROBE_EVERY or self._cap(w, room) <= n:
            return None
        self._held = 0
        self._probe = (n, w.rate)
        return self._move(
            n + 1, f"probing {n + 1} workers: at {n} the trainer still waits {w.idle:.0%}"
        )

    def _probed(self, w: Window, room: Room) -> int | None:
        assert self._probe is not None
        (n, rate), self._probe = self._probe, None
        if w.rate > rate * (1 + GAIN):
            self._restart({n: rate})
            return self._search(w, room)
        return self._move(
            n,
            f"holding {n} workers: the probe of {w.num_workers} measured {w.rate:.0f} "
            f"samples/s, not {GAIN:.0%} above {rate:.0f}",
        )

    def _confirm(self, w: Window) -> int | None:
        n = w.num_workers
        peak = max(self.measured.values())
        self._reference = w
        if w.rate >= peak * (1 - CONFIRM):
            return None
        self.measured[n] = (self.measured[n] + w.rate) / 2
        best = self.best()
        if best == n:
            return None
        self._reference = None
        return self._move(
            best,
            f"holding {best} workers: {n} measured {w.rate:.0f} samples/s on a second look, "
            f"below the best ({peak:.0f})",
        )

    def _drifted(self, w: Window) -> bool:
        ref = self._reference
        if ref is None:
            self._reference = w
            return False

        def moved(a: float, b: float) -> bool:
            return b > 0 and abs(a / b - 1) > DRIFT

        drift = (
            moved(w.compute_seconds, ref.compute_seconds)
            or moved(w.fetch_per_sample, ref.fetch_per_sample)
            or w.idle > max(ref.idle + IDLE_DRIFT, IDLE_LOW)
        )
        self._drifts = self._drifts + 1 if drift else 0
        if self._drifts >= 2:
            self._drifts = 0
            return True
        return False

    def _search(self, w: Window, room: Room) -> int | None:
        n = w.num_workers
        before = max(self.measured.values()) if self.measured else 0.0
        old = self.measured.get(n)
        self.measured[n] = w.rate if old is None else (old + w.rate) / 2
        self._idle[n], self._share[n] = w.idle, w.cpu_share
        if room.idle_cpus is not None:
            self._spare[n] = room.idle_cpus + room.peer_cpus(w.worth)
        cap = self._cap(w, room)
        if self._climbing:
            improved = w.rate > before * (1 + GAIN)
            if improved and w.idle >= IDLE_LOW and n < cap:
                if w.fetch_seconds and w.compute_seconds:
                    want = math.ceil(w.fetch_seconds / w.compute_seconds * 1.1)
                else:
                    want = math.ceil(max(n, 1) / max(1 - w.idle, 0.25) * 1.1)
                target = min(max(want, n + 1), 8 * max(n, 1), cap)
                return self._move(
                    target,
                    f"searching: {n} workers gave {w.rate:.0f} samples/s with the trainer "
                    f"waiting {w.idle:.0%}; trying {target}",
                )
            self._climbing = False
            self._step = max(1, round(self.best() * 0.15))
        best = self.best()
        while True:
            for cand in (best - self._step, best + self._step):
                if cand < self.minimum or cand > self.maximum or cand in self.measured:
                    continue
                if cand > best and (cand > cap or self._idle.get(best, 1.0) < IDLE_LOW):
                    continue  # the trainer no longer waits at best, or no room to grow
                if cand < best and self._feeding(best):
                    continue  # fewer workers would produce less
                return self._move(
                    cand,
                    f"searching: best so far {best} workers ({self.measured[best]:.0f} "
                    f"samples/s); trying {cand}",
                )
            if self._step <= 1:
                break
            self._step = max(1, self._step // 2)
        self.phase, self._reference, self._drifts = "hold", None, 0
        tried = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(self.measured.items()))
        return self._move(
            best,
            f"holding {best} workers: the fewest within {TOLERANCE:.1%} of the best measured "
            f"throughput (samples/s by workers: {tried})",
        )
