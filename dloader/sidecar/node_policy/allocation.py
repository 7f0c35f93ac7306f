"""The model-led allocation: how many loader workers each job gets (:func:`decide`), what the
model expects of a split (:func:`expected`), and the model-side questions the measured truth
asks (:func:`fits`, :func:`heavier`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dloader.predictor import exploration_plan
from dloader.sidecar.node_policy.sharing import water_fill
from dloader.sidecar.node_policy.views import (
    Budget,
    Candidate,
    JobView,
    WorkerDecision,
    bounds,
    check_policy,
)

__all__ = [
    "CPU_BOUND_WORKER",
    "CURVE_MOVE",
    "HEDGE_BUSY",
    "HEDGE_COST",
    "MAX_SPARE",
    "ModelledNode",
    "WorkerMemory",
    "cpu_bound",
    "curve",
    "curve_moved",
    "decide",
    "expected",
    "fits",
    "heavier",
    "modelled",
    "row_sums",
]


CURVE_MOVE = 0.01
"""A model update calls for a decision only if the job's predicted curve moved by more than
this share at some worker count (its throughput, share of the accelerator limit or CPU
demand) since the decision the job runs under: each window moves a fit a little, and these
small moves add up against that decision's curve until they pass this."""

CPU_BOUND_WORKER = 0.5
"""Cores one worker of a job demands (as the model predicts), at or above which the job's
workers are CPU-bound: on a full node, a probe first tries one of them less."""


HEDGE_COST = 1.5
"""An I/O-bound job is given the workers that would still carry its predicted throughput were
each sample's storage wait this many times longer: such workers cost little (their upkeep,
thousandths of a core each, and their memory, both counted in the objective), and when a
storage wait rises they carry the job until the model has seen it (a window and its
decision), where a job held at the fewest workers that carry it loses at once. A remote read
1.5x slower is common (a busy storage node, a cold cache); one 2x slower is carried in part."""

MAX_SPARE = 4.0
"""The most a hedge may carry (a storage this many times slower): beyond it, spare workers
cost more memory than a slow-down that large is worth waiting for."""

HEDGE_BUSY = 0.1
"""Workers that compute at most this share of each sample's time are I/O-bound for the hedge:
more than that and spare workers would take cores, not only memory."""


@dataclass(frozen=True)
class WorkerMemory:
    """What loader workers cost in memory. ``k`` workers of job ``j`` cost ``k`` times its
    measured cost while ``k`` is at most the count it runs now; beyond it, while its workers'
    memory still grows, ``k`` times the bound (the new workers and the old may all grow to it):
    no job grows on memory its workers have not shown they stay within."""

    measured: dict[str, float]
    bound: dict[str, float]
    current: dict[str, int]

    @classmethod
    def of(cls, jobs: Sequence[JobView]) -> WorkerMemory:
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


def _floors(jobs: Sequence[JobView], budget: Budget, memory: WorkerMemory) -> dict[str, int]:
    """Each job's lowest count: one worker, or its ``min_workers`` where memory is short."""
    floors = {j.job_id: bounds(j, budget)[0] for j in jobs}
    hard = {j.job_id: min(j.min_workers, floors[j.job_id]) for j in jobs}
    return memory.fit(floors, hard, budget.memory_bytes)


def _even(
    jobs: Sequence[JobView], budget: Budget, *, ceilings: bool = False
) -> dict[str, WorkerDecision]:
    """The node's budget split equally within each job's limits, then cut to the memory
    budget; ``ceilings``: as the most each job's own tuner may choose (``guided``)."""
    share = max(budget.workers // max(len(jobs), 1), 1)
    memory = WorkerMemory.of(jobs)
    wanted = {}
    for job in jobs:
        low, high = bounds(job, budget)
        wanted[job.job_id] = min(max(share, low), high)
    alloc = memory.fit(wanted, _floors(jobs, budget, memory), budget.memory_bytes)
    out = {}
    for job in jobs:
        low, high = bounds(job, budget)
        k, cut = alloc[job.job_id], alloc[job.job_id] < wanted[job.job_id]
        why = f"even split: {budget.workers} workers / {len(jobs)} jobs, within [{low}, {high}]"
        if ceilings:
            why = f"tunes itself up to {k} workers ({why})"
        if cut:
            why += f"; {k} to fit the memory budget ({_mb(budget.memory_bytes)})"
        out[job.job_id] = WorkerDecision(job.job_id, k, why, memory_limited=cut)
    return out


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def curve(job: JobView, budget: Budget, high: int) -> tuple[Candidate, ...]:
    model = job.model
    assert model is not None
    limit = model.accelerator_limit(job.batch_size)
    cpu, upkeep = model.cpu_seconds_per_sample, job.worker_upkeep_cores
    return tuple(
        Candidate(
            k,
            p.samples_per_s,
            p.relative_std,
            p.samples_per_s / limit,
            p.samples_per_s * cpu + k * upkeep if k > 0 else 0.0,
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
        for a, b in zip(curve(job, budget, len(decided) - 1), decided, strict=True)
    )


class ModelledNode:
    """The planned jobs' predicted curves as arrays, to evaluate many allocations (rows of
    worker counts, in ``ids`` order) in one pass: a greedy step's trials, or every local move.

    Each job is two CPU consumers: its ``k`` loader workers (``k ** activity`` runnable threads'
    weight: ``JobView.worker_activity``) and its training process (one thread's weight, times
    ``trainer_weight`` where the workers are niced); a job runs at its
    prediction scaled by the smaller fraction of its demand either gets. The objective is the
    sum over jobs of that normalised throughput.
    """

    def __init__(
        self,
        ids: list[str],
        curves: dict[str, tuple[Candidate, ...]],
        main_cpu: dict[str, float],
        cores: float,
        memory: WorkerMemory,
        trainer_weight: float = 1.0,
        activity: dict[str, float] | None = None,
    ) -> None:
        self.ids = ids
        self.cores = cores
        self.trainer_weight = trainer_weight
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
        self.activity = np.array([(activity or {}).get(j, 1.0) for j in ids])
        self._rows = np.arange(len(ids))
        self._both = np.arange(2 * len(ids))

    @classmethod
    def of(
        cls,
        jobs: Sequence[JobView],
        curves: dict[str, tuple[Candidate, ...]],
        budget: Budget,
        memory: WorkerMemory | None = None,
    ) -> ModelledNode:
        """The node of ``jobs`` (in their order) within ``budget``'s cores, their training
        processes' CPU from their views; ``memory``: what their workers cost (default: from
        these views)."""
        return cls(
            [j.job_id for j in jobs],
            curves,
            {j.job_id: j.main_cpu_per_sample for j in jobs},
            budget.cores,
            memory if memory is not None else WorkerMemory.of(jobs),
            budget.trainer_weight,
            {j.job_id: j.worker_activity for j in jobs},
        )

    def row(self, alloc: dict[str, int]) -> np.ndarray:
        return np.array([alloc[j] for j in self.ids], dtype=int)

    def valid(self, allocs: np.ndarray) -> np.ndarray:
        """Rows every job of which has a prediction (a count within its curve)."""
        return np.asarray(((allocs >= 0) & (allocs < self.length)).all(axis=1))

    def memory_of(self, allocs: np.ndarray) -> np.ndarray:
        """The loader workers' memory of each (valid) row."""
        return row_sums(self.memory[self._rows, allocs])

    def shares(self, allocs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per (valid) row: the CPU demands (workers, then training processes) and the cores
        each gets."""
        twice = np.concatenate([allocs, allocs], axis=1)
        demand = self.demand[self._both, twice]
        workers = np.maximum(allocs, 1) ** self.activity
        weights = np.concatenate([workers, np.full(allocs.shape, self.trainer_weight)], axis=1)
        return demand, water_fill(demand, weights, self.cores)

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
        return row_sums(self.normalized[self._rows, allocs] * self.scale(allocs))


def row_sums(values: np.ndarray) -> np.ndarray:
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
    hedge: float = HEDGE_COST,
) -> dict[str, WorkerDecision]:
    """Worker counts for every job under ``policy`` (``"adaptive"`` or ``"even"``); under
    ``"guided"``, the most each job's own tuner may choose (the even split as ceilings).
    ``hedge``: see ``HEDGE_COST`` (1: none, at most ``MAX_SPARE``).

    Raises:
        InvalidArgument: an unknown policy (a ``ValueError``).
        ValueError: an empty budget.
    """
    check_policy(policy)
    if budget.workers < 0 or not budget.cores > 0:
        raise ValueError(f"budget {budget} needs workers >= 0 and cores > 0")
    if policy != "adaptive" or not jobs:
        return _even(jobs, budget, ceilings=policy == "guided")

    out: dict[str, WorkerDecision] = {}
    planned: list[JobView] = []
    memory = WorkerMemory.of(jobs)
    floors = _floors(jobs, budget, memory)
    # loaders never iterated: decided at their counts, which are not held (JobView.started)
    dormant = {j.job_id for j in jobs if not j.started}
    held = {j.job_id: 0 if j.job_id in dormant else j.current_workers for j in jobs}
    for job in jobs:
        low, high = bounds(job, budget)
        if job.job_id in dormant:
            count = min(max(job.current_workers, low), high)
            out[job.job_id] = WorkerDecision(
                job.job_id,
                count,
                f"not started (no loader workers yet): its {count} workers are not held against "
                "the node's budget until they run",
                placed=False,
            )
            continue
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

    counted = {j: d.num_workers for j, d in out.items() if j not in dormant}
    slots = max(budget.workers - sum(counted.values()), 0)
    # the memory the planned jobs may share: what the decided (exploring) jobs do not take
    room = budget.memory_bytes - memory.total(counted)
    if not planned:
        return out
    curves = {j.job_id: curve(j, budget, bounds(j, budget)[1]) for j in planned}
    node = ModelledNode.of(planned, curves, budget, memory)
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
    if hedge > 1.0:
        alloc, objective_new = _hedged(alloc, planned, node, slots, room, hedge, release_loss)

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


def _hedged(
    alloc: np.ndarray,
    jobs: Sequence[JobView],
    node: ModelledNode,
    slots: int,
    room: float,
    hedge: float,
    loss: float,
) -> tuple[np.ndarray, float]:
    """``alloc`` with each I/O-bound job's hedge (``HEDGE_COST``) added, job by job, as far as
    the worker budget and the memory room allow and while the node's predicted objective loses
    at most ``loss`` (spare workers' upkeep on a node whose cores are all in use); and its
    objective."""
    out = alloc.copy()
    base = float(node.objective(out[None])[0])
    for i, job in enumerate(jobs):
        assert job.model is not None  # planned jobs have one
        t_io, t_cpu = job.model.io_seconds_per_sample, job.model.cpu_seconds_per_sample
        if t_cpu > HEDGE_BUSY * (t_io + t_cpu):
            continue
        # k workers at a wait h times longer carry what k * (h t_io + t_cpu) / (t_io + t_cpu)
        # carry now (the loader's rate is k over a sample's time while its cores suffice)
        k = int(out[i])
        carry = math.ceil(k * (hedge * t_io + t_cpu) / (t_io + t_cpu) - 1e-9)
        extra = min(carry, int(node.length[i]) - 1) - k
        extra = min(extra, slots - int(out.sum()))
        while extra > 0:
            trial = out.copy()
            trial[i] += extra
            if float(node.memory_of(trial[None])[0]) <= room:
                value = float(node.objective(trial[None])[0])
                if value >= base - loss:
                    out, base = trial, value
                break
            extra -= 1
    return out, base


def fits(jobs: Sequence[JobView], budget: Budget, counts: dict[str, int]) -> bool:
    """Whether ``counts`` keep every job within its limits and the node within its worker and
    memory budgets (a growing job's new workers counted at its bound)."""
    within = all(bounds(j, budget)[0] <= counts[j.job_id] <= bounds(j, budget)[1] for j in jobs)
    return (
        within
        and sum(counts.values()) <= budget.workers
        and WorkerMemory.of(jobs).total(counts) <= budget.memory_bytes
    )


def expected(jobs: Sequence[JobView], budget: Budget, counts: dict[str, int]) -> dict[str, float]:
    """Samples/s the model expects of each job with a model at ``counts``, the node's cores
    shared as :func:`decide` shares them (a job's curve is what it does on all the cores; on a
    full node it gets less). Jobs without observations, or at a count past their curve, are
    left out."""
    known = [j for j in jobs if j.model is not None and j.model.observations]
    curves = {j.job_id: curve(j, budget, bounds(j, budget)[1]) for j in known}
    known = [j for j in known if 0 <= counts[j.job_id] < len(curves[j.job_id])]
    if not known:
        return {}
    node = ModelledNode.of(known, curves, budget)
    row = node.row(counts)
    scale = node.scale(row[None])[0]
    return {j: float(node.predicted[i, row[i]] * scale[i]) for i, j in enumerate(node.ids)}


def modelled(jobs: Sequence[JobView], budget: Budget) -> ModelledNode:
    """The node of ``jobs`` (each with a model), every count within its bounds predicted."""
    curves = {j.job_id: curve(j, budget, bounds(j, budget)[1]) for j in jobs}
    return ModelledNode.of(jobs, curves, budget)


def cpu_bound(node: ModelledNode, row: np.ndarray, budget: Budget) -> tuple[np.ndarray, bool]:
    """At the allocation ``row``: which jobs' workers are CPU-bound (each demands
    ``CPU_BOUND_WORKER`` cores or more), and whether the node's predicted CPU demand exceeds
    its cores."""
    demand, _ = node.shares(row[None])
    n = len(node.ids)
    bound = demand[0, :n] >= CPU_BOUND_WORKER * np.maximum(row, 1)
    return bound, bool(demand.sum() > budget.cores)


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
    node = modelled(jobs, budget)
    row = node.row(current)
    if not node.valid(row[None])[0]:
        return False
    bound, full = cpu_bound(node, row, budget)
    return full and bool(((node.row(proposed) > row) & bound).any())
