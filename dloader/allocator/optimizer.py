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
arg-max over ``b`` at that ``k``. Jobs enter in the order given (the policy's line: arrival,
or attained service) and only while the sum of their minimums fits (:func:`admit`), so every
admitted job gets at least its minimum and the rest wait in order. Cost ``O(J * C * |K|)``, the
inner maximum vectorised with numpy (one strided gather per job), and every job's table
evaluated in one broadcast where its throughput function allows (``evaluate_many``, see
:data:`ThroughputFn`).

A move is made only where the DP finds it worth its restart: keeping ``k`` is worth ``v`` for the
whole horizon, changing it is worth the new speedup for ``H - R`` seconds of it.

:func:`place` then packs the counts onto nodes: jobs whose count is unchanged keep their GPUs,
the others go largest first onto whole free nodes, then the best-fitting single node, and are
split across nodes only when no node has room.

**Placement-aware allocation** (the change for #15). ``s_j(k, b)`` assumes a compact placement
(``ceil(k / node)`` nodes), but the free GPUs may be fragmented and :func:`place` then spreads
the job over more nodes, where it synchronises over the network and runs slower. The policy
(:class:`dloader.allocator.policies.dp.DpPolicy`) therefore decides, places, and for every job that
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
    "POOL_COST_S_PER_MB",
    "POOL_EFFICIENCY",
    "Assignment",
    "Cluster",
    "Objective",
    "OptimizerJob",
    "Plan",
    "admit",
    "candidate_counts",
    "optimize",
    "padded_batches",
    "place",
    "throughput_grid",
]

#: Seconds a change of a job's GPU count costs (checkpoint, restart, resume), when not stated.
DEFAULT_RESTART_S = 30.0
#: Seconds over which a restart is amortised (see the module docstring).
DEFAULT_HORIZON_S = 900.0

ThroughputFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``(gpus, global_batch) -> samples/s``, broadcasting; NaN or <= 0 where infeasible.

One may also have an ``evaluate_many(fns, gpus, batches)`` attribute (e.g.
:class:`dloader.allocator.policies.throughput.ScalingThroughput`): the optimizer then evaluates
every job's function of that kind in one call,
``out[j, i, m] = fns[j](gpus[j, i], batches[j, m])``."""
EfficiencyFn = Callable[[np.ndarray], np.ndarray]
"""``global_batch -> statistical efficiency`` in (0, 1]."""
Objective = Literal["throughput", "goodput"]

_TIE = 1e-9  # a nudge so that ties keep the current count


#: What a core of a CPU pool feeds (remote loader workers, Ray) as a share of a core on the job's
#: own node, for samples of a few bytes: ``benchmarks/loader/bench_remote.py`` measured 0.87 (a
#: CPU-bound pipeline on one local core gained 0.87 of its samples/s from one remote core).
POOL_EFFICIENCY = 0.87
#: Seconds of the job's own node's CPU per MB of batches its remote workers send (receiving,
#: copying into the trainer's shared memory): 2.4 ms/MB measured by ``bench_remote``.
POOL_COST_S_PER_MB = 0.0024


@dataclass(frozen=True)
class Cluster:
    """The nodes: GPUs per node, one entry per node, and each node's further resources.

    A further per-node resource is one more tuple of the same length (``cpus`` today; host
    memory or a GPU type would join the same way): None means the resource never limits."""

    nodes: tuple[int, ...]
    cpus: tuple[float, ...] | None = None
    """CPU cores per node for the jobs' input pipelines (None: unlimited)."""
    pool: float = 0.0
    """CPU cores of a pool of CPU-only nodes, where jobs' loader workers may run remotely
    (Ray; 0: none). Only with ``cpus``: where cores are unlimited nothing needs them."""
    pool_efficiency: float = 1.0
    """What a pool core feeds, as a share of what a core on the job's own node feeds (the
    transfer's cost; measured by ``benchmarks/loader/bench_remote.py``)."""
    lends: tuple[bool, ...] | None = None
    """Per node: whether it may lend its spare cores to other nodes' jobs (its Ray node hosts
    their remote workers); None: every node may (the simulator)."""

    def __post_init__(self) -> None:
        if not self.nodes or any(n < 1 for n in self.nodes):
            raise AllocatorError(f"nodes={self.nodes!r}: need >= 1 node, each with >= 1 GPU")
        if not (math.isfinite(self.pool) and self.pool >= 0) or not (0 < self.pool_efficiency <= 1):
            raise AllocatorError(
                f"pool={self.pool!r}, pool_efficiency={self.pool_efficiency!r}: expected a "
                "pool of >= 0 cores fed at an efficiency in (0, 1]"
            )
        if self.lends is not None and len(self.lends) != len(self.nodes):
            raise AllocatorError(f"lends={self.lends!r}: expected one per node")
        if self.cpus is not None and (
            len(self.cpus) != len(self.nodes)
            or not all(math.isfinite(c) and c > 0 for c in self.cpus)
        ):
            raise AllocatorError(
                f"cpus={self.cpus!r}: expected one finite number > 0 per node "
                f"({len(self.nodes)} nodes)"
            )

    @classmethod
    def uniform(
        cls, num_nodes: int, gpus_per_node: int, cpus_per_node: float | None = None
    ) -> Cluster:
        """``num_nodes`` nodes of ``gpus_per_node`` GPUs (and ``cpus_per_node`` cores)."""
        if num_nodes < 1 or gpus_per_node < 1:
            raise AllocatorError(f"{num_nodes=} and {gpus_per_node=} must both be >= 1")
        cpus = None if cpus_per_node is None else (float(cpus_per_node),) * num_nodes
        return cls((gpus_per_node,) * num_nodes, cpus)

    @functools.cached_property
    def capacity(self) -> int:
        """Total GPUs."""
        return sum(self.nodes)

    @functools.cached_property
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
    feed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = field(default=None, repr=False)
    """What the job's input pipeline lets through of a table of samples/s (one row per GPU
    count of the first argument) on the cores it would get (None: all of it): applied to every
    throughput the job is valued at."""

    def restart_keep(self, horizon_s: float) -> float:
        """The share of its speedup a change of GPU count leaves it (``r_j`` above)."""
        if self.restart_factor is not None:
            return self.restart_factor
        return 1.0 - min(self.restart_s / horizon_s, 1.0)

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
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
    """Jobs that did not fit, in the order they were given."""
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
    """Splits jobs (in the order given: the policy's line) into admitted and waiting: the
    longest prefix that fits.

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


def padded_batches(jobs: Sequence[OptimizerJob]) -> np.ndarray:
    """Each job's batch sizes, a row per job, padded to the longest by repeating its last."""
    out = np.empty((len(jobs), max((len(j.batch_sizes) for j in jobs), default=0)))
    for i, job in enumerate(jobs):
        n = len(job.batch_sizes)
        out[i, :n] = job.batch_sizes
        out[i, n:] = job.batch_sizes[-1]
    return out


def throughput_grid(
    jobs: Sequence[OptimizerJob], gpus: np.ndarray, batches: np.ndarray
) -> np.ndarray:
    """``out[j, i, m]``: job j's predicted samples/s on ``gpus[j, i]`` at ``batches[j, m]``.

    Throughput functions with an ``evaluate_many`` (:data:`ThroughputFn`) are evaluated together,
    one broadcast per kind; the others one job at a time."""
    out = np.empty((len(jobs), gpus.shape[1], batches.shape[1]))
    kinds: dict[object, list[int]] = {}
    for i, job in enumerate(jobs):
        kinds.setdefault(getattr(job.throughput, "evaluate_many", None), []).append(i)
    for many, rows in kinds.items():
        if many is not None:
            fns = [jobs[i].throughput for i in rows]
            out[rows] = many(fns, gpus[rows], batches[rows])  # type: ignore[operator]
            continue
        for i in rows:
            out[i] = jobs[i].throughput(gpus[i][:, None], batches[i][None, :])
    return out


def _tables(
    jobs: Sequence[OptimizerJob],
    slack: int,
    per_node: int,
    objective: Objective,
    horizon_s: float,
    power: float,
) -> list[_Table]:
    """Each job's value table over its candidate counts (up to its fewest plus ``slack``), all
    jobs in one padded array (the candidate counts and batch sizes repeat their last entry)."""
    if not jobs:
        return []
    counts = [
        candidate_counts(j.min_gpus, min(j.max_gpus, j.min_gpus + slack), per_node, j.current_gpus)
        for j in jobs
    ]
    n_k = 1 + max(len(c) for c in counts)
    # row 0 of each job: one GPU, the reference of its speedups
    gpus = np.empty((len(jobs), n_k))
    gpus[:, 0] = 1.0
    batches = padded_batches(jobs)
    eff = np.ones_like(batches)
    for i, (job, c) in enumerate(zip(jobs, counts, strict=True)):
        gpus[i, 1 : len(c) + 1] = c
        gpus[i, len(c) + 1 :] = c[-1]
        n = len(job.batch_sizes)
        if objective == "goodput" and job.efficiency is not None:
            eff[i, :n] = job.efficiency(batches[i, :n])
        eff[i, n:] = 0.0  # padding: never the best batch
    grid = throughput_grid(jobs, gpus, batches)
    grid = np.where(np.isfinite(grid) & (grid > 0), grid, 0.0)
    for i, job in enumerate(jobs):
        if job.feed is not None:
            grid[i] = job.feed(gpus[i], grid[i])
    grid *= eff[:, None, :]
    one, good = grid[:, 0].max(axis=1), grid[:, 1:]
    ref = np.where(one > 0, one, good[:, 0].max(axis=1))
    if not (ref > 0).all():
        i = int(np.argmin(ref > 0))
        raise AllocatorError(
            f"job {jobs[i].job_id!r}: predicted throughput is 0 at every candidate "
            f"(gpus {counts[i].tolist()}, batch sizes {list(jobs[i].batch_sizes)})"
        )
    best = good.argmax(axis=2)
    speedups = np.take_along_axis(good, best[:, :, None], axis=2)[:, :, 0] / ref[:, None]
    for i, job in enumerate(jobs):
        if job.placed:
            factors = [job.placed.get(int(k), 1.0) for k in gpus[i, 1:]]
            speedups[i] *= np.array(factors)
    current = np.array([j.current_gpus for j in jobs])[:, None]
    keep = np.array([j.restart_keep(horizon_s) for j in jobs])[:, None]
    factor = np.where((current > 0) & (gpus[:, 1:] != current), keep, 1.0 + _TIE)
    priority = np.array([j.priority for j in jobs])[:, None]
    values = np.where(speedups > 0, priority * _utility(speedups * factor, power), -np.inf)
    chosen = np.take_along_axis(batches, best, axis=1).astype(np.int64)
    return [
        _Table(c, values[i, : len(c)], speedups[i, : len(c)], chosen[i, : len(c)])
        for i, c in enumerate(counts)
    ]


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
        jobs: active jobs in the policy's line (arrival order, or attained service), running
            ones included, with their current counts.
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
    tables = _tables(admitted, slack, cluster.gpus_per_node, objective, horizon_s, fairness)

    # best[c]: the best value of the jobs so far on at most c GPUs. Every admitted job gets at
    # least its fewest GPUs, so after job i only c in [its and the earlier jobs' fewest,
    # capacity - the later jobs' fewest] can lie on an optimal path: the DP fills that window.
    # The array is stored after ``slack`` -inf entries, so that best[c - k] reads -inf for every
    # c - k below the window, negative ones included (k <= a job's fewest + slack), unmasked.
    pad = slack
    lo, hi = 0, slack
    best = np.full(pad + capacity + 1, -np.inf)
    best[pad : pad + slack + 1] = 0.0
    choices = np.zeros((len(tables), capacity + 1), dtype=np.int32)
    for i, t in enumerate(tables):
        lo, hi = lo + fewest[i], hi + fewest[i]
        top = int(t.counts[-1])
        # window[r, top - k] = best[lo + r - k]: one strided view of the previous row, whose
        # columns the candidate counts pick (one gather, no index arithmetic per cell)
        window = np.lib.stride_tricks.as_strided(
            best[pad + lo - top :],
            shape=(hi - lo + 1, top + 1),
            strides=(best.strides[0], best.strides[0]),
            writeable=False,
        )
        cand = window[:, top - t.counts]
        cand += t.values
        choice = cand.argmax(axis=1)
        best = np.full(pad + capacity + 1, -np.inf)
        best[pad + lo : pad + hi + 1] = cand[np.arange(hi - lo + 1), choice]
        choices[i, lo : hi + 1] = choice
    best = best[pad:]
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


def _whole_nodes(k: int, free: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, int]:
    """Whole free nodes, in order, for as much of ``k`` GPUs as fills them: GPUs per node, and
    the GPUs still needed."""
    share = np.zeros_like(free)
    need = k
    smallest = int(nodes.min())
    for n in np.flatnonzero(free == nodes):
        if need < smallest:
            break
        if need >= nodes[n]:
            share[n] = free[n]
            need -= int(free[n])
    return share, need


def _compact(
    k: int,
    free: np.ndarray,
    nodes: np.ndarray,
    per_gpu_cores: float = 0.0,
    free_cores: np.ndarray | None = None,
) -> np.ndarray | None:
    """GPUs per node for ``k`` GPUs on whole free nodes plus one node for the rest (the
    best-fitting), or None when the free GPUs do not allow it. With ``free_cores``, the node
    for the rest is one whose free cores cover the rest's ``per_gpu_cores`` each, where there
    is one, else one with the most free cores (so a CPU-hungry job lands beside CPU-light
    ones), the tightest fit among those."""
    share, need = _whole_nodes(k, free, nodes)
    if need:
        room = free - share
        fits = room >= need
        if free_cores is not None and per_gpu_cores > 0:
            left = free_cores - share * per_gpu_cores
            fed = fits & (left >= need * per_gpu_cores - 1e-9)
            if fed.any():
                fits = fed
            elif fits.any():  # no node feeds it whole: those with the most free cores
                fits = fits & (left >= np.where(fits, left, -np.inf).max() - 1e-9)
        room = np.where(fits, room, np.iinfo(room.dtype).max)
        fit = int(room.argmin())  # the tightest fit, the first node among equals
        if free[fit] - share[fit] < need:
            return None
        share[fit] += need
    return share


def _gpus(placement: Sequence[int]) -> np.ndarray:
    return np.fromiter(placement, dtype=np.int64, count=len(placement))


def place(
    counts: Mapping[str, int],
    cluster: Cluster,
    current: Mapping[str, Sequence[int]] | None = None,
    repack: Collection[str] = (),
    cores: Mapping[str, float] | None = None,
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
        cores: the CPU cores each job wants (with the cluster's ``cpus``): a job's part on one
            node goes where the free cores cover it, where a node allows (see ``_compact``).
    """
    current = current or {}
    total = sum(counts.values())
    if total > cluster.capacity or any(k < 0 for k in counts.values()):
        raise AllocatorError(f"cannot place {total} GPUs on a cluster of {cluster.capacity}")
    nodes = np.array(cluster.nodes, dtype=np.int64)
    free = nodes.copy()
    use_cores = cores is not None and cluster.cpus is not None
    free_cores = np.array(cluster.cpus, dtype=float) if use_cores else None
    per_gpu = {j: (cores or {}).get(j, 0.0) / max(k, 1) for j, k in counts.items()}
    out: dict[str, tuple[int, ...]] = {}
    moving = []
    for job, k in counts.items():
        now = current.get(job)
        if now is not None and len(now) == len(free) and k > 0:
            held = _gpus(now)
            if held.sum() == k and (held <= free).all():
                out[job] = tuple(now)
                free -= held
                if free_cores is not None:
                    free_cores -= held * per_gpu[job]
                continue
        if k > 0:
            moving.append((k, job))
    for k, job in sorted(moving, key=lambda kj: (-kj[0], kj[1])):
        # whole free nodes for the multi-node part, the best-fitting node for the rest
        share = _compact(k, free, nodes, per_gpu[job], free_cores)
        if share is None:
            # spread: whole free nodes first, then the freest nodes
            share, need = _whole_nodes(k, free, nodes)
            rest = free - share
            for n in np.argsort(-rest, kind="stable"):
                if not need:
                    break
                take = min(int(rest[n]), need)
                share[n] += take
                need -= take
        out[job] = tuple(share.tolist())
        free -= share
        if free_cores is not None:
            free_cores -= share * per_gpu[job]
    for job in sorted(repack, key=lambda j: (-counts.get(j, 0), j)):
        now = out.get(job)
        if now is None or job not in current or tuple(current[job]) != now:
            continue
        held = _gpus(now)
        mine = free + held
        packed = _compact(int(held.sum()), mine, nodes)
        if packed is not None and np.count_nonzero(packed) < np.count_nonzero(held):
            out[job] = tuple(packed.tolist())
            free = mine - packed
    return out
