"""The elastic GPU optimizer: each job's GPU count and batch size, by dynamic programming.

After Saxena et al., "Effective Elastic Scaling of Deep Learning Workloads" (MASCOTS 2020), with
two additions: statistical efficiency (goodput, as in Pollux) and restart costs. Pure code: plain
values in, plain values out (no I/O, no clock).

**Value of a job.** Job ``j`` on ``k`` GPUs with global batch ``b`` runs at ``X_j(k, b)``
samples/s (the predictor's scaling model); ``E_j(b)`` is its statistical efficiency (1 when the
objective is throughput). Its speedup over its own best one-GPU configuration is::

    s_j(k, b) = X_j(k, b) * E_j(b) / max_b' X_j(1, b') * E_j(b')

and its value on ``k`` GPUs is ``v_j(k) = w_j * U(r_j(k) * p_j(k) * max_b s_j(k, b))`` with
``w_j`` its priority, ``r_j(k)`` the share of its speedup a restart leaves it when ``k`` differs
from the count it runs on now (else 1): ``1 - R_j / H`` by default (a restart costs ``R_j``
seconds of a horizon of ``H`` seconds), or the job's own ``restart_factor`` (the policies pass
Pollux's ``max(age - restarts * R, 0) / (age + R)``), and ``p_j(k)`` the share of the compact
placement's speedup that the placement it would really get reaches (``placed``; 1 by default).
Speedups make jobs of different sizes comparable: summing raw samples/s would hand every GPU
to the job with the cheapest samples.
The utility ``U`` is a power with exponent ``p`` (``fairness``): ``U(s) = s`` for ``p = 1``, the
total speedup (the paper's objective); ``U(s) = log s`` for ``p = 0``, proportional fairness, which
stops a job that scales well from starving the others; ``U(s) = s**p / p`` otherwise.

**Recurrence.** With ``F_j(c)`` the best total value of jobs ``1..j`` on at most ``c`` GPUs::

    F_0(c) = 0                                              for c = 0..C
    F_j(c) = max over k in K_j, k <= c of  F_{j-1}(c - k) + v_j(k)

``K_j`` holds job ``j``'s candidate counts in ``[min_j, max_j]``: every count up to two nodes'
worth, then a geometric ladder of whole nodes, plus its current count. ``F_J(C)`` is the answer;
walking the stored arg-maxes back from ``c = C`` recovers each ``k``, and each job's batch is the
arg-max over ``b`` at that ``k``. Jobs enter in arrival order and only while the sum of their
minimums fits (:func:`admit`), so every admitted job gets at least its minimum and the rest wait
in order. Cost ``O(J * C * |K|)``, the inner maximum vectorised with numpy.

A move is made only where the DP finds it worth its restart: keeping ``k`` is worth ``v`` for the
whole horizon, changing it is worth the new speedup for ``H - R`` seconds of it.

:func:`place` then packs the counts onto nodes: jobs whose count is unchanged keep their GPUs,
the others go largest first onto whole free nodes, then the best-fitting single node, and are
split across nodes only when no node has room.

**Placement-aware allocation** (the change for #15). ``s_j(k, b)`` assumes a compact placement
(``ceil(k / node)`` nodes), but the free GPUs may be fragmented and :func:`place` then spreads
the job over more nodes, where it synchronises over the network and runs slower. The policy
(:class:`dloader.allocator.policies.DpPolicy`) therefore decides, places, and for every job that
the placement spreads sets ``p_j(k)`` to what its model predicts for that spread placement over
the compact one, then runs the DP again with those values (twice at most): a count that would
be spread is chosen only when it is still worth it, or another count (often one that fits on a
node) wins. A running job already spread is moved onto fewer nodes (``repack``) when its model
says the spread placement keeps less than a restart would, and only if the free GPUs allow it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dloader.errors import AllocatorError

__all__ = [
    "DEFAULT_HORIZON_S",
    "DEFAULT_RESTART_S",
    "Assignment",
    "Cluster",
    "Objective",
    "OptimizerJob",
    "Plan",
    "admit",
    "candidate_counts",
    "optimize",
    "place",
]

#: Seconds a change of a job's GPU count costs (checkpoint, restart, resume), when not stated.
DEFAULT_RESTART_S = 30.0
#: Seconds over which a restart is amortised (see the module docstring).
DEFAULT_HORIZON_S = 900.0

ThroughputFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``(gpus, global_batch) -> samples/s``, broadcasting; NaN or <= 0 where infeasible."""
EfficiencyFn = Callable[[np.ndarray], np.ndarray]
"""``global_batch -> statistical efficiency`` in (0, 1]."""
Objective = Literal["throughput", "goodput"]

_TIE = 1e-9  # a nudge so that ties keep the current count


@dataclass(frozen=True)
class Cluster:
    """GPUs per node, one entry per node."""

    nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.nodes or any(n < 1 for n in self.nodes):
            raise AllocatorError(f"nodes={self.nodes!r}: need >= 1 node, each with >= 1 GPU")

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int) -> Cluster:
        """``num_nodes`` nodes of ``gpus_per_node`` GPUs."""
        if num_nodes < 1 or gpus_per_node < 1:
            raise AllocatorError(f"{num_nodes=} and {gpus_per_node=} must both be >= 1")
        return cls((gpus_per_node,) * num_nodes)

    @property
    def capacity(self) -> int:
        """Total GPUs."""
        return sum(self.nodes)

    @property
    def gpus_per_node(self) -> int:
        """The largest node's GPUs (the packing unit the candidate counts follow)."""
        return max(self.nodes)


@dataclass(frozen=True)
class OptimizerJob:
    """One job as the optimizer sees it."""

    job_id: str
    throughput: ThroughputFn = field(repr=False)
    """Predicted samples/s over (GPUs, global batch size), assuming a compact placement."""
    batch_sizes: tuple[int, ...]
    """The global batch sizes the job accepts (one entry: the batch size is fixed)."""
    min_gpus: int = 1
    max_gpus: int = 1 << 20
    efficiency: EfficiencyFn | None = field(default=None, repr=False)
    """Statistical efficiency over the global batch (used by the ``goodput`` objective)."""
    priority: float = 1.0
    current_gpus: int = 0
    """GPUs it runs on now (0: waiting)."""
    current_batch: int | None = None
    restart_s: float = DEFAULT_RESTART_S
    """Seconds a change of GPU count costs (checkpoint, restart, resume)."""
    restart_factor: float | None = None
    """Share of the speedup a change keeps (None: ``1 - restart_s / horizon``)."""
    placed: Mapping[int, float] = field(default_factory=dict, repr=False)
    """Per GPU count: the share of the compact placement's speedup that the placement the job
    would really get reaches (counts absent: 1, compact)."""

    def restart_keep(self, horizon_s: float) -> float:
        """The share of its speedup a change of GPU count leaves it (``r_j`` above)."""
        if self.restart_factor is not None:
            return self.restart_factor
        return 1.0 - min(self.restart_s / horizon_s, 1.0)

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise AllocatorError(
                f"job {self.job_id!r}: batch_sizes={self.batch_sizes!r} must be >= 1 and non-empty"
            )
        if not 1 <= self.min_gpus <= self.max_gpus:
            raise AllocatorError(
                f"job {self.job_id!r}: need 1 <= min_gpus <= max_gpus, "
                f"got min_gpus={self.min_gpus}, max_gpus={self.max_gpus}"
            )
        if not self.priority > 0:
            raise AllocatorError(f"job {self.job_id!r}: priority={self.priority} must be > 0")
        if self.current_gpus < 0 or self.restart_s < 0:
            raise AllocatorError(
                f"job {self.job_id!r}: current_gpus={self.current_gpus} and "
                f"restart_s={self.restart_s} must be >= 0"
            )


@dataclass(frozen=True)
class Assignment:
    """One job's share: its GPU count, batch size and why."""

    gpus: int
    batch_size: int
    speedup: float
    """Predicted (good)put over its best one-GPU configuration."""
    reason: str


@dataclass(frozen=True)
class Plan:
    """The optimizer's answer."""

    assignments: dict[str, Assignment]
    """Admitted jobs (every one with at least its minimum)."""
    waiting: tuple[str, ...]
    """Jobs that did not fit, in arrival order."""
    value: float
    """Total weighted utility of the speedups (restart costs included)."""


@functools.lru_cache(maxsize=4096)
def candidate_counts(lo: int, hi: int, per_node: int, current: int = 0) -> np.ndarray:
    """GPU counts a job may get: all up to two nodes, then whole nodes growing ~25% a rung.

    The returned array is shared (cached): do not modify it.
    """
    counts = set(range(lo, min(hi, 2 * per_node) + 1))
    k = 2 * per_node
    while k < hi:
        k = max(k + per_node, math.ceil(k * 1.25 / per_node) * per_node)
        if k >= lo:
            counts.add(min(k, hi))
    counts.update((lo, hi))
    if lo <= current <= hi:
        counts.add(current)
    out = np.array(sorted(counts), dtype=np.int64)
    out.flags.writeable = False
    return out


def admit(
    jobs: Sequence[OptimizerJob], capacity: int
) -> tuple[list[OptimizerJob], list[OptimizerJob]]:
    """Splits jobs (in arrival order) into admitted and waiting: the longest prefix that fits.

    A job keeps its place in line: once one does not fit, the ones behind it wait too.
    """
    used = 0
    for i, job in enumerate(jobs):
        if used + job.min_gpus > capacity:
            return list(jobs[:i]), list(jobs[i:])
        used += job.min_gpus
    return list(jobs), []


@dataclass
class _Table:
    counts: np.ndarray  # candidate k
    values: np.ndarray  # v_j(k), -inf where infeasible
    speedups: np.ndarray  # max_b s_j(k, b)
    batches: np.ndarray  # arg-max b per k


def _utility(u: np.ndarray, power: float) -> np.ndarray:
    u = np.maximum(u, 1e-12)
    if power == 1:
        return u
    return np.log(u) if power == 0 else u**power / power


def _table(
    job: OptimizerJob,
    capacity: int,
    per_node: int,
    objective: Objective,
    horizon_s: float,
    power: float,
) -> _Table:
    hi = min(job.max_gpus, capacity)
    counts = candidate_counts(job.min_gpus, hi, per_node, job.current_gpus)
    batches = np.asarray(job.batch_sizes, dtype=float)
    eff = (
        np.asarray(job.efficiency(batches), dtype=float)
        if objective == "goodput" and job.efficiency is not None
        else np.ones_like(batches)
    )
    # one evaluation for the candidates and the one-GPU reference (row 0)
    rows = np.concatenate(([1], counts)).astype(float)
    grid = np.asarray(job.throughput(rows[:, None], batches[None, :]), dtype=float)
    grid = np.where(np.isfinite(grid) & (grid > 0), grid, 0.0) * eff
    one, good = grid[0], grid[1:]
    ref = one.max() if one.max() > 0 else good[0].max()
    if not ref > 0:
        raise AllocatorError(
            f"job {job.job_id!r}: predicted throughput is 0 at every candidate "
            f"(gpus {counts.tolist()}, batch sizes {list(job.batch_sizes)})"
        )
    best = good.argmax(axis=1)
    speedups = good[np.arange(len(counts)), best] / ref
    if job.placed:
        speedups = speedups * np.array([job.placed.get(int(k), 1.0) for k in counts])
    keep = job.restart_keep(horizon_s)
    factor = np.where((job.current_gpus > 0) & (counts != job.current_gpus), keep, 1.0 + _TIE)
    values = np.where(speedups > 0, job.priority * _utility(speedups * factor, power), -np.inf)
    return _Table(counts, values, speedups, batches[best].astype(np.int64))


def _reason(job: OptimizerJob, a_gpus: int, a_batch: int, speedup: float, objective: str) -> str:
    what = f"{a_gpus} GPU(s) x batch {a_batch}: predicted {objective} speedup {speedup:.2f}"
    if job.current_gpus == 0:
        return f"start on {what}"
    if a_gpus == job.current_gpus:
        change = "" if job.current_batch in (None, a_batch) else f" (batch {job.current_batch}->)"
        return f"keep {what}{change}"
    return (
        f"{'grow' if a_gpus > job.current_gpus else 'shrink'} {job.current_gpus}->{what}; "
        f"worth the {job.restart_s:.0f} s restart"
    )


def optimize(
    jobs: Sequence[OptimizerJob],
    cluster: Cluster,
    *,
    objective: Objective = "goodput",
    horizon_s: float = DEFAULT_HORIZON_S,
    fairness: float = 1.0,
) -> Plan:
    """Chooses GPU counts and batch sizes maximising the total (good)put speedup.

    Args:
        jobs: active jobs in arrival order (running ones included, with their current counts).
        cluster: the GPUs available to these jobs.
        objective: ``"throughput"`` (Saxena et al.) or ``"goodput"`` (throughput times
            statistical efficiency; jobs without an efficiency function count as 1).
        horizon_s: how far ahead a restart is amortised (see the module docstring).
        fairness: the utility exponent ``p`` (<= 1): 1 maximises the total speedup, 0 the sum
            of log speedups (proportional fairness).

    Returns:
        A :class:`Plan`; place it on nodes with :func:`place`.
    """
    if objective not in ("throughput", "goodput"):
        raise AllocatorError(f"objective={objective!r}: expected 'throughput' or 'goodput'")
    if not horizon_s > 0:
        raise AllocatorError(f"horizon_s={horizon_s} must be > 0")
    if not fairness <= 1:
        raise AllocatorError(f"fairness={fairness} must be <= 1 (1: total speedup, 0: log)")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise AllocatorError(f"duplicate job ids in {ids}")
    capacity = cluster.capacity
    admitted, waiting = admit(jobs, capacity)
    # every admitted job gets at least its fewest GPUs: none can get more than its fewest plus
    # the GPUs the others' fewest leave (on a full cluster, exactly its fewest)
    fewest = [j.min_gpus for j in admitted]  # each table's smallest candidate count
    slack = capacity - sum(fewest)
    tables = [
        _table(j, j.min_gpus + slack, cluster.gpus_per_node, objective, horizon_s, fairness)
        for j in admitted
    ]

    # best[c]: the best value of the jobs so far on at most c GPUs. Every admitted job gets at
    # least its fewest GPUs, so after job i only c in [its and the earlier jobs' fewest,
    # capacity - the later jobs' fewest] can lie on an optimal path: the DP fills that window.
    lo, hi = 0, slack
    best = np.zeros(capacity + 1)
    choices = np.zeros((len(tables), capacity + 1), dtype=np.int32)
    for i, t in enumerate(tables):
        prev_lo = lo
        lo, hi = lo + fewest[i], hi + fewest[i]
        cs = np.arange(lo, hi + 1)
        rest = cs[:, None] - t.counts[None, :]  # <= the previous window's top, as counts >= fewest
        cand = np.where(
            rest >= prev_lo, best[np.maximum(rest, prev_lo)] + t.values[None, :], -np.inf
        )
        choice = cand.argmax(axis=1)
        best = np.full(capacity + 1, -np.inf)
        best[lo : hi + 1] = cand[np.arange(len(cs)), choice]
        choices[i, lo : hi + 1] = choice
    if admitted and not np.isfinite(best[capacity]):
        raise AllocatorError(
            f"no feasible allocation for {len(admitted)} admitted jobs on {capacity} GPUs "
            "(a job has no candidate count with positive predicted throughput)"
        )

    assignments: dict[str, Assignment] = {}
    c = capacity
    for i in range(len(tables) - 1, -1, -1):
        t, job = tables[i], admitted[i]
        pick = int(choices[i, c])
        k, b = int(t.counts[pick]), int(t.batches[pick])
        s = float(t.speedups[pick])
        assignments[job.job_id] = Assignment(k, b, s, _reason(job, k, b, s, objective))
        c -= k
    ordered = {j.job_id: assignments[j.job_id] for j in admitted}
    return Plan(ordered, tuple(j.job_id for j in waiting), float(best[capacity]) if tables else 0.0)


def _compact(k: int, free: list[int], nodes: Sequence[int]) -> list[int] | None:
    """GPUs per node for ``k`` GPUs on whole free nodes plus one node for the rest (the
    best-fitting), or None when the free GPUs do not allow it."""
    share = [0] * len(free)
    need = k
    for n, f in enumerate(free):
        if need >= nodes[n] and f == nodes[n]:
            share[n], need = f, need - f
    if need:
        fits = [n for n, f in enumerate(free) if f - share[n] >= need]
        if not fits:
            return None
        n = min(fits, key=lambda n: (free[n] - share[n], n))
        share[n] += need
    return share


def place(
    counts: Mapping[str, int],
    cluster: Cluster,
    current: Mapping[str, Sequence[int]] | None = None,
    repack: Collection[str] = (),
) -> dict[str, tuple[int, ...]]:
    """Packs GPU counts onto nodes; returns each job's GPUs per node (one entry per node).

    Args:
        counts: GPUs per job (jobs with 0 get no entry in the result).
        cluster: the nodes.
        current: jobs' present placements (GPUs per node); a job whose count is unchanged keeps
            its placement.
        repack: jobs whose count is unchanged but whose placement is spread over more nodes
            than needed: each moves to a compact placement when the GPUs left free (and its
            own) allow one, else keeps its placement.
    """
    current = current or {}
    total = sum(counts.values())
    if total > cluster.capacity or any(k < 0 for k in counts.values()):
        raise AllocatorError(f"cannot place {total} GPUs on a cluster of {cluster.capacity}")
    free = list(cluster.nodes)
    out: dict[str, tuple[int, ...]] = {}
    moving = []
    for job, k in counts.items():
        now = current.get(job)
        keep = now is not None and len(now) == len(free) and sum(now) == k > 0
        if keep and all(n <= f for n, f in zip(now, free, strict=True)):  # type: ignore[arg-type]
            out[job] = tuple(now)  # type: ignore[arg-type]
            free = [f - n for f, n in zip(free, now, strict=True)]  # type: ignore[arg-type]
            continue
        if k > 0:
            moving.append((k, job))
    for k, job in sorted(moving, key=lambda kj: (-kj[0], kj[1])):
        # whole free nodes for the multi-node part, the best-fitting node for the rest
        compact = _compact(k, free, cluster.nodes)
        if compact is not None:
            out[job] = tuple(compact)
            free = [f - n for f, n in zip(free, compact, strict=True)]
            continue
        # else spread: whole free nodes first, then the freest nodes
        share = [0] * len(free)
        need = k
        for n, f in enumerate(free):
            if need >= cluster.nodes[n] and f == cluster.nodes[n]:
                share[n], free[n], need = f, 0, need - f
        for n in sorted(range(len(free)), key=lambda n: (-free[n], n)):
            if not need:
                break
            take = min(free[n], need)
            share[n] += take
            free[n] -= take
            need -= take
        out[job] = tuple(share)
    for job in sorted(repack, key=lambda j: (-counts.get(j, 0), j)):
        now = out.get(job)
        if now is None or job not in current or tuple(current[job]) != now:
            continue
        mine = [f + n for f, n in zip(free, now, strict=True)]
        packed = _compact(sum(now), mine, cluster.nodes)
        if packed is not None and sum(1 for g in packed if g) < sum(1 for g in now if g):
            out[job] = tuple(packed)
            free = [f - n for f, n in zip(mine, packed, strict=True)]
    return out
