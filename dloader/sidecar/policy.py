"""The node policy: how many loader workers each job gets. Pure code: plain values in and out.

``even``: the node's worker budget split equally (the baseline), within each job's limits.

``adaptive`` (A-Dloader's knob): maximise the sum over jobs of predicted throughput normalised
by the job's accelerator limit (equivalently: minimise accelerator idle), subject to

* the node's loader-worker budget ``sum k_j <= W``;
* the node's ``C`` cores, shared the way the OS shares them (:func:`cpu_shares`): job ``j``
  with ``k_j`` workers demands ``d_j = T_j(k_j) * cpu_j`` cores (``cpu_j``: CPU seconds per
  sample of its loader, from its model), and its training process ``T_j(k_j) * main_j`` (CPU
  per sample, measured by the sidecar's process monitor). When the demands exceed ``C``, the
  scheduler gives each thread an equal share: a consumer that needs less than its share gets
  what it needs and the rest is split among the others by thread count. A job runs at its
  prediction scaled by the smaller fraction of demand its workers or its training process get,
  so a worker added to a CPU-bound job on a full node is worth what it takes from the other
  jobs, not what it would do alone;
* each job's own limits, and a floor of one worker (no job is starved);
* the node's memory budget ``sum k_j * m_j <= M``, ``m_j`` what one more worker of job ``j``
  costs (the private memory, USS, its workers reach: forked workers copy the dataset pages
  Python touches). No decision takes the node past ``M``: where even one worker per job would,
  the floors drop to the jobs' ``min_workers`` (0: loading in the training process), and a
  job whose next worker would gain but does not fit is reported as limited by memory. While a
  job's workers' memory still grows, it grows only to counts at which all its workers fit at
  the most one may come to hold (``worker_memory_bound``: the memory it shares with its
  trainer and may yet copy); the workers it has are counted at what they hold.

It allocates greedily: every job starts at its floor and the next worker goes to the job whose
extra worker raises the node's objective (under that CPU sharing) the most, until none adds
more than ``min_gain``; then single-worker moves between jobs (or removals) are made while they
gain, since the shared cores couple the jobs. It is fast: jobs x workers predictions, and one
vectorised evaluation of the sharing model per step (all of a step's trial allocations at
once): about 10 ms for 10 jobs and 64 workers. A model update calls for a new decision only
once the job's curve has moved by ``CURVE_MOVE`` since the decision it runs under. A job with
no observation yet, or one whose loader reports no worker timings and that has fewer than
``warmup`` observations, is explored instead (:func:`~dloader.predictor.exploration_plan`): one
window with its workers' timings gives each worker's I/O and CPU time per sample, from which
the model places the job at once. A new allocation replaces the previous one only if its
predicted objective is higher by ``hysteresis`` (no thrashing), or if it only releases workers
at no predicted loss.

Measured truth over the model (:func:`measured_guard`, :func:`probe`; the core keeps the
:class:`Measurements`): the model proposes, windows measured under the same neighbours decide;
a split moved to is measured before the next move.
Each split of the node (every job's worker count) is scored by what its jobs measured there,
steady, normalised by their accelerator limits. A proposal measured worse than the current
split is not taken; a split measured worse than the one left for it goes back to that one.
Steady at a measured split, the node tries the neighbour (one worker added, removed or moved)
the model ranks best among the near-ties it has not measured lately: where the model cannot
tell, measuring can (no worker is given to a job with less room to its accelerator limit than a
probe must gain to stay: it could not pay; and no probe is made that a split measured within
``PROBE_REACH`` workers of it, plus the model's difference, says would not stay). A probe that
pays is followed by the same move once more (a local search that follows a slope measured to
pay, one worker at a time). On a node whose cores the model says are all taken, near-ties that
give a CPU-bound job a worker less come first (more runnable threads than cores cost switching
and the trainers' wait for a core, which the model's sharing does not see). A probe stays only
if it measures better (such a lighter one: if it measures no worse; a tie goes to fewer
threads); each that does not doubles the wait before the next. Measurements are forgotten after
``MEASURE_STALE_S`` (costs change), and all at once when a job measures unlike before at the
same split (``MEASURE_CHANGED``: its costs, or a neighbour's, changed under it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dloader.errors import InvalidArgument
from dloader.predictor import LoaderModel, LoaderObservation, exploration_plan

__all__ = [
    "POLICIES",
    "Budget",
    "Candidate",
    "JobView",
    "Learning",
    "Measurements",
    "Probe",
    "Split",
    "WorkerDecision",
    "check_policy",
    "cpu_sets",
    "cpu_shares",
    "curve_moved",
    "decide",
    "expected",
    "fits",
    "heavier",
    "learning_gate",
    "measured_guard",
    "probe",
    "same_jobs",
    "show_split",
    "split_of",
    "steady_window",
]

#: The node policies.
POLICIES = ("adaptive", "even")

SETTLE_S = 1.5
"""After a worker-count change: time to apply it and start the workers before a window counts."""
SURPRISE = 0.1
"""``|log(measured / predicted)|`` of a window that makes the policy re-decide at once."""
DRIFT_WINDOWS = 3
"""Surprising windows in a row, all one way, after which a job's model forgets the older ones:
its costs changed (a pipeline slower or faster than all it did before)."""
CURVE_MOVE = 0.01
"""A model update calls for a decision only if the job's predicted curve moved by more than
this share at some worker count (its throughput, share of the accelerator limit or CPU
demand) since the decision the job runs under: each window moves a fit a little, and these
small moves add up against that decision's curve until they pass this."""
STEADY_AFTER = 10
"""Windows at one allocation after which the model takes only one in ``STEADY_EVERY``."""
STEADY_EVERY = 5


def check_policy(name: str, field: str = "policy") -> str:
    """``name`` if it is a node policy; else :class:`InvalidArgument` naming ``field``."""
    if name not in POLICIES:
        raise InvalidArgument(field, f"{name!r} is not one of {', '.join(POLICIES)}")
    return name


@dataclass(frozen=True)
class JobView:
    """What the policy knows of a job."""

    job_id: str
    batch_size: int
    current_workers: int
    min_workers: int = 0
    max_workers: int = 0
    """0: no limit of its own (the node budget)."""
    model: LoaderModel | None = None
    initial_workers: int = 0
    """The count the job started with: exploration goes up from there (0: from 1 worker)."""
    main_cpu_per_sample: float = 0.0
    """CPU seconds its training process spends per sample (receiving and collating batches);
    it competes for the same cores as the loader workers (0: unknown)."""
    worker_memory_bytes: float = 0.0
    """What one more of its workers costs in memory (0: nothing known: not limited)."""
    worker_memory_bound: float = 0.0
    """While its workers' memory still grows (they copy the trainer's pages as they read them):
    the most one worker may come to hold. Workers beyond its current count are counted at
    this (0: its workers' memory has settled; ``worker_memory_bytes`` applies to all)."""


@dataclass(frozen=True)
class Budget:
    """The node's loader resources."""

    workers: int
    """Loader worker processes, all jobs together."""
    cores: float
    """Cores loader work may use, all jobs together."""
    memory_bytes: float = math.inf
    """Memory the loader workers of all jobs may use together."""


class Candidate(NamedTuple):
    """One worker count considered for a job (a named tuple: a decision makes one per job and
    count, thousands at 50 jobs)."""

    num_workers: int
    predicted: float
    relative_std: float
    normalized: float
    cpu_cores: float


@dataclass(frozen=True)
class WorkerDecision:
    """The policy's answer for one job."""

    job_id: str
    num_workers: int
    reason: str
    accelerator_limit: float = 0.0
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    cpu_share: float = 0.0
    """Cores the job gets under the node's CPU sharing (workers and training process; 0:
    unknown, e.g. while exploring)."""
    memory_limited: bool = False
    """Memory, not CPU, stops it from getting a worker the model says would help."""
    placed: bool = True
    """The job's model placed it (False: it is explored, or has no model yet)."""


def _bounds(job: JobView, budget: Budget) -> tuple[int, int]:
    high = min(job.max_workers or budget.workers, budget.workers)
    low = min(max(job.min_workers, 1), high) if high > 0 else 0
    return low, max(high, low)


@dataclass(frozen=True)
class _Memory:
    """What loader workers cost in memory. ``k`` workers of job ``j`` cost ``k`` times its
    measured cost while ``k`` is at most the count it runs now; beyond it, while its workers'
    memory still grows, ``k`` times the bound (the new workers and the old may all grow to it):
    no job grows on memory its workers have not shown they stay within."""

    measured: dict[str, float]
    bound: dict[str, float]
    current: dict[str, int]

    @classmethod
    def of(cls, jobs: Sequence[JobView]) -> _Memory:
        return cls(
            {j.job_id: j.worker_memory_bytes for j in jobs},
            {j.job_id: j.worker_memory_bound for j in jobs},
            {j.job_id: j.current_workers for j in jobs},
        )

    def per_worker(self, job_id: str, k: int) -> float:
        """What each of ``k`` workers of the job is counted at."""
        m = self.measured[job_id]
        return max(m, self.bound[job_id]) if k > self.current[job_id] else m

    def total(self, alloc: dict[str, int]) -> float:
        return sum(k * self.per_worker(j, k) for j, k in alloc.items())

    def most(self, job_id: str, room: float, high: int) -> int:
        """The largest count up to ``high`` whose workers fit in ``room`` (0 if none does)."""
        k = high
        while k > 0 and k * self.per_worker(job_id, k) > room:
            k -= 1
        return k

    def fit(self, alloc: dict[str, int], floors: dict[str, int], limit: float) -> dict[str, int]:
        """``alloc`` with workers taken, most memory freed first, down to ``floors``, until it
        fits in ``limit``."""
        out = dict(alloc)

        def freed(j: str) -> float:
            k = out[j]
            return k * self.per_worker(j, k) - (k - 1) * self.per_worker(j, k - 1)

        while self.total(out) > limit:
            over = [j for j in out if out[j] > floors[j] and freed(j) > 0]
            if not over:
                break
            big = max(over, key=lambda j: (freed(j), out[j]))
            out[big] -= 1
        return out


def _floors(jobs: Sequence[JobView], budget: Budget, memory: _Memory) -> dict[str, int]:
    """Each job's lowest count: one worker, or its ``min_workers`` where memory is short."""
    floors = {j.job_id: _bounds(j, budget)[0] for j in jobs}
    hard = {j.job_id: min(j.min_workers, floors[j.job_id]) for j in jobs}
    return memory.fit(floors, hard, budget.memory_bytes)


def _even(jobs: Sequence[JobView], budget: Budget) -> dict[str, WorkerDecision]:
    share = max(budget.workers // max(len(jobs), 1), 1)
    memory = _Memory.of(jobs)
    wanted = {}
    for job in jobs:
        low, high = _bounds(job, budget)
        wanted[job.job_id] = min(max(share, low), high)
    alloc = memory.fit(wanted, _floors(jobs, budget, memory), budget.memory_bytes)
    out = {}
    for job in jobs:
        low, high = _bounds(job, budget)
        k, cut = alloc[job.job_id], alloc[job.job_id] < wanted[job.job_id]
        why = f"even split: {budget.workers} workers / {len(jobs)} jobs, within [{low}, {high}]"
        if cut:
            why += f"; {k} to fit the memory budget ({_mb(budget.memory_bytes)})"
        out[job.job_id] = WorkerDecision(job.job_id, k, why, memory_limited=cut)
    return out


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _curve(job: JobView, budget: Budget, high: int) -> tuple[Candidate, ...]:
    model = job.model
    assert model is not None
    limit = model.accelerator_limit(job.batch_size)
    cpu = model.cpu_seconds_per_sample
    return tuple(
        Candidate(
            k,
            p.samples_per_s,
            p.relative_std,
            p.samples_per_s / limit,
            p.samples_per_s * cpu if k > 0 else 0.0,
        )
        for k, p in enumerate(model.predict_curve(high, budget.cores, job.batch_size))
    )


def curve_moved(job: JobView, budget: Budget, decided: Sequence[Candidate]) -> bool:
    """Whether ``job``'s predicted curve differs from ``decided`` (the candidates of the
    decision it runs under) by more than ``CURVE_MOVE`` at some count; True if there is none
    to compare (a job explored, or not yet decided)."""
    if not decided or job.model is None or not job.model.observations:
        return True

    def moved(now: float, then: float) -> bool:
        return abs(now - then) > CURVE_MOVE * abs(then)

    return any(
        moved(a.predicted, b.predicted)
        or moved(a.normalized, b.normalized)
        or moved(a.cpu_cores, b.cpu_cores)
        for a, b in zip(_curve(job, budget, len(decided) - 1), decided, strict=True)
    )


def _water_fill(demands: np.ndarray, weights: np.ndarray, cores: float) -> np.ndarray:
    """:func:`cpu_shares` for many rows of consumers at once (``(m, n)`` demands and weights)."""
    active = demands > 0
    w = np.where(active, weights, 0.0)
    # In order of demand per thread (the idle last): while a consumer needs no more than its
    # fair share of what is left, it gets its demand (which only raises the others' share);
    # from the first that needs more, everyone left shares the rest by thread count.
    order = np.argsort(
        np.where(active, demands / np.maximum(w, 1.0), np.inf), axis=1, kind="stable"
    )
    m, n = demands.shape
    rows = np.arange(m)[:, None]
    d, ws = demands[rows, order], w[rows, order]
    # what is left before each consumer, summed in the order the sequential pass takes it
    left = np.cumsum(np.concatenate([np.full((m, 1), float(cores)), -d[:, :-1]], axis=1), axis=1)
    weight = ws.sum(axis=1, keepdims=True) - np.cumsum(ws, axis=1) + ws
    short = d * weight > left * ws
    first = np.where(short.any(axis=1), short.argmax(axis=1), n)[:, None]
    at = np.minimum(first, n - 1)
    level = left[rows, at] / np.maximum(weight[rows, at], 1.0)
    out = np.empty_like(d)
    out[rows, order] = np.where(np.arange(n) < first, d, level * ws)
    return out


def cpu_shares(demands: Sequence[float], workers: Sequence[int], cores: float) -> list[float]:
    """Cores each job gets when jobs demand ``demands`` cores with ``workers`` workers each.

    Water-filling with per-worker fairness (as the kernel's fair scheduler shares cores between
    runnable threads): if the demands fit, everyone gets its demand; otherwise jobs whose demand
    is below their workers' fair share get it, and the cores left are divided among the others
    in proportion to their worker counts.
    """
    if not demands:
        return []
    d = np.array([demands], dtype=float)
    w = np.maximum(np.array([workers], dtype=float), 1.0)
    return [float(x) for x in _water_fill(d, w, cores)[0]]


def cpu_sets(shares: dict[str, float], cpus: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """Disjoint CPU sets, sized in proportion to each job's CPU share (at least one CPU each,
    largest remainders first), in the order of ``shares``; empty if there are fewer CPUs than
    jobs (then they cannot be kept apart)."""
    n = len(cpus)
    if not shares or n < len(shares):
        return {}
    total = sum(max(s, 0.0) for s in shares.values()) or 1.0
    exact = {j: max(s, 0.0) / total * n for j, s in shares.items()}
    count = {j: max(1, int(x)) for j, x in exact.items()}
    while sum(count.values()) > n:  # the floors of 1 overshot: take from the largest
        big = max(count, key=lambda j: (count[j] - exact[j], count[j]))
        count[big] -= 1
    for j in sorted(exact, key=lambda j: exact[j] - count[j], reverse=True):
        if sum(count.values()) >= n:
            break
        count[j] += 1
    out, at = {}, 0
    for j in shares:
        out[j] = tuple(cpus[at : at + count[j]])
        at += count[j]
    return out


class _Node:
    """The planned jobs' predicted curves as arrays, to evaluate many allocations (rows of
    worker counts, in ``ids`` order) in one pass: a greedy step's trials, or every local move.

    Each job is two CPU consumers: its ``k`` loader workers and its training process (one
    thread's weight); a job runs at its prediction scaled by the smaller fraction of its demand
    either gets. The objective is the sum over jobs of that normalised throughput.
    """

    def __init__(
        self,
        ids: list[str],
        curves: dict[str, tuple[Candidate, ...]],
        main_cpu: dict[str, float],
        cores: float,
        memory: _Memory,
    ) -> None:
        self.ids = ids
        self.cores = cores
        self.length = np.array([len(curves[j]) for j in ids], dtype=int)
        width = int(self.length.max(initial=1))
        shape = (len(ids), width)
        self.normalized, self.cpu, self.predicted = (
            np.zeros(shape),
            np.zeros(shape),
            np.zeros(shape),
        )
        self.memory = np.zeros(shape)
        for i, j in enumerate(ids):
            c = curves[j]
            self.normalized[i, : len(c)] = [x.normalized for x in c]
            self.cpu[i, : len(c)] = [x.cpu_cores for x in c]
            self.predicted[i, : len(c)] = [x.predicted for x in c]
            self.memory[i] = [k * memory.per_worker(j, k) for k in range(width)]
        # CPU demand at each count: the workers', then the training process's
        main = np.array([main_cpu[j] for j in ids])[:, None]
        self.demand = np.concatenate([self.cpu, self.predicted * main])
        self._rows = np.arange(len(ids))
        self._both = np.arange(2 * len(ids))

    @classmethod
    def of(
        cls,
        jobs: Sequence[JobView],
        curves: dict[str, tuple[Candidate, ...]],
        cores: float,
        memory: _Memory | None = None,
    ) -> _Node:
        """The node of ``jobs`` (in their order), their training processes' CPU from their
        views; ``memory``: what their workers cost (default: from these views)."""
        return cls(
            [j.job_id for j in jobs],
            curves,
            {j.job_id: j.main_cpu_per_sample for j in jobs},
            cores,
            memory if memory is not None else _Memory.of(jobs),
        )

    def row(self, alloc: dict[str, int]) -> np.ndarray:
        return np.array([alloc[j] for j in self.ids], dtype=int)

    def valid(self, allocs: np.ndarray) -> np.ndarray:
        """Rows every job of which has a prediction (a count within its curve)."""
        return np.asarray(((allocs >= 0) & (allocs < self.length)).all(axis=1))

    def memory_of(self, allocs: np.ndarray) -> np.ndarray:
        """The loader workers' memory of each (valid) row."""
        return _row_sums(self.memory[self._rows, allocs])

    def shares(self, allocs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per (valid) row: the CPU demands (workers, then training processes) and the cores
        each gets."""
        twice = np.concatenate([allocs, allocs], axis=1)
        demand = self.demand[self._both, twice]
        weights = np.where(self._both < len(self.ids), np.maximum(twice, 1), 1).astype(float)
        return demand, _water_fill(demand, weights, self.cores)

    def scale(self, allocs: np.ndarray) -> np.ndarray:
        """Per (valid) row and job: the share of its prediction it reaches under the sharing
        (the smaller fraction of demand its workers or its training process get)."""
        demand, got = self.shares(allocs)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(demand > 0, got / demand, 1.0)
        n = len(self.ids)
        return np.minimum(np.minimum(ratio[:, :n], ratio[:, n:]), 1.0)

    def objective(self, allocs: np.ndarray) -> np.ndarray:
        """The node's objective for each (valid) row."""
        return _row_sums(self.normalized[self._rows, allocs] * self.scale(allocs))


def _row_sums(values: np.ndarray) -> np.ndarray:
    """Row sums, added job by job as a loop would (``cumsum`` adds in sequence; ``sum`` adds
    pairwise and rounds otherwise): a row scores the same alone or in any batch, so ties
    between allocations break the same way however they were evaluated."""
    return np.cumsum(values, axis=1)[:, -1]


def decide(
    policy: str,
    jobs: Sequence[JobView],
    budget: Budget,
    *,
    warmup: int = 3,
    min_gain: float = 0.005,
    hysteresis: float = 0.03,
    release_loss: float = 0.0005,
) -> dict[str, WorkerDecision]:
    """Worker counts for every job under ``policy`` (``"adaptive"`` or ``"even"``).

    Raises:
        InvalidArgument: an unknown policy (a ``ValueError``).
        ValueError: an empty budget.
    """
    check_policy(policy)
    if budget.workers < 0 or not budget.cores > 0:
        raise ValueError(f"budget {budget} needs workers >= 0 and cores > 0")
    if policy == "even" or not jobs:
        return _even(jobs, budget)

    out: dict[str, WorkerDecision] = {}
    planned: list[JobView] = []
    memory = _Memory.of(jobs)
    floors = _floors(jobs, budget, memory)
    held = {j.job_id: j.current_workers for j in jobs}
    for job in jobs:
        low, high = _bounds(job, budget)
        low = floors[job.job_id]
        if math.isfinite(budget.memory_bytes):  # others keep what they hold
            others = memory.total({**held, job.job_id: 0})
            high = max(memory.most(job.job_id, budget.memory_bytes - others, high), low)
        model = job.model
        seen = model.observations if model is not None else ()
        # One window with its workers' timings gives each worker's I/O and CPU per sample:
        # the model can place the job from there. Without them, explore the curve first.
        timed = any(o.fetch_s is not None and o.num_workers > 0 for o in seen)
        if len(seen) < (1 if timed else warmup):
            k = exploration_plan(
                seen,
                cores=max(int(budget.cores), 1),
                max_workers=high,
                min_workers=low,
                start=job.initial_workers or None,
            )
            if k is not None:
                out[job.job_id] = WorkerDecision(
                    job.job_id,
                    k,
                    f"exploring (cold start, {len(seen)} observations): trying {k} workers",
                    placed=False,
                )
                held[job.job_id] = k  # the next job's memory cap counts these
                continue
        if model is None:
            out[job.job_id] = WorkerDecision(
                job.job_id,
                min(max(job.current_workers, low), high),
                "no model yet: keeping the current worker count",
                placed=False,
            )
            continue
        planned.append(job)

    used_workers = sum(d.num_workers for d in out.values())
    slots = max(budget.workers - used_workers, 0)
    # the memory the planned jobs may share: what the decided (exploring) jobs do not take
    room = budget.memory_bytes - memory.total({j: d.num_workers for j, d in out.items()})
    if not planned:
        return out
    curves = {j.job_id: _curve(j, budget, _bounds(j, budget)[1]) for j in planned}
    node = _Node.of(planned, curves, budget.cores, memory)
    n = len(planned)
    lowest = node.row(floors)

    def allowed(trials: np.ndarray) -> np.ndarray:
        """Rows within the floors, the curves and the memory room (the others are not
        evaluated)."""
        ok = node.valid(trials) & (trials >= lowest).all(axis=1)
        ok[ok] = node.memory_of(trials[ok]) <= room
        return ok

    def best(trials: np.ndarray) -> tuple[float, np.ndarray] | None:
        """The allowed trial of highest objective (the first of equals), and its value."""
        ok = allowed(trials)
        if not ok.any():
            return None
        values = node.objective(trials[ok])
        i = int(np.argmax(values))
        return float(values[i]), trials[ok][i]

    alloc = lowest.copy()
    objective_new = float(node.objective(alloc[None])[0])
    grow = np.eye(n, dtype=int)
    while alloc.sum() < slots:
        step = best(alloc + grow)
        if step is None or step[0] - objective_new < min_gain:
            break
        objective_new, alloc = step
    # The jobs are coupled through the shared cores, so the greedy order can strand workers
    # (an early CPU-bound worker crowds out later I/O-bound ones): improve by local moves,
    # one worker removed or moved from one job to another, while that gains at least min_gain.
    moves = []
    for src in range(n):
        for dst in [None, *range(n)]:
            if dst != src:
                move = -grow[src] if dst is None else grow[dst] - grow[src]
                moves.append(move)
    shifts = np.array(moves, dtype=int).reshape(-1, n)
    for _ in range(4 * slots):
        step = best(alloc + shifts)
        if step is None or step[0] - objective_new < min_gain:
            break
        objective_new, alloc = step

    current = np.minimum(node.row(held), node.length - 1)
    objective_old = float(node.objective(current[None])[0])
    # Workers that add nothing still cost memory and CPU switches: an allocation that only
    # releases workers, at no predicted loss, is taken without waiting for the hysteresis.
    # "No loss" is strict (release_loss, well below min_gain): workers on a curve that still
    # rises a little are kept, or repeated small releases would add up to a real loss.
    releases = alloc.sum() < current.sum() and bool((alloc <= current).all())
    keep = (
        objective_new < objective_old * (1 + hysteresis)
        and not (releases and objective_new >= objective_old - release_loss)
        and bool((lowest <= current).all())
        and current.sum() <= slots
        and float(node.memory_of(current[None])[0]) <= room
    )
    final = current if keep else alloc
    _, got = node.shares(final[None])
    # memory, not CPU, limits a job: one more worker would gain and fits every other budget
    more = final + grow
    gains = np.zeros(n, dtype=bool)
    can = node.valid(more) & (more.sum(axis=1) <= slots)
    can[can] = node.memory_of(more[can]) > room
    if can.any():
        base = objective_old if keep else objective_new  # final's (row sums batch-independent)
        gains[can] = node.objective(more[can]) > base + min_gain
    used = float(node.memory_of(final[None])[0])
    for i, job in enumerate(planned):
        jid = job.job_id
        k = int(final[i])
        c = curves[jid][k]
        why = (
            f"kept: the best allocation predicts a sum of {objective_new:.3f} vs "
            f"{objective_old:.3f} now (< {hysteresis:.0%} better)"
            if keep
            else f"{k} workers: predicted {c.predicted:,.0f} samples/s = {c.normalized:.0%} of "
            f"the accelerator limit, {c.cpu_cores:.2f} cores; node sum "
            f"{objective_new:.3f} (was {objective_old:.3f})"
        )
        limited = bool(gains[i])
        if limited:
            grows = memory.per_worker(jid, k + 1) > memory.measured[jid]
            why += (
                f"; limited by memory: one more worker "
                f"({_mb(memory.per_worker(jid, k + 1))} each"
                + (", what its growing workers may copy" if grows else "")
                + f") would pass the budget ({_mb(used)} of {_mb(room)} used)"
            )
        out[jid] = WorkerDecision(
            jid,
            k,
            why,
            job.model.accelerator_limit(job.batch_size) if job.model else 0.0,
            curves[jid],
            float(got[0, i] + got[0, n + i]),
            limited,
        )
    return out


@dataclass(frozen=True)
class Learning:
    """What to do with one report window of a job (:func:`learning_gate`)."""

    observe: bool
    """Feed the window to the job's model."""
    run_length: int
    """Windows observed in a row at the job's current worker count, after this one."""
    redecide_now: bool
    """News (the first window at a new allocation, or a throughput the model did not expect):
    decide at once rather than at the next period."""
    surprise: float = 0.0
    """``log(measured / predicted)`` of a window at a known allocation beyond ``SURPRISE``
    (0: none). Several in a row, one way, say the job's costs changed (``DRIFT_WINDOWS``)."""


def steady_window(
    window_s: float,
    workers: int,
    directed_workers: int,
    busy_workers: int,
    since_directive_s: float,
    since_node_change_s: float,
) -> bool:
    """Whether a report window shows the job steady at its directed count: a window of at
    least a second, at that count, (with workers) some worker delivering a batch, and all of
    it after the job's last change and the node's (any job's) plus ``SETTLE_S``."""
    return (
        window_s >= 1.0
        and workers == directed_workers
        and (workers == 0 or busy_workers > 0)
        and min(since_directive_s, since_node_change_s) >= window_s + SETTLE_S
    )


def learning_gate(
    model: LoaderModel,
    obs: LoaderObservation,
    *,
    window_s: float,
    directed_workers: int,
    busy_workers: int,
    since_directive_s: float,
    reports: int,
    run_length: int,
    since_node_change_s: float = math.inf,
) -> Learning:
    """Whether a report window teaches the model something.

    Only steady windows at the allocation the job was told to run count: the whole window must
    lie after the last change plus ``SETTLE_S``, of this job's worker count and of any other
    job's on the node (``since_node_change_s``: a neighbour's change shifts the CPU contention,
    which would be credited to this job's own count), and (with workers) some worker must have
    delivered a batch. A job the model has not seen yet is the exception to the neighbours'
    rule: its first window places it (a job arriving on a busy node, whose neighbours move
    as it arrives, would otherwise wait at its own count for a quiet moment), and later windows
    correct it. One observation per window, not one per report. An allocation the model
    knows and predicts well (within ``SURPRISE``) is sampled one window in ``STEADY_EVERY``
    after ``STEADY_AFTER``.
    """
    k = obs.num_workers
    usable = (
        obs.samples_per_s > 0
        and obs.step_s > 0
        and steady_window(
            window_s,
            k,
            directed_workers,
            busy_workers,
            since_directive_s,
            since_node_change_s if model.observations else math.inf,
        )
    )
    if not usable:
        return Learning(False, run_length, False)
    same = bool(model.observations) and model.observations[-1].num_workers == k
    if same and reports % max(int(window_s), 1):
        return Learning(False, run_length, False)
    predicted = model.predict(k, obs.cores, obs.batch_size).samples_per_s if same else 0.0
    off = math.log(obs.samples_per_s / predicted) if predicted > 0 else math.inf
    surprise = same and abs(off) > SURPRISE
    run = run_length + 1 if same else 0
    if same and not surprise and run > STEADY_AFTER and run % STEADY_EVERY:
        return Learning(False, run, False)
    return Learning(True, run, not same or surprise, off if surprise else 0.0)


# ---------------------------------------------------------------- measured truth over the model

MEASURE_MARGIN = 0.03
"""A split measured worse than another by more than this share of its score is left, or not
taken (the node's throughput measured over a few windows varies by about this much)."""
MEASURE_WINDOWS = 2
"""Steady report windows each job needs at a split before the split's measured score counts."""
MEASURE_STALE_S = 90.0
"""A split's measurements older than this are forgotten: the jobs' costs may have changed."""
MEASURE_CHANGED = 0.25
"""A steady window of a job this far (as a share) from the mean of what it measured before at
the same split says the node changed under that split (a pipeline's cost, a neighbour's): every
split's measurements are forgotten at once, since each was taken under the old costs (a window
of the jobs here varies by a few per cent; a pipeline whose cost doubles moves by 40-50%)."""
PROBE_AFTER_S = 5.0
"""Steady this long at a measured split: try the untried neighbour the model ranks best (a
split is measured about 4 s after a change: ``SETTLE_S`` and ``MEASURE_WINDOWS`` windows)."""
PROBE_HOLD_S = 15.0
"""A split moved to (a probe, or the model's move) is held against the model's next proposals
until it is measured, at most this long."""
PROBE_MAX_WAIT_S = 160.0
"""Probes that do not pay double the wait before the next, up to this."""
PROBE_LOSS = 0.05
"""Neighbours the model predicts worse than the current split by more than this are not tried
(the model is the prior: only near-ties are worth measuring; its errors on this node are a few
per cent, so a near-tie is within 5%)."""
RELEASE_LOSS = 0.15
"""On a full node, a neighbour that gives a CPU-bound job a worker less (and none more) is worth
measuring if the model predicts it within this share of the current split: there the model
overrates such workers by more than its usual error (on the real mix at budget 12 it put
image_jpeg's second worker at +11 points of its limit; measured, it added none)."""
CPU_BOUND_WORKER = 0.5
"""Cores one worker of a job demands (as the model predicts), at or above which the job's
workers are CPU-bound: on a full node, a probe first tries one of them less."""
PROBE_GAIN = 0.01
"""A probed split is kept only if it measures better than the split it left by this share."""
PROBE_REACH = 2
"""A split measured within this many workers (summed over jobs) of an untried one estimates it
(its measurement plus the model's difference): one that falls clearly short is not probed."""
_REACH_SPLITS = 32
"""Measured splits (the most recent) a probe's estimate looks at."""
MAX_SPLITS = 256
"""Splits whose measurements are kept at most (the oldest go first)."""
_KEEP_SAMPLES = 8

Split = tuple[tuple[str, int], ...]
"""A node's allocation: (job id, worker count) for every job, sorted by job id."""


def split_of(counts: dict[str, int]) -> Split:
    """The :data:`Split` of job id -> worker count."""
    return tuple(sorted(counts.items()))


def same_jobs(a: Split, b: Split) -> bool:
    """Whether two splits are of the same jobs (none came or went between them)."""
    return [j for j, _ in a] == [j for j, _ in b]


@dataclass
class Measurements:
    """What each split measured: per job, its samples/s over steady windows at that split
    (after the last change of any job plus ``SETTLE_S``: the same neighbours throughout)."""

    samples: dict[Split, dict[str, list[float]]] = field(default_factory=dict)
    last: dict[Split, float] = field(default_factory=dict)

    def add(self, split: Split, job_id: str, samples_per_s: float, now: float) -> bool:
        """One steady window of ``job_id`` at ``split``. True when it says the node changed
        (``MEASURE_CHANGED``): everything measured before is forgotten, and this window starts
        anew."""
        per = self.samples.setdefault(split, {})
        values = per.setdefault(job_id, [])
        if len(values) >= MEASURE_WINDOWS:
            before = sum(values) / len(values)
            if before > 0 and abs(samples_per_s / before - 1) > MEASURE_CHANGED:
                self.samples, self.last = {split: {job_id: [samples_per_s]}}, {split: now}
                return True
        values.append(samples_per_s)
        del values[:-_KEEP_SAMPLES]
        self.last[split] = now
        for old in [s for s, t in self.last.items() if now - t > MEASURE_STALE_S]:
            self.forget(old)
        while len(self.last) > MAX_SPLITS:
            self.forget(min(self.last, key=self.last.__getitem__))
        return False

    def forget(self, split: Split) -> None:
        self.samples.pop(split, None)
        self.last.pop(split, None)

    def score(self, split: Split, limits: dict[str, float], now: float) -> float | None:
        """The sum over jobs of measured samples/s / accelerator limit at ``split``; None
        unless every job has ``MEASURE_WINDOWS`` windows there within ``MEASURE_STALE_S``."""
        per = self.samples.get(split)
        if per is None or now - self.last[split] > MEASURE_STALE_S:
            return None
        total = 0.0
        for job_id, _ in split:
            values = per.get(job_id, [])
            limit = limits.get(job_id, 0.0)
            if len(values) < MEASURE_WINDOWS or not limit > 0:
                return None
            total += sum(values) / len(values) / limit
        return total


def measured_guard(
    current: Split,
    proposed: Split,
    previous: Split | None,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
    *,
    trial: bool = False,
    lighter: bool = False,
    heavier: bool = False,
) -> tuple[Split, str]:
    """The split to run, and why when it is not the model's ``proposed``: the model proposes,
    measurements decide. A proposal measured worse than the current split (by
    ``MEASURE_MARGIN``) is not taken; a current split measured worse than the ``previous`` one
    (the split left for it) goes back to that. A ``trial`` split (a probe's) must earn its
    place: it is kept only if measured better than the previous one by ``PROBE_GAIN``; a
    ``lighter`` trial (a CPU-bound worker less on a full node) only if not measured worse by
    that much: a tie goes to the split with fewer threads competing for the cores. A
    ``heavier`` proposal (a CPU-bound worker more on a full node: :func:`heavier`) measured
    already is taken only if it measured better by ``PROBE_GAIN``."""
    here = measured.score(current, limits, now)
    if proposed != current:
        there = measured.score(proposed, limits, now)
        if (
            here is not None
            and there is not None
            and there < here * ((1 + PROBE_GAIN) if heavier else (1 - MEASURE_MARGIN))
        ):
            return current, (
                f"kept: measured {here:.3f} (sum of throughput / limit) at this split, "
                f"{there:.3f} at the model's choice {show_split(proposed)}"
            )
        return proposed, ""
    if previous is not None and previous != current and same_jobs(previous, current):
        before = measured.score(previous, limits, now)
        if here is not None and before is not None:
            # a probe must measure better (a lighter one, no worse); a model's move, not
            # measurably worse
            if trial:
                need = before / (1 + PROBE_GAIN) if lighter else before * (1 + PROBE_GAIN)
            else:
                need = before / (1 + MEASURE_MARGIN)
            if here < need:
                return previous, (
                    f"back to {show_split(previous)}: measured {before:.3f} there, {here:.3f} at "
                    f"{show_split(current)}" + (" (a probe that did not pay)" if trial else "")
                )
    return current, ""


def show_split(split: Split) -> str:
    """``job=k`` for each job (the job ids' first 6 characters: enough to tell them apart)."""
    return "(" + ", ".join(f"{j[:6]}={k}" for j, k in split) + ")"


def fits(jobs: Sequence[JobView], budget: Budget, counts: dict[str, int]) -> bool:
    """Whether ``counts`` keep every job within its limits and the node within its worker and
    memory budgets (a growing job's new workers counted at its bound)."""
    within = all(_bounds(j, budget)[0] <= counts[j.job_id] <= _bounds(j, budget)[1] for j in jobs)
    return (
        within
        and sum(counts.values()) <= budget.workers
        and _Memory.of(jobs).total(counts) <= budget.memory_bytes
    )


def expected(jobs: Sequence[JobView], budget: Budget, counts: dict[str, int]) -> dict[str, float]:
    """Samples/s the model expects of each job with a model at ``counts``, the node's cores
    shared as :func:`decide` shares them (a job's curve is what it does on all the cores; on a
    full node it gets less). Jobs without observations, or at a count past their curve, are
    left out."""
    known = [j for j in jobs if j.model is not None and j.model.observations]
    curves = {j.job_id: _curve(j, budget, _bounds(j, budget)[1]) for j in known}
    known = [j for j in known if 0 <= counts[j.job_id] < len(curves[j.job_id])]
    if not known:
        return {}
    node = _Node.of(known, curves, budget.cores)
    row = node.row(counts)
    scale = node.scale(row[None])[0]
    return {j: float(node.predicted[i, row[i]] * scale[i]) for i, j in enumerate(node.ids)}


class Probe(NamedTuple):
    """A split worth measuring (:func:`probe`)."""

    split: Split
    why: str
    lighter: bool
    """It gives a CPU-bound job a worker less on a full node (and none more): it stays unless
    it measures worse than the split it left (:func:`measured_guard`)."""


def probe(
    jobs: Sequence[JobView],
    budget: Budget,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
    again: dict[str, int] | None = None,
) -> Probe | None:
    """A neighbour of the current split worth measuring: one worker added to, removed from or
    moved between jobs, within the budgets, not measured lately, predicted by the model within
    ``PROBE_LOSS`` of the current split; the best predicted first. On a full node, those that
    give a CPU-bound job a worker less (and none more) come first, within ``RELEASE_LOSS``.
    ``again``: the move (job id -> workers added) of a probe that just paid: made once more
    first, if it is such a neighbour (a slope measured to pay is followed before the model's
    next guess). None: no neighbour is worth measuring."""
    if any(j.model is None or not j.model.observations for j in jobs):
        return None
    ids = [j.job_id for j in jobs]
    node = _modelled(jobs, budget)
    current = node.row({j.job_id: j.current_workers for j in jobs})
    if not node.valid(current[None])[0]:
        return None
    n = len(ids)
    rows = np.arange(n)
    # each job's predicted share of its limit here, the node's objective their sum
    shares = node.normalized[rows, current] * node.scale(current[None])[0]
    base = float(_row_sums(shares[None])[0])
    one = np.eye(n, dtype=int)
    shifts = [one, -one] + [one[b] - one[a] for a in range(n) for b in range(n) if a != b]
    trials = current + np.vstack(shifts).reshape(-1, n)
    bounds = np.array([_bounds(j, budget) for j in jobs]).reshape(-1, 2)
    ok = (
        (trials >= bounds[:, 0]).all(axis=1)
        & (trials <= bounds[:, 1]).all(axis=1)
        & (trials.sum(axis=1) <= budget.workers)
    )
    ok[ok] = node.memory_of(trials[ok]) <= budget.memory_bytes
    # No probe gives a worker to a job whose room to its accelerator limit is under PROBE_GAIN
    # of the node's score: that worker can raise only its own job, by less than a probe must
    # gain to stay, and it takes cores from the others. A worker added alone only unsettles
    # every job's measurements; moved there from another job, it is the other job's worker
    # less (a trial of its own) with one more thread.
    ok &= ~((trials > current) & (1.0 - shares < PROBE_GAIN * base)).any(axis=1)
    for t in np.flatnonzero(ok):  # not measured lately
        split = split_of(dict(zip(ids, trials[t].tolist(), strict=True)))
        ok[t] = measured.score(split, limits, now) is None
    values = np.full(len(trials), -np.inf)
    values[ok] = node.objective(trials[ok])
    # On a full node, a worker less for a CPU-bound job (one whose workers each compute half
    # the time or more) comes first: the model shares the cores as if that were free, but a
    # node with more runnable threads than cores also pays for their switching, and its
    # trainers wait longer for a core, so the model overrates such workers where it matters.
    bound, full = _cpu_bound(node, current, budget)
    fewer = ((trials < current) & bound).any(axis=1) & ~((trials > current) & bound).any(axis=1)
    # neither: those a measured neighbour says would not stay
    short = _measured_short(node, trials, values, fewer & full, current, measured, limits, now)
    values[short] = -np.inf
    near = values >= base * (1 - PROBE_LOSS)
    release = fewer & (values >= base * (1 - RELEASE_LOSS)) & full
    if not (near.any() or release.any()):
        return None
    pool = release if release.any() else near
    follow = np.zeros_like(near)
    if again:
        step = np.array([again.get(j, 0) for j in ids])
        follow = (near | release) & (trials == current + step).all(axis=1)
    if follow.any():
        pool, why = follow, " (the move that just paid, once more)"
    else:
        why = " (a CPU-bound worker less on a full node)" if release.any() else ""
    i = int(np.argmax(np.where(pool, values, -np.inf)))  # the best predicted (first of equals)
    split = split_of(dict(zip(ids, trials[i].tolist(), strict=True)))
    return Probe(
        split,
        f"probing {show_split(split)}: the model predicts {values[i]:.3f} there vs "
        f"{base:.3f} here, too close to call without measuring{why}",
        bool(fewer[i]) and full,
    )


def _measured_short(
    node: _Node,
    trials: np.ndarray,
    values: np.ndarray,
    lighter: np.ndarray,
    current: np.ndarray,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
) -> np.ndarray:
    """Trials (rows of ``trials``, predicted ``values``) a measured neighbour already answers:
    estimated as a split measured lately within ``PROBE_REACH`` workers of the trial plus the
    model's difference between the two, the best such estimate falls short of what the trial
    must measure to stay (:func:`measured_guard`: ``PROBE_GAIN`` better than the current
    split's measurement; a ``lighter`` one, no worse by it) by more than ``MEASURE_MARGIN``.
    The model ranks splits; a measured neighbour corrects its level (it overrates a CPU-bound
    worker on a full node: having measured one worker less there, the next split with that
    worker less needs no probe of its own)."""
    out = np.zeros(len(trials), dtype=bool)
    ids = node.ids
    here_split = split_of(dict(zip(ids, current.tolist(), strict=True)))
    here = measured.score(here_split, limits, now)
    if here is None:
        return out
    known = []  # the most recently measured splits of these jobs, this one aside
    for split in sorted(measured.last, key=measured.last.__getitem__, reverse=True):
        if split != here_split and same_jobs(split, here_split):
            score = measured.score(split, limits, now)
            if score is not None:
                known.append((dict(split), score))
        if len(known) >= _REACH_SPLITS:
            break
    if not known:
        return out
    rows = np.array([[k[j] for j in ids] for k, _ in known], dtype=int)
    valid = node.valid(rows)
    if not valid.any():
        return out
    rows, scores = rows[valid], np.array([v for (_, v), ok in zip(known, valid, strict=True) if ok])
    offset = scores - node.objective(rows)  # measured less predicted, per known split
    idx = np.flatnonzero(np.isfinite(values))  # the trials still in the running
    estimate = np.full(len(idx), -np.inf)
    for row, off in zip(rows, offset, strict=True):  # a few splits: no (trials, splits, jobs)
        near = np.abs(trials[idx] - row).sum(axis=1) <= PROBE_REACH
        estimate = np.maximum(estimate, np.where(near, values[idx] + off, -np.inf))
    need = np.where(lighter[idx], here / (1 + PROBE_GAIN), here * (1 + PROBE_GAIN))
    out[idx] = np.isfinite(estimate) & (estimate < need - MEASURE_MARGIN * here)
    return out


def _modelled(jobs: Sequence[JobView], budget: Budget) -> _Node:
    """The node of ``jobs`` (each with a model), every count within its bounds predicted."""
    curves = {j.job_id: _curve(j, budget, _bounds(j, budget)[1]) for j in jobs}
    return _Node.of(jobs, curves, budget.cores)


def _cpu_bound(node: _Node, row: np.ndarray, budget: Budget) -> tuple[np.ndarray, bool]:
    """At the allocation ``row``: which jobs' workers are CPU-bound (each demands
    ``CPU_BOUND_WORKER`` cores or more), and whether the node's predicted CPU demand exceeds
    its cores."""
    demand, _ = node.shares(row[None])
    n = len(node.ids)
    cpu_bound = demand[0, :n] >= CPU_BOUND_WORKER * np.maximum(row, 1)
    return cpu_bound, bool(demand.sum() > budget.cores)


def heavier(
    jobs: Sequence[JobView], budget: Budget, current: dict[str, int], proposed: dict[str, int]
) -> bool:
    """Whether ``proposed`` gives a CPU-bound job a worker more than ``current`` on a node whose
    cores the model says ``current`` already takes: the move the model's CPU sharing overrates
    (it counts the cores the worker takes from the others as free), so it stays only if it
    measures better (:func:`measured_guard`). False if a job has no model yet."""
    if any(j.model is None or not j.model.observations for j in jobs) or set(current) != set(
        proposed
    ):
        return False
    node = _modelled(jobs, budget)
    row = node.row(current)
    if not node.valid(row[None])[0]:
        return False
    bound, full = _cpu_bound(node, row, budget)
    return full and bool(((node.row(proposed) > row) & bound).any())
