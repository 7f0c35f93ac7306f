"""Cluster scheduling policies over plain job states, shared by the simulator and the service.

* ``static``: each job gets the GPUs and batch size it asked for, first come first served; a
  running job is never changed.
* ``elastic-gpu``: the baseline of Saxena et al.: the DP rescales GPU counts, batch sizes stay
  as requested.
* ``elastic-dp``: Saxena et al.: the DP picks GPU counts and batch sizes for total throughput.
* ``goodput-dp``: ours: as ``elastic-dp``, but for goodput (throughput x statistical efficiency
  from the job's gradient-noise statistics), so it grows a batch only where that still helps; it
  maximises the sum of log speedups (proportional fairness) and may accumulate gradients. Where
  the nodes' CPU cores are limited (``Cluster.cpus``) it decides each job's cores with its GPUs
  and batch size (:mod:`.cores`): a job's throughput is the lesser of what its GPUs compute and
  what its input pipeline feeds on its cores, and a waiting CPU-hungry job whose cores the
  jobs ahead of it already need waits (they run one after another on the cores they need,
  not all at once on a fraction each; :meth:`.DpPolicy._core_queue`), unless its declared
  length leaves it much less work than theirs.
  When not every job can have its fewest GPUs, the less served go first (two queues by
  attained GPU-seconds, with hysteresis and a restart budget: :meth:`.DpPolicy.line`). A job
  that declares its length (``JobState.done``: the share of its epochs done) is weighed by the
  GPU-seconds it still needs, the nearer done the more (:meth:`.DpPolicy.weigh_lengths`), and
  once served and waiting goes before the other waiting served jobs when it needs at most
  ``SHORT_LEFT_GPU_S`` more.
* ``goodput-dp-no-lengths``: ``goodput-dp`` ignoring declared lengths.
* ``goodput-dp-fifo``: ``goodput-dp`` admitting first come, first served (before #48).
* ``goodput-dp-parametric``: ``goodput-dp`` deciding on the parametric scaling model alone, as
  before #48 (``goodput-dp`` corrects it per node count where the job has measured steps:
  :attr:`dloader.predictor.ScalingModel.node_factors`).
* ``goodput-dp-extrapolated``: ``goodput-dp`` deciding on its models' fitted sync lines beyond
  the replica counts they measured, as before #48's bound
  (:attr:`dloader.predictor.ScalingModel.sync_replicas`).
* ``goodput-dp-no-core-admission``: ``goodput-dp`` admitting jobs by GPUs alone, as before
  #48 §5 (a CPU-hungry job waits only for GPUs).
* ``goodput-dp-core-fifo``: ``goodput-dp`` whose core-aware admission ignores declared
  lengths (a waiting CPU-hungry job waits for every job ahead of it), as before.
* ``goodput-dp-cpu-blind``: ``goodput-dp`` deciding as if every pipeline fed any number of
  GPUs; a node's cores go to its jobs in proportion to their GPUs there (the GPU-proportional
  baseline).
* ``goodput-dp-lend``: ``goodput-dp`` lending each node's cores its own jobs do not need to
  other nodes' jobs short of theirs, as remote loader workers (Ray) at the pool's efficiency
  (:mod:`.cores`). Live, each borrowing job's sidecars start them on the lending nodes
  (``Allocation.lent_cpus``; each lending node's Ray node advertises ``dloader_node:<id>``).
* ``pollux``: Pollux's own policy, from its paper, for comparison in the same simulator
  (:mod:`.pollux`); CPU-blind, so its jobs get GPU-proportional cores.
* ``synergy``: Synergy-TUNE (OSDI'22), from its paper and artifact (:mod:`.synergy`): GPUs
  fixed as requested, every job re-placed each 300-s round in least-attained-service order;
  CPU cores by each job's profiled need, best fit. ``synergy-fifo``: the same in arrival order.
  ``synergy-proportional``: the same scheduler with GPU-proportional cores (the baseline of
  Synergy's own comparison).

A policy whose decision divides no cores (``ClusterDecision.cores`` empty) leaves a node's cores
to its jobs in proportion to their GPUs there (:func:`.cores.proportional_cores`).

The registry (:data:`POLICIES`, :func:`make_policy`) is this package; each policy is a module of
it (:mod:`.static`, :mod:`.dp`, :mod:`.pollux`), over what they share: :mod:`.state` (a job's
state, the decision, the interface) and :mod:`.throughput` (a job's predicted throughput).

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

from dloader.allocator.optimizer import DEFAULT_HORIZON_S
from dloader.allocator.policies.dp import (
    LENGTH_POWER,
    REPLAN_MAX_SIZE,
    SHORT_LEFT_GPU_S,
    DpPolicy,
    RestartModel,
)
from dloader.allocator.policies.pollux import PolluxPolicy
from dloader.allocator.policies.state import ClusterDecision, JobState, Policy
from dloader.allocator.policies.static import StaticPolicy
from dloader.allocator.policies.synergy import SynergyPolicy
from dloader.allocator.policies.throughput import (
    ScalingThroughput,
    batch_grid,
    placed_throughput,
    throughput_fn,
)
from dloader.errors import AllocatorError

__all__ = [
    "POLICIES",
    "REPLAN_MAX_SIZE",
    "ClusterDecision",
    "DpPolicy",
    "JobState",
    "Policy",
    "PolluxPolicy",
    "RestartModel",
    "ScalingThroughput",
    "StaticPolicy",
    "SynergyPolicy",
    "batch_grid",
    "make_policy",
    "placed_throughput",
    "throughput_fn",
]

#: Policy names, as the CLI and the service accept them.
POLICIES = (
    "static",
    "elastic-gpu",
    "elastic-dp",
    "goodput-dp",
    "goodput-dp-fifo",
    "goodput-dp-parametric",
    "goodput-dp-extrapolated",
    "goodput-dp-cpu-blind",
    "goodput-dp-no-core-admission",
    "goodput-dp-core-fifo",
    "goodput-dp-lend",
    "goodput-dp-no-lengths",
    "pollux",
    "synergy",
    "synergy-fifo",
    "synergy-proportional",
    "synergy-fifo-proportional",
)


def make_policy(name: str, *, horizon_s: float = DEFAULT_HORIZON_S, seed: int = 0) -> Policy:
    """The policy called ``name`` (one of :data:`POLICIES`; ``seed``: the genetic search's)."""
    if name == "pollux":
        return PolluxPolicy(horizon_s=horizon_s, seed=seed)
    if name == "static":
        return StaticPolicy()
    if name == "elastic-gpu":
        return DpPolicy(name, objective="throughput", fixed_batch=True, horizon_s=horizon_s)
    if name == "elastic-dp":
        return DpPolicy(name, objective="throughput", fixed_batch=False, horizon_s=horizon_s)
    if name == "synergy":
        return SynergyPolicy("las")
    if name == "synergy-fifo":
        return SynergyPolicy("fifo")
    if name == "synergy-proportional":
        return SynergyPolicy("las", tune=False)
    if name == "synergy-fifo-proportional":
        return SynergyPolicy("fifo", tune=False)
    if name.startswith("goodput-dp") and name in POLICIES:
        return DpPolicy(
            name,
            objective="goodput",
            fixed_batch=False,
            horizon_s=horizon_s,
            accumulate=True,
            fairness=0.0,
            cpu_aware=name != "goodput-dp-cpu-blind",
            admission="fifo" if name == "goodput-dp-fifo" else "las",
            per_node_model=name != "goodput-dp-parametric",
            bounded_sync=name != "goodput-dp-extrapolated",
            core_admission=name != "goodput-dp-no-core-admission",
            length_power=0.0 if name == "goodput-dp-no-lengths" else LENGTH_POWER,
            short_left_gpu_s=0.0 if name == "goodput-dp-no-lengths" else SHORT_LEFT_GPU_S,
            lend_spare=name == "goodput-dp-lend",
            core_lengths=name not in ("goodput-dp-core-fifo", "goodput-dp-no-lengths"),
        )
    raise AllocatorError(f"policy={name!r}: expected one of {', '.join(POLICIES)}")
