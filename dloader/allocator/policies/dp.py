"""The dynamic-programming policies: ``elastic-gpu`` and ``elastic-dp`` (Saxena et al.) and
``goodput-dp`` (ours): the optimizer (:mod:`dloader.allocator.optimizer`) picks each job's GPU
count and batch size; placement-aware, and weighing a restart by the job's age."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Literal

import numpy as np

from dloader.allocator.optimizer import (
    DEFAULT_HORIZON_S,
    Cluster,
    Objective,
    OptimizerJob,
    Plan,
    optimize,
    padded_batches,
    place,
    throughput_grid,
)
from dloader.allocator.policies.cores import (
    divide_cores,
    divide_pool,
    fed_table,
    feed_cores,
    feed_rate,
    proportional_cores,
    spare_cores,
)
from dloader.allocator.policies.state import ClusterDecision, JobState, held_placements
from dloader.allocator.policies.throughput import batch_grid, throughput_fn
from dloader.errors import AllocatorError
from dloader.predictor import InputModel, ScalingModel

__all__ = [
    "LAS_RESTART_BUDGET",
    "LAS_THRESHOLD_GPU_S",
    "LENGTH_POWER",
    "REPLAN_MAX_SIZE",
    "SHORT_LEFT_GPU_S",
    "Admission",
    "DpPolicy",
    "RestartModel",
]


REPLAN_MAX_SIZE = 500_000
#: The most times one decision charges spread placements and decides again. Each round can
#: spread another job; two rounds (before 2026-12-03) left such jobs uncharged, and their counts
#: moved back and forth from one decision to the next (up to twice the restarts on a bursty
#: draw, docs/benchmarks.md). Rounds stop as soon as no charge changes.
MAX_REPLANS = 8

RestartModel = Literal["age", "horizon"]
Admission = Literal["fifo", "las"]

#: ``las`` admission: the attained service (GPU-seconds) that splits the two queues (the sweep
#: is in docs/allocator.md), and the share of a job's age its restarts may cost at most for it
#: to be preempted once more.
LAS_THRESHOLD_GPU_S = 900.0
LAS_RESTART_BUDGET = 0.1
#: ``goodput-dp``'s ``length_power`` (a job's weight inversely proportional to its remaining
#: GPU-seconds), and the most that moves its priority either way: on the development workloads
#: a power of 1 gained the most, and a bound of 1.5 kept most of it (0.936 against 0.928 with
#: 2) for a third of the p99 and makespan lost and half the extra restarts (docs/benchmarks.md,
#: "Declared lengths").
LENGTH_POWER = 1.0
LENGTH_WEIGHT_MAX = 1.5
#: ``goodput-dp``'s ``short_left_gpu_s``: a waiting served job whose declared length leaves it
#: at most this many GPU-seconds (one GPU-hour) goes before the other waiting served jobs in
#: the LAS line. Attained service is the line's guess at who is short; a job that says how far
#: it is needs no guess. Chosen on development draws (docs/benchmarks.md, "Declared lengths"):
#: 4x the threshold gained the most, 1x and 2x little, 8x and 16x about as much as 4x.
SHORT_LEFT_GPU_S = 3_600.0
#: Core-aware admission with declared lengths: a waiting CPU-hungry job waits only for the jobs
#: ahead with at most this many times its GPU-seconds left. Not 1: among jobs of about one
#: length, one after another beats all at once (the queue's point), and the lengths left are
#: extrapolations; with 1, a burst of like cifar10 jobs ran all at once (+10% average JCT on a
#: development draw). Chosen on 16 development draws at 3x GPU speed (1 and 2 tried;
#: docs/benchmarks.md, "Core-aware admission with declared lengths").
CORE_LENGTH_FACTOR = 2.0


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
        cpu_aware: bool = False,
        admission: Admission = "fifo",
        las_threshold_gpu_s: float = LAS_THRESHOLD_GPU_S,
        restart_budget: float = LAS_RESTART_BUDGET,
        per_node_model: bool = True,
        bounded_sync: bool = True,
        core_admission: bool = False,
        length_power: float = 0.0,
        short_left_gpu_s: float = 0.0,
        lend_spare: bool = False,
        core_lengths: bool = False,
    ) -> None:
        """``cpu_aware``: with a cluster of limited cores, decide GPUs, batch sizes and cores
        together (:mod:`.cores`); else a node's cores go to its jobs in proportion to their
        GPUs there. ``admission``: which jobs hold the GPUs when not all can get their fewest
        (:meth:`line`). ``per_node_model``: trust a job's scaling model's corrections per node
        count (False: its parametric model alone). ``bounded_sync``: trust its bound on the
        sync terms beyond the replicas measured (False: the fitted lines everywhere).
        ``core_admission``: with ``cpu_aware``, a waiting CPU-hungry job waits while the jobs
        ahead of it need the cores it would need (:meth:`_core_queue`). ``length_power``: weigh
        each job whose length is declared by its remaining GPU-seconds to this power, against
        the line's typical job (:meth:`weigh_lengths`; 0: lengths are not used).
        ``short_left_gpu_s``: with ``las`` admission, a waiting served job whose declared length
        leaves it at most this many GPU-seconds goes before the other waiting served jobs
        (:meth:`line`; 0: not used). ``lend_spare``: with ``cpu_aware``, each node's cores its
        own jobs do not need feed other nodes' jobs short of theirs as remote loader workers
        (:func:`.cores.spare_cores`; the decision's ``lent`` says how many of each node's).
        ``core_lengths``: with ``core_admission``, a waiting job whose length is known waits
        only for the jobs ahead with little more work left (:meth:`_core_queue`)."""
        if restart_model not in ("age", "horizon"):
            raise AllocatorError(f"restart_model={restart_model!r}: expected 'age' or 'horizon'")
        if admission not in ("fifo", "las"):
            raise AllocatorError(f"admission={admission!r}: expected 'fifo' or 'las'")
        if not (las_threshold_gpu_s > 0 and restart_budget >= 0):
            raise AllocatorError(
                f"las_threshold_gpu_s={las_threshold_gpu_s}, restart_budget={restart_budget}: "
                "expected > 0 and >= 0"
            )
        if not 0.0 <= length_power <= 4.0:
            raise AllocatorError(f"length_power={length_power}: expected a number in [0, 4]")
        if not 0.0 <= short_left_gpu_s < math.inf:
            raise AllocatorError(
                f"short_left_gpu_s={short_left_gpu_s}: expected a finite number >= 0"
            )
        self.short_left_gpu_s = short_left_gpu_s
        self.lend_spare = lend_spare
        self.core_lengths = core_lengths
        self.length_power = length_power
        self.per_node_model = per_node_model
        self.bounded_sync = bounded_sync
        self.core_admission = core_admission
        self.admission: Admission = admission
        self.las_threshold_gpu_s = las_threshold_gpu_s
        self.restart_budget = restart_budget
        self.placement_aware = placement_aware
        self.restart_model = restart_model
        self.name = name
        self.objective: Objective = objective
        self.fixed_batch = fixed_batch
        self.accumulate = accumulate
        self.fairness = fairness
        self.horizon_s = horizon_s
        self.batch_choices = batch_choices
        self.cpu_aware = cpu_aware

    def spec(
        self,
        job: JobState,
        cluster: Cluster,
        feed: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> OptimizerJob:
        """The optimizer's view of ``job`` under this policy (``feed``: what its input pipeline
        lets through, :attr:`OptimizerJob.feed`)."""
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
                self.model(job),
                cluster.gpus_per_node,
                job.local_bsz_range,
                accumulate=self.accumulate,
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
            feed=feed,
        )

    def model(self, job: JobState) -> ScalingModel:
        """The scaling model this policy decides ``job`` on."""
        model = job.model if self.per_node_model else job.model.parametric
        if self.bounded_sync or model.sync_replicas is None:
            return model
        return ScalingModel(
            model.params, num_points=model.num_points, node_factors=model.node_factors
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

    def line(self, jobs: Sequence[JobState]) -> list[JobState]:
        """The order in which jobs are admitted: each gets its fewest GPUs while they last, and
        the jobs behind the first that does not fit wait (``optimizer.admit``).

        ``fifo``: arrival order. ``las``: two queues by attained service, split at
        ``las_threshold_gpu_s`` GPU-seconds, the less served first (a burst's short jobs do not
        wait behind long ones); within a queue, running jobs before waiting ones (so a job that
        crosses the threshold is never preempted for one in its own queue: no thrashing), then
        arrival. A running job of the second queue is placed behind the waiting first-queue
        jobs, and so preempted if they need its GPUs, only where one more restart keeps its
        restarts within ``restart_budget`` of its age; else it keeps its place in the first
        queue. A waiting served job whose declared length leaves it at most ``short_left_gpu_s``
        GPU-seconds (:attr:`.JobState.remaining_gpu_s`) goes right behind the running served
        jobs, before the other waiting ones: a nearly done job of a busy cluster does not wait
        behind every long one, and preempts none (new jobs, which may be shorter yet, still go
        first)."""
        if self.admission == "fifo":
            return list(jobs)

        def key(j: JobState) -> tuple[int, int, float, str]:
            queue = 0
            if j.attained_gpu_s >= self.las_threshold_gpu_s:
                left = j.remaining_gpu_s if self.short_left_gpu_s else None
                near = left is not None and left <= self.short_left_gpu_s
                queue = 1 if j.placement or near else 2
                # a running job restarted as often as its age allows is not preempted again
                spent = j.age_s is not None and (j.restarts + 1) * j.restart_s > (
                    self.restart_budget * j.age_s
                )
                if j.placement and spent:
                    queue = 0
            return (queue, 0 if j.placement else 1, j.arrival, j.job_id)

        return sorted(jobs, key=key)

    def weigh_lengths(self, jobs: Sequence[JobState]) -> list[JobState]:
        """``jobs`` with each declared job's priority scaled by ``(R / R_typ) ** -length_power``,
        ``R`` its remaining GPU-seconds (:attr:`.JobState.remaining_gpu_s`) and ``R_typ`` their
        geometric mean over the jobs that have one, clipped to ``LENGTH_WEIGHT_MAX`` either way:
        the nearer a job is to done, the more a GPU given to it shortens the average JCT (the
        shortest remaining work first, softened: GPUs still go by speed-up). A job without a
        declared length, or not run yet, keeps its priority."""
        if not self.length_power:
            return list(jobs)
        left = {j.job_id: r for j in jobs if (r := j.remaining_gpu_s) is not None}
        if not left:
            return list(jobs)
        typical = math.exp(sum(math.log(max(r, 1.0)) for r in left.values()) / len(left))
        out = []
        for j in jobs:
            r = left.get(j.job_id)
            if r is not None:
                w = (max(r, 1.0) / typical) ** -self.length_power
                w = min(max(w, 1.0 / LENGTH_WEIGHT_MAX), LENGTH_WEIGHT_MAX)
                j = replace(j, priority=j.priority * w)
            out.append(j)
        return out

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        line = self.line(jobs)
        weighed = self.weigh_lengths(line)
        decision = self._decide_weighed(weighed, cluster)
        reasons = {
            j.job_id: decision.reasons[j.job_id]
            + f"; x{w.priority / j.priority:.2f} for its declared length ({j.done:.0%} done)"
            for j, w in zip(line, weighed, strict=True)
            if w.priority != j.priority and j.job_id in decision.placements
        }
        return replace(decision, reasons={**decision.reasons, **reasons}) if reasons else decision

    def _decide_weighed(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        if cluster.cpus is None:
            return self._decide(jobs, cluster)
        if not (self.cpu_aware and any(j.input is not None for j in jobs)):
            decision = self._decide(jobs, cluster)
            return replace(decision, cores=proportional_cores(decision.placements, cluster))
        # each GPU brings the cluster's cores per GPU, its share of the CPU pool included where
        # the job can use the pool (see .cores); then each node's cores go by what its jobs'
        # GPUs would use, the pool to those still short, and each job's batch fits the cores
        # it got
        local = sum(cluster.cpus) / cluster.capacity
        pooled = cluster.pool_efficiency * cluster.pool / cluster.capacity
        specs = [
            self.spec(
                j,
                cluster,
                fed_table(j.input, local + (pooled if j.remote_max > 0 else 0.0))
                if j.input is not None
                else None,
            )
            for j in jobs
        ]
        queued = self._core_queue(jobs, specs, cluster) if self.core_admission else {}
        if queued:
            kept = [(j, s) for j, s in zip(jobs, specs, strict=True) if j.job_id not in queued]
            jobs, specs = [j for j, _ in kept], [s for _, s in kept]
        decision = self._decide(jobs, cluster, specs, fed=True)
        if queued:
            decision = replace(
                decision,
                waiting=decision.waiting + tuple(queued),
                reasons={**decision.reasons, **queued},
            )
        fed = [
            (j.job_id, j.input, s)
            for j, s in zip(jobs, specs, strict=True)
            if j.input is not None and j.job_id in decision.placements
        ]
        gpus = [sum(decision.placements[job_id]) for job_id, _, _ in fed]
        tables = self._batch_tables([s for *_, s in fed], gpus)  # in the order of ``fed``
        need = {
            job_id: feed_cores(model, k, float(x[int(np.argmax(x * eff))]))
            for (job_id, model, _), k, (_, x, eff) in zip(fed, gpus, tables, strict=True)
        }
        weights = {j.job_id: j.priority for j in jobs}
        cores = divide_cores(decision.placements, need, weights, cluster)
        short = {job_id: n - sum(cores[job_id]) for job_id, n in need.items()}
        most = {j.job_id: j.remote_max for j in jobs}
        lent: tuple[float, ...] = ()
        if self.lend_spare:
            cores, remote, lent = self._lend(
                decision.placements, cores, need, short, most, weights, cluster
            )
        else:
            remote = divide_pool(short, most, weights, cluster)
        sizes, reasons = dict(decision.batch_sizes), dict(decision.reasons)
        for (job_id, model, _), k, (batches, x, eff) in zip(fed, gpus, tables, strict=True):
            pool = remote.get(job_id, 0.0)
            got = sum(cores[job_id]) + cluster.pool_efficiency * pool
            best = int(batches[int(np.argmax(np.minimum(x, feed_rate(model, k, got)) * eff))])
            if pool:
                reasons[job_id] += f"; {pool:.1f} pool cores"
            if best != sizes[job_id]:
                reasons[job_id] += f"; batch {best} for its {got:.1f} cores"
                sizes[job_id] = best
        return replace(
            decision, batch_sizes=sizes, reasons=reasons, cores=cores, remote=remote, lent=lent
        )

    @staticmethod
    def _lend(
        placements: Mapping[str, tuple[int, ...]],
        cores: dict[str, tuple[float, ...]],
        need: Mapping[str, float],
        short: Mapping[str, float],
        most: Mapping[str, float],
        weights: Mapping[str, float],
        cluster: Cluster,
    ) -> tuple[dict[str, tuple[float, ...]], dict[str, float], tuple[float, ...]]:
        """``lend_spare``: the nodes' spare cores (and the CPU pool's) to the jobs still
        ``short``, within the ``most`` their loaders can use; the lending nodes' cores divided
        again on what they keep. Returns the cores, the remote cores per job and each node's
        cores lent."""
        spare = spare_cores(placements, cores, need, cluster)
        remote = divide_pool(short, most, weights, replace(cluster, pool=cluster.pool + sum(spare)))
        borrowed = max(sum(remote.values()) - cluster.pool, 0.0)  # the pool's own cores first
        if borrowed <= 1e-9:
            return cores, remote, ()
        assert cluster.cpus is not None  # spare cores need cores per node
        lent = tuple(s * borrowed / sum(spare) for s in spare)
        # what each node keeps, divided among its own jobs (a Cluster's nodes have some cores:
        # a node that lends all it has keeps a sliver, which its jobs, needing none, may use)
        kept = tuple(max(c - x, 1e-9) for c, x in zip(cluster.cpus, lent, strict=True))
        keep = replace(cluster, cpus=kept)
        return divide_cores(placements, need, weights, keep), remote, lent

    def _core_queue(
        self, jobs: Sequence[JobState], specs: Sequence[OptimizerJob], cluster: Cluster
    ) -> dict[str, str]:
        """The waiting CPU-hungry jobs to queue (id -> reason): in line order, each job the GPUs
        admit counts the cores its pipeline needs at its fewest GPUs (a job whose input is not
        known counts none; a running job is never queued); a waiting job that needs
        more than its GPUs' share of the cluster's cores (the CPU pool's included where its
        loaders can use it) waits when what the jobs before it need leaves it less than it
        needs, but not if it needs more than the cluster has (waiting would not feed it).
        Where cores bind, such jobs then run one after another on the cores they need rather
        than all at once on a fraction each (the same samples/s where a pipeline's speed is
        proportional to its cores, each job done sooner), and their GPUs go to the jobs behind
        them. With ``core_lengths``, a waiting job whose length is known
        (:attr:`.JobState.remaining_gpu_s`) waits only for the jobs ahead that have at most
        ``CORE_LENGTH_FACTOR`` times its GPU-seconds left (a job ahead whose length is not known
        is not waited for): a short job does not wait hours for a long job's cores, and a job
        of about the length of those ahead still waits its turn."""
        assert cluster.cpus is not None
        local, pool = sum(cluster.cpus), cluster.pool_efficiency * cluster.pool
        need = self._needs(
            {s.job_id: s for s in specs},
            {j.job_id: j.input for j in jobs if j.input is not None},
            {s.job_id: (s.min_gpus,) for s in specs},
            {j.job_id: j.batch_size or s.batch_sizes[0] for j, s in zip(jobs, specs, strict=True)},
        )
        admitted: list[tuple[float, float]] = []  # (GPU-seconds left or inf, cores needed)
        used_all, gpus = 0.0, 0
        queued: dict[str, str] = {}
        for j, s in zip(jobs, specs, strict=True):
            gpus += s.min_gpus
            if gpus > cluster.capacity:  # the GPUs admit no more: the rest wait anyway
                break
            n = need.get(j.job_id, 0.0)
            total = local + (pool if j.remote_max > 0 else 0.0)
            hungry = s.min_gpus * total / cluster.capacity < n <= total
            left = j.remaining_gpu_s if self.core_lengths else None
            if hungry and not j.placement:
                ahead, used = "the jobs ahead", used_all
                if left is not None:
                    bound = CORE_LENGTH_FACTOR * left
                    ahead = f"the jobs ahead with at most {bound:.0f} GPU-s left"
                    used = sum(c for r, c in admitted if r <= bound)
                if used + n > total + 1e-9:
                    gpus -= s.min_gpus
                    queued[j.job_id] = (
                        f"waiting: CPU-hungry ({n:.1f} cores to feed {s.min_gpus} GPU(s)); "
                        f"{ahead} need {used:.1f} of the cluster's {total:.0f} cores"
                    )
                    continue
            admitted.append((math.inf if left is None else left, n))
            used_all += n
        return queued

    def _batch_tables(
        self, specs: Sequence[OptimizerJob], gpus: Sequence[int]
    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """For each job (``specs``) on its ``gpus`` GPUs (compact), all at once: the batch
        sizes it may run, the samples/s its GPUs compute at each, and each one's statistical
        efficiency (1s without one)."""
        if not specs:
            return []
        batches = padded_batches(specs)  # the padding is cut off again below
        k = np.asarray(gpus, dtype=float)[:, None]
        grid = throughput_grid(specs, k, batches)[:, 0, :]
        grid = np.where(np.isfinite(grid) & (grid > 0), grid, 0.0)
        out = []
        for s, b, x in zip(specs, batches, grid, strict=True):
            n = len(s.batch_sizes)
            eff = np.ones(n)
            if self.objective == "goodput" and s.efficiency is not None:
                eff = np.asarray(s.efficiency(b[:n]), dtype=float)
            out.append((b[:n], x[:n], eff))
        return out

    def _needs(
        self,
        specs: Mapping[str, OptimizerJob],
        inputs: Mapping[str, InputModel],
        placements: Mapping[str, Sequence[int]],
        batches: Mapping[str, int],
    ) -> dict[str, float]:
        """The cores each placed job with a known input (``inputs``) needs to feed its GPUs at
        its batch."""
        ids = [k for k in placements if k in inputs]
        if not ids:
            return {}
        k = np.array([[float(sum(placements[i]))] for i in ids])
        b = np.array([[float(batches[i])] for i in ids])
        x = np.nan_to_num(throughput_grid([specs[i] for i in ids], k, b)[:, 0, 0], nan=0.0)
        return {
            i: feed_cores(inputs[i], float(n[0]), max(float(v), 0.0))
            for i, n, v in zip(ids, k, x, strict=True)
        }

    def _decide(
        self,
        jobs: Sequence[JobState],
        cluster: Cluster,
        specs: list[OptimizerJob] | None = None,
        *,
        fed: bool = False,
    ) -> ClusterDecision:
        """The decision; ``specs``: the jobs' :meth:`spec` (None: made here, CPU-blind). ``fed``:
        each job with a known input is valued at what its spec's feed lets through, and placed
        where the cores its pipeline needs are free."""
        if specs is None:
            specs = [self.spec(j, cluster) for j in jobs]
        by_id = {s.job_id: s for s in specs}  # their throughput (a feed applies to tables only)
        inputs = {j.job_id: j.input for j in jobs if j.input is not None}
        held = held_placements(jobs)
        repack = self._repack(jobs, specs, held, cluster) if self.placement_aware else set()

        def needs(plan: Plan) -> dict[str, float] | None:
            if not fed:
                return None
            counts = {k: (a.gpus,) for k, a in plan.assignments.items()}
            batches = {k: a.batch_size for k, a in plan.assignments.items()}
            return self._needs(by_id, inputs, counts, batches)

        plan, placements = self._plan(specs, cluster, held, repack, needs)
        if self.placement_aware and len(jobs) * cluster.capacity <= REPLAN_MAX_SIZE:
            # The DP values a count as a compact placement; the placer may have to spread a job
            # over more nodes. Charge such a count what the spread placement really delivers
            # and decide again, until no charge changes (a new plan can spread another job;
            # MAX_REPLANS at most). Each round is a whole DP: past REPLAN_MAX_SIZE (jobs x
            # GPUs) it is skipped, so that a decision for 1,000 jobs on 2,048 GPUs stays under
            # a second.
            states = {j.job_id: j for j in jobs}
            for _ in range(MAX_REPLANS):
                spread = _spread(placements, cluster)
                charged, changed = [], False
                for s in specs:
                    if s.job_id in spread:
                        gpus, nodes = spread[s.job_id]
                        share = self._spread_share(states[s.job_id], s, gpus, nodes)
                        if s.placed.get(gpus) != share:
                            s, changed = replace(s, placed={**s.placed, gpus: share}), True
                    charged.append(s)
                if not changed:
                    break
                specs = charged
                plan, placements = self._plan(specs, cluster, held, repack, needs)
        reasons = {k: a.reason for k, a in plan.assignments.items()}
        for k, (_, nodes) in _spread(placements, cluster).items():
            reasons[k] += f"; spread over {nodes} nodes (none packs it)"
        floor = {s.job_id: s.min_gpus for s in specs}
        ahead = sum(floor[k] for k in plan.assignments)
        for i, k in enumerate(plan.waiting):
            reasons[k] = (
                f"waiting, {i + 1} in line: needs >= {floor[k]} GPU(s); the jobs ahead hold "
                f"at least {ahead} of {cluster.capacity}"
            )
        return ClusterDecision(
            placements,
            {k: a.batch_size for k, a in plan.assignments.items()},
            reasons,
            plan.waiting,
        )

    def _spread_share(self, job: JobState, spec: OptimizerJob, gpus: int, nodes: int) -> float:
        """Goodput of ``gpus`` GPUs spread over ``nodes`` nodes / compact, at the batch the
        compact count is best at (the scaling model, corrected per node count where the job
        measured steps): the share the plan multiplies the count's value by leaves that batch
        the best, so it is the batch the job runs spread.

        Throughput at each placement's own best batch called spreads nearly free: a large
        batch, with micro-batches past the largest per-GPU batch, hides the network's cost, but
        the job does not run it (yolov3 on four nodes x 1 GPU: 0.93 of compact by that measure,
        0.50 by this one, 0.66 in its traces; docs/benchmarks.md).

        0 for a model learned online that has never measured a step across nodes: its network
        terms are guesses (near zero, so it would call any spread free), and in the simulator
        trusting them cost up to 10% average JCT (docs/benchmarks.md). Such a job is not placed
        spread by choice. (A job running spread has measured steps across nodes, so the rule
        never forces a running job off its count.)"""
        if job.explored_nodes is not None and job.explored_nodes < 2:
            return 0.0
        k, batches = np.array([float(gpus)]), np.asarray(spec.batch_sizes, dtype=float)
        wide = throughput_fn(
            self.model(job), -(-gpus // nodes), job.local_bsz_range, accumulate=self.accumulate
        )
        compact = np.nan_to_num(spec.throughput(k, batches), nan=0.0).ravel()
        spread = np.nan_to_num(wide(k, batches), nan=0.0).ravel()
        if spec.efficiency is not None:
            eff = np.nan_to_num(np.asarray(spec.efficiency(batches), dtype=float), nan=0.0)
            compact, spread = compact * eff, spread * eff
        best = int(compact.argmax())
        return float(spread[best] / compact[best]) if compact[best] > 0 else 1.0

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
        needs: Callable[[Plan], dict[str, float] | None] | None = None,
    ) -> tuple[Plan, dict[str, tuple[int, ...]]]:
        plan = optimize(
            specs,
            cluster,
            objective=self.objective,
            horizon_s=self.horizon_s,
            fairness=self.fairness,
        )
        counts = {k: a.gpus for k, a in plan.assignments.items()}
        cores = needs(plan) if needs is not None else None
        return plan, place(counts, cluster, held, repack, cores)


def _spread(placements: dict[str, tuple[int, ...]], cluster: Cluster) -> dict[str, tuple[int, int]]:
    """Jobs placed over more nodes than their count needs: job -> (GPUs, nodes)."""
    out = {}
    for k, p in placements.items():
        gpus, nodes = sum(p), len(p) - p.count(0)
        if nodes > -(-gpus // cluster.gpus_per_node):
            out[k] = (gpus, nodes)
    return out
