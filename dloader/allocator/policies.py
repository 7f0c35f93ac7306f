"""Cluster scheduling policies over plain job states, shared by the simulator and the service.

* ``static``: each job gets the GPUs and batch size it asked for, first come first served; a
  running job is never changed.
* ``elastic-gpu``: the baseline of Saxena et al.: the DP rescales GPU counts, batch sizes stay
  as requested.
* ``elastic-dp``: Saxena et al.: the DP picks GPU counts and batch sizes for total throughput.
* ``goodput-dp``: ours: as ``elastic-dp``, but for goodput (throughput x statistical efficiency
  from the job's gradient-noise statistics), so it grows a batch only where that still helps; it
  maximises the sum of log speedups (proportional fairness) and may accumulate gradients.
* ``pollux``: Pollux's own policy, from its paper, for comparison in the same simulator
  (:mod:`dloader.allocator.pollux_policy`).

The paper's two policies keep every local batch within GPU memory (no gradient accumulation), as
in its model; so a fixed-batch job needs at least ``batch / largest local batch`` GPUs.

Throughput predictions come from each job's :class:`dloader.predictor.ScalingModel`, with gradient
accumulation where a local batch exceeds what a GPU holds (see :func:`throughput_fn`). A model
learned online (``JobState.explored_gpus`` set) is trusted up to twice the GPUs it has measured,
so a job grows 1, 2, 4, ... GPUs as its measurements come in (Pollux's exploration).

The DP policies are placement-aware (a count the placer would spread over more nodes than it
needs is charged what the spread placement delivers; see :mod:`dloader.allocator.optimizer`;
a model learned online that has never measured a step across nodes cannot price that, so such a
job is not spread by choice: ``JobState.explored_nodes``) and
weigh a restart by the job's age and restart count as Pollux does (``restart_model="age"``;
``"horizon"``: a fixed share for every job).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

import numpy as np

from dloader.allocator.optimizer import (
    DEFAULT_HORIZON_S,
    DEFAULT_RESTART_S,
    Cluster,
    Objective,
    OptimizerJob,
    Plan,
    optimize,
    place,
)
from dloader.errors import AllocatorError
from dloader.predictor import GradientNoise, ScalingModel, ScalingStack

__all__ = [
    "POLICIES",
    "ClusterDecision",
    "DpPolicy",
    "JobState",
    "Policy",
    "ScalingThroughput",
    "StaticPolicy",
    "batch_grid",
    "make_policy",
    "placed_throughput",
    "throughput_fn",
]


#: Jobs x GPUs above which a decision does not re-plan for spread placements (its rounds would
#: triple the DP's time; at 2,048 GPUs one DP of 1,000 jobs takes ~0.13 s on a 2-core machine).
REPLAN_MAX_SIZE = 500_000

RestartModel = Literal["age", "horizon"]


@dataclass(frozen=True)
class JobState:
    """A job as the policies see it: its limits, its models and what it runs on now."""

    job_id: str
    arrival: float
    """Submission time in seconds (orders the queue)."""
    model: ScalingModel = field(repr=False)
    requested_gpus: int
    requested_batch: int
    batch_range: tuple[int, int]
    """Smallest and largest global batch size the job accepts."""
    local_bsz_range: tuple[int, int]
    """Smallest and largest per-GPU batch; above the largest, gradients are accumulated."""
    min_gpus: int = 1
    max_gpus: int = 1 << 20
    noise: GradientNoise | None = field(default=None, repr=False)
    """Latest gradient-noise statistics (for ``goodput-dp``)."""
    priority: float = 1.0
    placement: tuple[int, ...] = ()
    """GPUs per node it holds now (empty: waiting)."""
    batch_size: int | None = None
    """Global batch it runs with now."""
    restart_s: float = DEFAULT_RESTART_S
    age_s: float | None = None
    """Seconds since submission (None: unknown; the restart cost is then amortised over the
    policy's horizon)."""
    restarts: int = 0
    """Times its placement changed after its first start."""
    explored_gpus: int | None = None
    """The most GPUs its model has seen measurements for, when the model is learned online: it
    may then get at most twice that (None: the model is trusted everywhere)."""
    explored_nodes: int | None = None
    """The most nodes its model has seen one step span, when learned online (None: trusted
    everywhere). A model that has only seen one node cannot price a spread placement."""
    attained_gpu_s: float = 0.0
    """GPU-seconds it has held so far (``pollux`` serves the least-served first)."""

    def __post_init__(self) -> None:
        lo, hi = self.batch_range
        if not 1 <= lo <= hi:
            raise AllocatorError(f"job {self.job_id!r}: batch_range={self.batch_range} invalid")
        llo, lhi = self.local_bsz_range
        if not 1 <= llo <= lhi:
            raise AllocatorError(
                f"job {self.job_id!r}: local_bsz_range={self.local_bsz_range} invalid"
            )
        if not self.attained_gpu_s >= 0:
            raise AllocatorError(
                f"job {self.job_id!r}: attained_gpu_s={self.attained_gpu_s} must be >= 0"
            )
        if self.requested_gpus < 1 or self.requested_batch < 1:
            raise AllocatorError(
                f"job {self.job_id!r}: requested_gpus={self.requested_gpus} and "
                f"requested_batch={self.requested_batch} must be >= 1"
            )

    @property
    def gpus(self) -> int:
        """GPUs it holds now."""
        return sum(self.placement)


@dataclass(frozen=True)
class ClusterDecision:
    """A policy's answer for every active job."""

    placements: dict[str, tuple[int, ...]]
    """GPUs per node for each job that runs (jobs absent here wait)."""
    batch_sizes: dict[str, int]
    reasons: dict[str, str]
    waiting: tuple[str, ...]


class Policy(Protocol):
    """Decides placements and batch sizes for the active jobs (in arrival order)."""

    name: str

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        """The new placements and batch sizes."""
        ...


def throughput_fn(
    model: ScalingModel,
    gpus_per_node: int,
    local_bsz_range: tuple[int, int],
    *,
    accumulate: bool = True,
) -> ScalingThroughput:
    """Samples/s over (GPUs, global batch) from a scaling model, on ``ceil(k / node)`` nodes.

    A local batch ``b / k`` above the largest per-GPU batch is split into ``a`` micro-batches of
    equal size, the step then costs ``(a - 1)`` extra computations (infeasible, NaN, unless
    ``accumulate``); a local batch below the smallest is infeasible.
    """
    return ScalingThroughput(model, gpus_per_node, local_bsz_range, accumulate)


@dataclass(frozen=True, eq=False)
class ScalingThroughput:
    """:func:`throughput_fn`'s function; the optimizer evaluates many at once
    (:meth:`evaluate_many`)."""

    model: ScalingModel
    gpus_per_node: int
    local_bsz_range: tuple[int, int]
    accumulate: bool = True

    def __call__(self, gpus: np.ndarray, batch: np.ndarray) -> np.ndarray:
        k = np.asarray(gpus, dtype=float)
        nodes = np.ceil(k / self.gpus_per_node)
        return placed_throughput(
            self.model, nodes, k, batch, self.local_bsz_range, accumulate=self.accumulate
        )

    @staticmethod
    def evaluate_many(
        fns: Sequence[ScalingThroughput], gpus: np.ndarray, batch: np.ndarray
    ) -> np.ndarray:
        """``out[j, i, m] = fns[j](gpus[j, i], batch[j, m])``, in one broadcast."""
        per = np.array([f.gpus_per_node for f in fns], dtype=float)[:, None, None]
        lo, hi = np.array([f.local_bsz_range for f in fns], dtype=float).T[:, :, None, None]
        most = np.array([math.inf if f.accumulate else 1.0 for f in fns])[:, None, None]
        k = np.asarray(gpus, dtype=float)[:, :, None]
        b = np.asarray(batch, dtype=float)[:, None, :]
        stack = ScalingStack([f.model for f in fns])
        return _placed(stack, np.ceil(k / per), k, b, lo, hi, most)


def placed_throughput(
    model: ScalingModel,
    nodes: np.ndarray,
    gpus: np.ndarray,
    batch: np.ndarray,
    local_bsz_range: tuple[int, int],
    *,
    accumulate: bool = True,
) -> np.ndarray:
    """Samples/s of ``gpus`` GPUs over ``nodes`` nodes at global batch ``batch``, broadcasting
    (the accumulation rule of :func:`throughput_fn`; NaN where infeasible)."""
    lo, hi = local_bsz_range
    return _placed(model, nodes, gpus, batch, lo, hi, math.inf if accumulate else 1.0)


def _placed(
    model: ScalingModel | ScalingStack,
    nodes: np.ndarray,
    gpus: np.ndarray,
    batch: np.ndarray,
    lo: float | np.ndarray,
    hi: float | np.ndarray,
    most: float | np.ndarray,
) -> np.ndarray:
    k = np.asarray(gpus, dtype=float)
    b = np.asarray(batch, dtype=float)
    local = b / k
    accum = np.maximum(np.ceil(local / hi - 1e-9), 1.0)
    micro = local / accum
    step = model.step_times(nodes, k, micro) + (accum - 1.0) * model.compute_times(micro)
    return np.where((micro >= lo * (1 - 1e-9)) & (accum <= most), b / step, np.nan)


def batch_grid(lo: int, hi: int, n: int = 12, extra: Sequence[int] = ()) -> tuple[int, ...]:
    """``n`` global batch sizes spaced geometrically over ``[lo, hi]``, plus ``extra`` in range."""
    if not 1 <= lo <= hi:
        raise AllocatorError(f"batch range [{lo}, {hi}] is invalid")
    grid = _geometric(lo, hi, n)
    if all(b in grid or not lo <= b <= hi for b in extra):
        return grid
    return tuple(sorted({*grid, *(b for b in extra if lo <= b <= hi)}))


@functools.lru_cache(maxsize=1024)
def _geometric(lo: int, hi: int, n: int) -> tuple[int, ...]:
    return tuple(sorted({round(x) for x in np.geomspace(lo, hi, n)})) if hi > lo else (lo,)


def _held(jobs: Sequence[JobState]) -> dict[str, tuple[int, ...]]:
    return {j.job_id: j.placement for j in jobs if j.placement}


class StaticPolicy:
    """Requested GPUs and batch size, strict FIFO; running jobs are left alone."""

    name = "static"

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        counts = {j.job_id: j.gpus for j in jobs if j.placement}
        free = cluster.capacity - sum(counts.values())
        waiting: list[str] = []
        reasons: dict[str, str] = {}
        for j in jobs:
            if j.placement:
                continue
            need = min(j.requested_gpus, cluster.capacity)
            if not waiting and need <= free:
                counts[j.job_id] = need
                free -= need
                reasons[j.job_id] = f"start on the requested {need} GPU(s)"
            else:
                waiting.append(j.job_id)
                reasons[j.job_id] = (
                    f"waiting, {len(waiting)} in line: needs {need} GPU(s), {free} free"
                )
        placements = place(counts, cluster, _held(jobs))
        requested = {j.job_id: j.requested_batch for j in jobs}
        batches = {k: requested[k] for k in placements}
        return ClusterDecision(placements, batches, reasons, tuple(waiting))


class DpPolicy:
    """The DP optimizer over GPU counts (and batch sizes unless ``fixed_batch``)."""

    def __init__(
        self,
        name: str,
        *,
        objective: Objective,
        fixed_batch: bool,
        horizon_s: float = DEFAULT_HORIZON_S,
        batch_choices: int = 12,
        accumulate: bool = False,
        fairness: float = 1.0,
        placement_aware: bool = True,
        restart_model: RestartModel = "age",
    ) -> None:
        if restart_model not in ("age", "horizon"):
            raise AllocatorError(f"restart_model={restart_model!r}: expected 'age' or 'horizon'")
        self.placement_aware = placement_aware
        self.restart_model = restart_model
        self.name = name
        self.objective: Objective = objective
        self.fixed_batch = fixed_batch
        self.accumulate = accumulate
        self.fairness = fairness
        self.horizon_s = horizon_s
        self.batch_choices = batch_choices

    def spec(self, job: JobState, cluster: Cluster) -> OptimizerJob:
        """The optimizer's view of ``job`` under this policy."""
        lo_local, hi_local = job.local_bsz_range
        first = job.explored_gpus == 0 and (self.accumulate or job.requested_batch <= hi_local)
        if self.fixed_batch or first:
            # a job not measured yet runs its requested batch where one GPU can run it
            batches: tuple[int, ...] = (job.requested_batch,)
        else:
            extra = [job.batch_size] if job.batch_size else []
            batches = batch_grid(*job.batch_range, n=self.batch_choices, extra=extra)
        # more GPUs than the largest batch can feed at the smallest local batch never help
        top = max(job.min_gpus, min(job.max_gpus, math.floor(max(batches) / lo_local)))
        if job.explored_gpus is not None:  # an online model: grow at most 2x past what it saw
            top = max(job.min_gpus, min(top, max(2 * job.explored_gpus, 1)))
        least = job.min_gpus
        if not self.accumulate:  # the smallest batch must fit in the GPUs' memory
            least = max(least, math.ceil(min(batches) / hi_local))
            top = max(top, least)
        noise = job.noise
        return OptimizerJob(
            job.job_id,
            throughput_fn(
                job.model, cluster.gpus_per_node, job.local_bsz_range, accumulate=self.accumulate
            ),
            batches,
            min_gpus=least,
            max_gpus=top,
            efficiency=noise.efficiency if noise is not None else None,  # type: ignore[arg-type]
            priority=job.priority,
            current_gpus=job.gpus,
            current_batch=job.batch_size,
            restart_s=job.restart_s,
            restart_factor=self.restart_factor(job),
        )

    def restart_factor(self, job: JobState) -> float | None:
        """The share of its speedup a job keeps when its placement changes.

        ``age`` (Pollux's weighting): ``max(age - restarts * R, 0) / (age + R)``: a young job, or
        one restarted often, pays more; an old job that rarely moved pays little. ``horizon``:
        ``1 - R / H`` for every job (None here: the optimizer's default)."""
        if self.restart_model == "horizon" or job.age_s is None:
            return None
        r = job.restart_s
        return max(job.age_s - job.restarts * r, 0.0) / (job.age_s + r) if r > 0 else 1.0

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        specs = [self.spec(j, cluster) for j in jobs]
        held = _held(jobs)
        repack = self._repack(jobs, specs, held, cluster) if self.placement_aware else set()
        plan, placements = self._plan(specs, cluster, held, repack)
        if self.placement_aware and len(jobs) * cluster.capacity <= REPLAN_MAX_SIZE:
            # The DP values a count as a compact placement; the placer may have to spread a job
            # over more nodes. Charge such a count what the spread placement really delivers
            # and decide again (twice at most: a new plan can spread another job). Each round
            # is a whole DP: past REPLAN_MAX_SIZE (jobs x GPUs) it is skipped, so that a
            # decision for 1,000 jobs on 2,048 GPUs stays under a second.
            states = {j.job_id: j for j in jobs}
            for _ in range(2):
                spread = _spread(placements, cluster)
                if not spread:
                    break
                charged = []
                for s in specs:
                    if s.job_id in spread:
                        gpus, nodes = spread[s.job_id]
                        share = self._spread_share(states[s.job_id], s, gpus, nodes)
                        s = replace(s, placed={**s.placed, gpus: share})
                    charged.append(s)
                specs = charged
                plan, placements = self._plan(specs, cluster, held, repack)
        reasons = {k: a.reason for k, a in plan.assignments.items()}
        for k, (_, nodes) in _spread(placements, cluster).items():
            reasons[k] += f"; spread over {nodes} nodes (none packs it)"
        floor = {s.job_id: s.min_gpus for s in specs}
        taken = sum(floor[k] for k in plan.assignments)
        for i, k in enumerate(plan.waiting):
            reasons[k] = (
                f"waiting, {i + 1} in line: needs >= {floor[k]} GPU(s); the jobs ahead hold "
                f"at least {taken} of {cluster.capacity}"
            )
        return ClusterDecision(
            placements,
            {k: a.batch_size for k, a in plan.assignments.items()},
            reasons,
            plan.waiting,
        )

    def _spread_share(self, job: JobState, spec: OptimizerJob, gpus: int, nodes: int) -> float:
        """Throughput of ``gpus`` GPUs spread over ``nodes`` nodes / compact, each at its best
        batch. The scaling model tells one node from several, nothing finer.

        0 for a model learned online that has never measured a step across nodes: its network
        terms are guesses (near zero, so it would call any spread free), and in the simulator
        trusting them cost up to 10% average JCT (docs/benchmarks.md). Such a job is not placed
        spread by choice. (A job running spread has measured steps across nodes, so the rule
        never forces a running job off its count.)"""
        if job.explored_nodes is not None and job.explored_nodes < 2:
            return 0.0
        k, batches = np.array([float(gpus)]), np.asarray(spec.batch_sizes, dtype=float)
        wide = throughput_fn(
            job.model, -(-gpus // nodes), job.local_bsz_range, accumulate=self.accumulate
        )
        c = np.nan_to_num(spec.throughput(k, batches), nan=0.0).max()
        w = np.nan_to_num(wide(k, batches), nan=0.0).max()
        return float(w / c) if c > 0 else 1.0

    def _repack(
        self,
        jobs: Sequence[JobState],
        specs: list[OptimizerJob],
        held: dict[str, tuple[int, ...]],
        cluster: Cluster,
    ) -> set[str]:
        """Running jobs spread over more nodes than they need whose model says a compact
        placement is worth a restart (the spread share is below what a restart keeps)."""
        spread = _spread(held, cluster)
        return {
            j.job_id
            for j, s in zip(jobs, specs, strict=True)
            if j.job_id in spread
            and self._spread_share(j, s, *spread[j.job_id]) < s.restart_keep(self.horizon_s)
        }

    def _plan(
        self,
        specs: list[OptimizerJob],
        cluster: Cluster,
        held: dict[str, tuple[int, ...]],
        repack: set[str],
    ) -> tuple[Plan, dict[str, tuple[int, ...]]]:
        plan = optimize(
            specs,
            cluster,
            objective=self.objective,
            horizon_s=self.horizon_s,
            fairness=self.fairness,
        )
        counts = {k: a.gpus for k, a in plan.assignments.items()}
        return plan, place(counts, cluster, held, repack)


def _spread(placements: dict[str, tuple[int, ...]], cluster: Cluster) -> dict[str, tuple[int, int]]:
    """Jobs placed over more nodes than their count needs: job -> (GPUs, nodes)."""
    out = {}
    for k, p in placements.items():
        gpus, nodes = sum(p), len(p) - p.count(0)
        if nodes > -(-gpus // cluster.gpus_per_node):
            out[k] = (gpus, nodes)
    return out


#: Policy names, as the CLI and the service accept them.
POLICIES = ("static", "elastic-gpu", "elastic-dp", "goodput-dp", "pollux")


def make_policy(name: str, *, horizon_s: float = DEFAULT_HORIZON_S, seed: int = 0) -> Policy:
    """The policy called ``name`` (one of :data:`POLICIES`; ``seed``: the genetic search's)."""
    if name == "pollux":
        from dloader.allocator.pollux_policy import PolluxPolicy  # it builds on this module

        return PolluxPolicy(horizon_s=horizon_s, seed=seed)
    if name == "static":
        return StaticPolicy()
    if name == "elastic-gpu":
        return DpPolicy(name, objective="throughput", fixed_batch=True, horizon_s=horizon_s)
    if name == "elastic-dp":
        return DpPolicy(name, objective="throughput", fixed_batch=False, horizon_s=horizon_s)
    if name == "goodput-dp":
        return DpPolicy(
            name,
            objective="goodput",
            fixed_batch=False,
            horizon_s=horizon_s,
            accumulate=True,
            fairness=0.0,
        )
    raise AllocatorError(f"policy={name!r}: expected one of {', '.join(POLICIES)}")
