"""Trace-driven cluster simulator: replays a workload under a policy, on measured behaviour.

Every ``interval_s`` the policy (the same code the live service runs) sees the active jobs and
decides placements and batch sizes; then each job advances by the interval on its measured
behaviour (:class:`dloader.allocator.traces.AppTrace`): a change of placement first costs
``restart_s`` seconds (checkpoint, restart, resume), a batch-size change alone costs nothing
(dloader applies it live). Jobs complete mid-interval at the exact moment their progress reaches
the target. Jobs submitted between two decisions wait for the next.

With CPUs (``Cluster.cpus``), each job's input pipeline delivers at most what its cores on each
node feed (:mod:`dloader.allocator.cpu_profiles`: Synergy's profiles): a step takes its GPU time
divided by the share of its GPUs' samples the slowest-fed node delivers, each GPU's loader on its
share of the job's cores there (:func:`~dloader.allocator.policies.cores.feed_rate`, as in
Synergy's 2- and 4-GPU tables; checked in the tests). A policy that divides no cores
(``ClusterDecision.cores`` empty) gets the GPU-proportional division. Online, a job's input model
is what a node sidecar would know by then: the samples/s one GPU's pipeline delivers at each core
count per GPU it ran at (a sidecar measures the CPU time per sample of the loader's workers),
extrapolated linearly elsewhere.

Deterministic: the same workload, traces and settings give the same result.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import numpy as np

from dloader.allocator.cpu_profiles import (
    APP_PROFILES,
    PACKAGED_CPU_PROFILES,
    SAMPLE_MB,
    CpuProfile,
    input_truth,
    read_cpu_profiles,
)
from dloader.allocator.optimizer import DEFAULT_RESTART_S, POOL_COST_S_PER_MB, Cluster
from dloader.allocator.policies import ClusterDecision, JobState, Policy
from dloader.allocator.policies.cores import (
    divide_cores,
    feed_cores,
    feed_rate,
    proportional_cores,
)
from dloader.allocator.traces import AppTrace, WorkloadJob, placement_key
from dloader.errors import AllocatorError
from dloader.predictor import (
    MAX_INPUT_POINTS,
    InputModel,
    ScalingModel,
    ScalingParams,
    ScalingPoint,
)

__all__ = ["LEARNING", "Learning", "SimJobResult", "SimResult", "Simulator"]

Learning = Literal["online", "oracle"]
#: How jobs' throughput models are learned (see :class:`Simulator`).
LEARNING: tuple[Learning, ...] = ("online", "oracle")
#: ``declared_lengths``: the largest log-normal error of a declared length (a factor of e**3).
MAX_DECLARED_SIGMA = 3.0
#: Before a job has run: throughput proportional to GPUs, the same at every batch size.
_PRIOR = ScalingModel(ScalingParams(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0))


@functools.lru_cache(maxsize=4096)
def _fit_observed(points: tuple[ScalingPoint, ...]) -> ScalingModel:
    """``ScalingModel.fit_observed(points)``, memoised: an application measures the same at the
    same configuration, so its jobs (and the same workload under other policies or jitters)
    often see the same points in the same order, and the fits were most of a simulation's time
    (models are not changed in place, so one can be shared)."""
    return ScalingModel.fit_observed(list(points))


def _fed(truth: InputModel, parts: Sequence[tuple[int, float]], wanted: float) -> float:
    """The share of ``wanted`` samples/s (a job's GPUs at their step) its pipeline feeds, its
    GPUs and cores per node in ``parts``: every node must feed its GPUs' part of each step, so
    the slowest-fed node sets the pace."""
    k = sum(g for g, _ in parts)
    return min(min(feed_rate(truth, g, c) * k / (g * wanted) for g, c in parts), 1.0)


def _packed(gpus: int, per_node: int) -> tuple[int, ...]:
    """The most compact placement of ``gpus`` GPUs (whole nodes, then the rest on one)."""
    whole, rest = divmod(gpus, per_node)
    return (per_node,) * whole + ((rest,) if rest else ())


@dataclass
class _SimJob:
    spec: WorkloadJob
    app: AppTrace
    batch: int
    placement: tuple[int, ...] = ()
    progress: float = 0.0
    epoch: int = 0
    start: float | None = None
    end: float | None = None
    restarts: int = 0
    gpu_seconds: float = 0.0
    restart_left: float = 0.0
    batch_changes: int = 0
    held_s: float = 0.0
    """Seconds it held GPUs (restarting or running)."""
    restart_s: float = 0.0
    """Seconds of restarts (its first start included)."""
    placement_s: float = 0.0
    """Seconds lost to a placement over more nodes than its GPU count needs."""
    seen: dict[tuple[int, int, int], ScalingPoint] = field(default_factory=dict)
    """Online learning: what it measured, by (nodes, replicas, local batch)."""
    model: ScalingModel | None = None
    """Online learning: its model, fitted to ``seen``."""
    cores: tuple[float, ...] = ()
    """CPU cores on each node (empty: unlimited)."""
    cpu_seconds: float = 0.0
    """Core-seconds its input pipeline used."""
    input_s: float = 0.0
    """Seconds lost waiting for input (running time times the share not fed)."""
    fed_seen: dict[float, float] = field(default_factory=dict)
    """Online learning: samples/s one GPU's pipeline delivered, by cores per GPU."""
    remote: float = 0.0
    """Cores of the cluster's CPU pool its remote loader workers hold."""
    remote_seconds: float = 0.0
    """Core-seconds of the pool it held."""
    work_scale: float = 1.0
    """Its work over its application's (``WorkloadJob.duration_s``; 1: the application's)."""
    truth: InputModel | None = field(default=None, repr=False)
    """Its input pipeline's ground truth (None: unlimited CPUs)."""
    declared: float = 1.0
    """Its declared length over its true one (``declared_lengths``)."""
    kind: tuple[str, str, float] = ("", "", 0.0)
    """(application, CPU profile, the profile's ``X_ref``; 0: the application's): the jobs
    whose measured input curves it may bring as a prior (``input_prior``)."""

    @property
    def gpus(self) -> int:
        return sum(self.placement)


@dataclass(frozen=True)
class SimJobResult:
    """One job's outcome."""

    name: str
    application: str
    submit_s: float
    start_s: float | None
    end_s: float | None
    jct_s: float | None
    restarts: int
    batch_changes: int
    gpu_seconds: float
    final_gpus: int
    final_batch: int
    queue_s: float = 0.0
    """Seconds between submission and the end without GPUs (waiting, or preempted)."""
    restart_s: float = 0.0
    """Seconds spent restarting (checkpoint, restart, resume; the first start included)."""
    placement_s: float = 0.0
    """Seconds lost to spread placements: running time times the share of the packed
    placement's progress rate that the actual placement did not reach."""
    cpu_seconds: float = 0.0
    """Core-seconds its input pipeline used (0 with unlimited CPUs)."""
    input_s: float = 0.0
    """Seconds lost waiting for input: running time times the share of its GPUs' rate that
    its cores did not feed."""
    remote_seconds: float = 0.0
    """Core-seconds of the cluster's CPU pool its remote loader workers held."""


@dataclass
class SimResult:
    """What a run produced."""

    policy: str
    cluster: tuple[int, ...]
    interval_s: float
    restart_s: float
    jobs: list[SimJobResult]
    times: list[float]
    """Decision times (s)."""
    gpus: dict[str, list[int]]
    """GPUs per job at each decision time."""
    optimizer_ms: list[float] = field(default_factory=list)
    """Wall time of each policy decision."""
    cpus: tuple[float, ...] | None = None
    """CPU cores per node (None: unlimited)."""
    pool: float = 0.0
    """Cores of the CPU pool (0: none)."""

    def summary(self, within_hours: float = 4.0) -> dict[str, float | int | str]:
        """Headline numbers (JSON-compatible)."""
        done = [j for j in self.jobs if j.jct_s is not None]
        jct = np.array([j.jct_s for j in done], dtype=float)
        first = min(j.submit_s for j in self.jobs)
        last = max((j.end_s for j in done if j.end_s is not None), default=first)
        makespan = last - first
        capacity = sum(self.cluster)
        used = sum(j.gpu_seconds for j in self.jobs)
        opt = np.array(self.optimizer_ms or [0.0])
        return {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "jobs_completed": len(done),
            f"jobs_completed_{within_hours:g}h": sum(
                1 for j in done if j.end_s is not None and j.end_s <= first + within_hours * 3600
            ),
            "avg_jct_s": float(jct.mean()) if len(jct) else math.nan,
            "p50_jct_s": float(np.percentile(jct, 50)) if len(jct) else math.nan,
            "p99_jct_s": float(np.percentile(jct, 99)) if len(jct) else math.nan,
            "makespan_s": float(makespan),
            "gpu_utilisation": float(used / (capacity * makespan)) if makespan > 0 else 0.0,
            "cpu_utilisation": (
                float(sum(j.cpu_seconds for j in self.jobs) / (sum(self.cpus) * makespan))
                if self.cpus is not None and makespan > 0
                else math.nan
            ),
            "pool_utilisation": (
                float(sum(j.remote_seconds for j in self.jobs) / (self.pool * makespan))
                if self.pool > 0 and makespan > 0
                else math.nan
            ),
            "restarts": sum(j.restarts for j in self.jobs),
            "batch_changes": sum(j.batch_changes for j in self.jobs),
            "optimizer_ms_p50": float(np.percentile(opt, 50)),
            "optimizer_ms_p99": float(np.percentile(opt, 99)),
            "optimizer_ms_max": float(opt.max()),
        }

    def losses(self) -> dict[str, dict[str, float]]:
        """Per application (completed jobs), where the time went, in mean seconds per job:
        ``jct``, ``queue`` (no GPUs), ``restart``, ``placement`` (lost to spread placements),
        ``input`` (lost waiting for input), ``run`` (the rest), and ``restarts`` (mean count).
        JSON-compatible."""
        by_app: dict[str, list[SimJobResult]] = {}
        for j in self.jobs:
            if j.jct_s is not None:
                by_app.setdefault(j.application, []).append(j)
        out = {}
        for app, jobs in sorted(by_app.items()):
            n = len(jobs)
            mean = {
                "jct": sum(j.jct_s or 0.0 for j in jobs) / n,
                "queue": sum(j.queue_s for j in jobs) / n,
                "restart": sum(j.restart_s for j in jobs) / n,
                "placement": sum(j.placement_s for j in jobs) / n,
                "input": sum(j.input_s for j in jobs) / n,
            }
            mean["run"] = mean["jct"] - sum(
                mean[k] for k in ("queue", "restart", "placement", "input")
            )
            out[app] = {"jobs": float(n), **mean, "restarts": sum(j.restarts for j in jobs) / n}
        return out


class Simulator:
    """Replays ``workload`` on ``cluster`` under ``policy``.

    Args:
        workload: jobs with submission times.
        apps: the applications' traces, by name.
        policy: decides at every interval.
        cluster: the nodes.
        interval_s: seconds between decisions.
        restart_s: seconds a job loses when its placement changes (its first start included).
        learning: ``online`` (the default, the honest mode): each job's throughput model is
            fitted only to what that job has run so far, starting from an optimistic prior on
            one GPU and allowed at most twice the GPUs it has measured, as in Pollux;
            ``oracle``: the model fitted offline to every measurement of its application (and
            its input model, with CPUs, the ground truth).
        cpu_profiles: with ``cluster.cpus``: the profile of each application's input pipeline
            (:func:`~dloader.allocator.cpu_profiles.read_cpu_profiles`; default: Synergy's,
            shipped with the package), by profile name (:data:`APP_PROFILES` maps the Pollux
            applications; another application uses the profile of its own name).
        gpu_speed: with ``cluster.cpus``: the simulated GPUs' speed over the profiled V100's
            (a GPU ``s`` times faster needs ``s`` times the cores).
        pooled_cores: with ``cluster.cpus``: a reference, not a cluster that exists: the
            policy's GPUs and batch sizes, but the cluster's cores one pool without node
            boundaries, divided at every decision by each running job's true need (what its
            GPUs compute at its batch, :func:`~dloader.allocator.policies.cores.feed_cores`),
            water-filled by GPUs where the pool is short, the spare by GPUs (the pooled
            same-cores bound: what a perfect division of the same cores could feed).
        input_prior: online, with ``cluster.cpus``: a job that has not run yet brings the input
            curve its application's earlier jobs measured (``JobSpec.input_curve``: an
            earlier run's), so that its first decision already sees what its cores feed;
            without it (the default) its input is unknown until it has run.
        declared_lengths: every job declares its length (its epochs, as a trainer's
            ``max_epochs``) and reports the share of it done (``JobState.done``). 0: each
            declares its true length; ``sigma`` > 0: its true length times ``exp(N(0, sigma))``,
            drawn per job (seeded by its name), so a job may be done before or after it
            expects. None (the default): no job declares one.
    """

    def __init__(
        self,
        workload: Sequence[WorkloadJob],
        apps: dict[str, AppTrace],
        policy: Policy,
        cluster: Cluster,
        *,
        interval_s: float = 60.0,
        restart_s: float = DEFAULT_RESTART_S,
        learning: Learning = "online",
        cpu_profiles: dict[str, CpuProfile] | None = None,
        gpu_speed: float = 1.0,
        pooled_cores: bool = False,
        input_prior: bool = False,
        declared_lengths: float | None = None,
    ) -> None:
        if not interval_s > 0 or restart_s < 0:
            raise AllocatorError(f"{interval_s=} must be > 0 and {restart_s=} >= 0")
        if learning not in LEARNING:
            raise AllocatorError(f"learning={learning!r}: expected one of {', '.join(LEARNING)}")
        self.learning = learning
        if pooled_cores and (cluster.cpus is None or cluster.pool > 0):
            raise AllocatorError(
                "pooled cores (--pooled-cores) need cores per node (--cpus-per-node) and no "
                "CPU pool (--cpu-pool-nodes)"
            )
        self.pooled_cores = pooled_cores
        self.input_prior = input_prior
        if declared_lengths is not None and not 0.0 <= declared_lengths <= MAX_DECLARED_SIGMA:
            raise AllocatorError(
                f"declared lengths (--declared-lengths) {declared_lengths}: expected a "
                f"log-normal sigma in [0, {MAX_DECLARED_SIGMA:g}]"
            )
        self.declared_lengths = declared_lengths
        #: Per (application, CPU profile), what its jobs' sidecars measured (one GPU's
        #: pipeline, by cores per GPU, the newest kept): with ``input_prior``, a new job's
        #: curve brought at submission.
        self._app_seen: dict[tuple[str, str, float], dict[float, float]] = {}
        missing = sorted({j.application for j in workload} - set(apps))
        if missing:
            raise AllocatorError(f"workload uses application(s) {missing} without traces")
        self.policy = policy
        self.cluster = cluster
        self.interval_s = interval_s
        self.restart_s = restart_s
        self._jobs = [_SimJob(w, apps[w.application], w.batch_size) for w in workload]
        if declared_lengths:
            for job in self._jobs:
                rng = random.Random(f"declared:{job.spec.name}")
                job.declared = math.exp(rng.gauss(0.0, declared_lengths))
        self._jobs.sort(key=lambda j: (j.spec.time, j.spec.name))
        #: The ground truth of each application's input pipeline with its own CPU profile
        #: (empty: unlimited CPUs). A job with a profile of its own (``cpu_profile``) has its
        #: own, relative to one GPU's samples/s at its requested batch on its requested GPUs:
        #: at its GPUs' share of the cores it then runs at the profile's speed there, and at
        #: the profile's ideal cores its speed-up over that is the profile's, as in Synergy.
        self.inputs: dict[str, InputModel] = {}
        truths: dict[tuple[str, str, float], InputModel] = {}
        if cluster.cpus is not None:
            profiles = read_cpu_profiles() if cpu_profiles is None else cpu_profiles
            for job in self._jobs:
                name, own = job.spec.application, job.spec.cpu_profile
                job.kind = (
                    name,
                    own or APP_PROFILES.get(name, name),
                    self._rate(job) if own else 0.0,
                )
                if job.kind[1] not in profiles:
                    raise AllocatorError(
                        f"job {job.spec.name!r} of application {name!r} has no CPU profile "
                        f"{job.kind[1]!r} (profiles: {', '.join(sorted(profiles))}; the "
                        f"shipped ones are in {PACKAGED_CPU_PROFILES})"
                    )
                if job.kind not in truths:
                    profile = profiles[job.kind[1]]
                    x_ref = job.kind[2] or None
                    truths[job.kind] = input_truth(apps[name], profile, gpu_speed, x_ref)
                job.truth = truths[job.kind]
                if not own:
                    self.inputs[name] = job.truth
        for job in self._jobs:
            if job.spec.duration_s is not None:
                if not (math.isfinite(job.spec.duration_s) and job.spec.duration_s > 0):
                    raise AllocatorError(
                        f"job {job.spec.name!r}: duration_s={job.spec.duration_s}: expected "
                        "a finite number of seconds > 0"
                    )
                job.work_scale = job.spec.duration_s / self._reference_s(job)

    def _requested(self, job: _SimJob) -> tuple[tuple[int, ...], float]:
        """(its GPUs' packed placement, seconds a step) at the job's request."""
        k = min(job.spec.num_replicas, self.cluster.capacity)
        placement = _packed(k, self.cluster.gpus_per_node)
        return placement, job.app.iteration_time(placement, job.spec.batch_size)

    def _rate(self, job: _SimJob) -> float:
        """One GPU's samples/s at the job's request (GPU-bound)."""
        placement, gpu_step = self._requested(job)
        return job.spec.batch_size / gpu_step / sum(placement)

    def _reference_s(self, job: _SimJob) -> float:
        """Seconds its application's work takes on the job's requested GPUs, packed, at its
        requested batch, fed by the cores of those GPUs' share of the cluster (what
        ``WorkloadJob.duration_s`` is measured at)."""
        app, spec = job.app, job.spec
        placement, gpu_step = self._requested(job)
        fed = 1.0
        if job.truth is not None and self.cluster.cpus is not None:
            share = sum(self.cluster.cpus) / self.cluster.capacity
            parts = [(g, share * g) for g in placement]
            fed = _fed(job.truth, parts, spec.batch_size / gpu_step)
        step = gpu_step / fed
        done, total = 0.0, 0.0
        for epoch in range(app.max_epochs):
            total += (app.marks[epoch] - done) * step / app.gain(spec.batch_size, epoch)
            done = float(app.marks[epoch])
        return total

    def _state(self, job: _SimJob, t: float) -> JobState:
        app = job.app
        lo = min(app.init_batch, job.spec.batch_size)
        hi = max(app.max_batch, job.spec.batch_size)
        online = self.learning == "online"
        if online:  # only what the job has run so far; before that, the prior
            model = job.model or _PRIOR
            explored: int | None = max((k[1] for k in job.seen), default=0)
            spanned: int | None = max((k[0] for k in job.seen), default=0)
            noise = app.noise(job.batch, job.epoch) if job.seen else None
        else:  # the oracle: a model fitted offline to every measurement of the application
            model, explored, spanned = app.model, None, None
            noise = app.noise(job.batch, job.epoch)
        truth = job.truth
        if truth is None:
            known = None
        elif online:  # the core counts it ran at, as a sidecar measured them
            seen = job.fed_seen or (self._app_seen.get(job.kind) if self.input_prior else None)
            known = InputModel.of(seen.items()) if seen else None
        else:
            known = truth
        return JobState(
            job.spec.name,
            job.spec.time,
            model,
            requested_gpus=job.spec.num_replicas,
            requested_batch=job.spec.batch_size,
            batch_range=(lo, hi),
            local_bsz_range=app.local_bsz_range,
            noise=noise,
            placement=job.placement,
            batch_size=job.batch,
            restart_s=self.restart_s,
            age_s=t - job.spec.time,
            restarts=job.restarts,
            explored_gpus=explored,
            explored_nodes=spanned,
            attained_gpu_s=job.gpu_seconds,
            input=known,
            remote_max=math.inf if self.cluster.cpus is not None else 0.0,
            done=(
                None
                if self.declared_lengths is None
                else min(job.progress / float(app.marks[app.max_epochs - 1]) / job.declared, 1.0)
            ),
        )

    def _observe(self, job: _SimJob) -> None:
        point = job.app.measure(job.placement, job.batch)
        key = (point.nodes, point.replicas, point.local_bsz)
        if key not in job.seen:
            job.seen[key] = point
            job.model = _fit_observed(tuple(job.seen.values()))
        truth = job.truth
        if truth is not None:
            for g, c in zip(job.placement, job.cores, strict=True):
                if g <= 0:
                    continue
                cores = round(self._effective(job, truth, g, c) / g, 2)  # each GPU's loader's
                if cores > 0:  # what the node's sidecar measured, the newest kept
                    for seen in (job.fed_seen, self._app_seen.setdefault(job.kind, {})):
                        seen.pop(cores, None)
                        seen[cores] = truth.rate(cores)
            for seen in (job.fed_seen, self._app_seen.get(job.kind, {})):
                while len(seen) > MAX_INPUT_POINTS:
                    del seen[next(iter(seen))]

    def _feed(self, job: _SimJob, gpu_step: float) -> tuple[float, float]:
        """(the share of its GPUs' samples/s its pipeline feeds, the cores it uses) at
        ``gpu_step`` seconds per step on its GPUs; (1, 0) with unlimited CPUs. Every node must
        feed its GPUs' part of each step: the slowest-fed node sets the pace."""
        truth = job.truth
        if truth is None:
            return 1.0, 0.0
        k, wanted = job.gpus, job.batch / gpu_step
        parts = [
            (g, self._effective(job, truth, g, c))
            for g, c in zip(job.placement, job.cores, strict=True)
            if g > 0
        ]
        fed = _fed(truth, parts, wanted)
        used = sum(min(c, feed_cores(truth, g, wanted * fed * g / k)) for g, c in parts)
        return fed, used

    def _effective(self, job: _SimJob, truth: InputModel, gpus: int, cores: float) -> float:
        """The cores feeding a job's ``gpus`` GPUs on one node: the node's ``cores`` for it
        plus, with remote workers, that part's share of its pool cores at the pool's
        efficiency, less what receiving their batches costs the node (its samples' MB times
        :data:`POOL_COST_S_PER_MB`, each second of samples from the pool)."""
        if not job.remote or not job.gpus:
            return cores
        pooled = self.cluster.pool_efficiency * job.remote * gpus / job.gpus
        moved = feed_rate(truth, gpus, cores + pooled) - feed_rate(truth, gpus, cores)
        mb = SAMPLE_MB.get(job.spec.application, 0.0)
        return max(cores - moved * mb * POOL_COST_S_PER_MB, 0.0) + pooled

    def _advance(self, job: _SimJob, t: float, dt: float) -> None:
        k = job.gpus
        if not k or job.end is not None:
            return
        start = t
        pause = min(job.restart_left, dt)
        job.restart_left -= pause
        job.restart_s += pause
        job.gpu_seconds += pause * k
        t, left = t + pause, dt - pause
        app = job.app
        packed = _packed(k, self.cluster.gpus_per_node)
        if left > 0 and self.learning == "online":
            self._observe(job)
        gpu_step = app.iteration_time(job.placement, job.batch)
        fed, cores_used = self._feed(job, gpu_step)
        step = gpu_step / fed if fed > 0 else math.inf
        while left > 0 and job.end is None:
            rate = app.gain(job.batch, job.epoch) / step / job.work_scale
            need = (app.marks[job.epoch] - job.progress) / rate if rate > 0 else math.inf
            run = min(need, left)
            job.progress += rate * run
            job.gpu_seconds += run * k
            job.cpu_seconds += run * cores_used
            job.remote_seconds += run * job.remote
            job.input_s += run * (1.0 - fed)
            if packed != placement_key(job.placement):  # its share of the GPU time, then input
                lost = max(1.0 - app.iteration_time(packed, job.batch) / gpu_step, 0.0)
                job.placement_s += run * fed * lost
            t += run
            left -= run
            if need <= run:
                job.progress = float(app.marks[job.epoch])
                job.epoch += 1
                if job.epoch >= app.max_epochs:
                    job.end = t
        job.held_s += t - start

    def run(
        self,
        *,
        max_time_s: float | None = None,
        on_step: Callable[[float, int, int], None] | None = None,
    ) -> SimResult:
        """Runs until every job completes (or ``max_time_s``).

        Args:
            max_time_s: stop the clock here (jobs still running count as not completed).
            on_step: called after each interval with (time, jobs completed, jobs total).
        """
        jobs = self._jobs
        total = len(jobs)
        times: list[float] = []
        gpus: dict[str, list[int]] = {j.spec.name: [] for j in jobs}
        optimizer_ms: list[float] = []
        t = math.floor(jobs[0].spec.time / self.interval_s) * self.interval_s if jobs else 0.0
        done = 0
        while done < total and (max_time_s is None or t < max_time_s):
            active = [j for j in jobs if j.spec.time <= t and j.end is None]
            if active:
                began = time.perf_counter()
                decision = self.policy.decide([self._state(j, t) for j in active], self.cluster)
                optimizer_ms.append((time.perf_counter() - began) * 1e3)
                if decision.waiting and not decision.placements:  # an empty cluster, yet none fits
                    head = decision.waiting[0]
                    raise AllocatorError(
                        f"job {head} can never start on {self.cluster.capacity} GPUs: "
                        f"{decision.reasons.get(head, '')}"
                    )
                self._apply(active, decision, t)
            times.append(t)
            for j in jobs:
                gpus[j.spec.name].append(j.gpus if j.end is None else 0)
            for j in active:
                self._advance(j, t, self.interval_s)
            for j in active:
                if j.end is not None:
                    j.placement = ()
                    done += 1
            t += self.interval_s
            if on_step is not None:
                on_step(t, done, total)
        return SimResult(
            self.policy.name,
            self.cluster.nodes,
            self.interval_s,
            self.restart_s,
            [self._record(j) for j in jobs],
            times,
            gpus,
            optimizer_ms,
            self.cluster.cpus,
            self.cluster.pool,
        )

    def _apply(self, active: list[_SimJob], decision: ClusterDecision, t: float) -> None:
        placements, batches, cores = decision.placements, decision.batch_sizes, decision.cores
        pool = sum(decision.remote.values())
        lent = decision.lent or (0.0,) * len(self.cluster.nodes)
        if len(lent) != len(self.cluster.nodes) or min(lent) < 0:
            raise AllocatorError(f"policy {self.policy.name} lent {lent}: one count >= 0 a node")
        if pool > (self.cluster.pool + sum(lent)) * (1 + 1e-6) + 1e-9:
            raise AllocatorError(
                f"policy {self.policy.name} gave out {pool:g} pool cores of "
                f"{self.cluster.pool:g} and {sum(lent):g} lent"
            )
        per_node = [0] * len(self.cluster.nodes)
        for p in placements.values():
            per_node = [a + b for a, b in zip(per_node, p, strict=True)]
        if any(u > c for u, c in zip(per_node, self.cluster.nodes, strict=True)):
            raise AllocatorError(f"policy {self.policy.name} over-allocated a node: {per_node}")
        if self.cluster.cpus is not None:
            if not cores:  # a policy blind to CPUs: the GPU-proportional division
                cores = proportional_cores(placements, self.cluster)
            used = [0.0] * len(self.cluster.nodes)
            for job_id in placements:
                if job_id not in cores:
                    raise AllocatorError(f"policy {self.policy.name} gave job {job_id} no cores")
                used = [a + b for a, b in zip(used, cores[job_id], strict=True)]
            used = [a + b for a, b in zip(used, lent, strict=True)]
            if any(u > c * (1 + 1e-6) + 1e-9 for u, c in zip(used, self.cluster.cpus, strict=True)):
                raise AllocatorError(
                    f"policy {self.policy.name} gave out more cores than a node has: {used} "
                    f"of {self.cluster.cpus} (lent ones included)"
                )
        elif any(lent):
            raise AllocatorError(f"policy {self.policy.name} lent cores of unlimited nodes")
        for j in active:
            j.cores = cores.get(j.spec.name, ()) if self.cluster.cpus is not None else ()
            j.remote = decision.remote.get(j.spec.name, 0.0) if j.spec.name in placements else 0.0
        for j in active:
            new = placements.get(j.spec.name, ())
            if new != j.placement:
                if new:
                    j.restart_left = self.restart_s
                    j.restarts += j.start is not None
                    if j.start is None:
                        j.start = t
                j.placement = new
            b = batches.get(j.spec.name, j.batch)
            if new and b != j.batch:
                j.batch_changes += 1
                j.batch = b
        if self.pooled_cores:
            self._pool_cores([j for j in active if j.placement])

    def _pool_cores(self, placed: list[_SimJob]) -> None:
        """``pooled_cores``: the cluster's cores divided across ``placed`` by true need (see
        :class:`Simulator`): :func:`divide_cores` on one node holding every GPU and core, each
        job's cores then split over its nodes by its GPUs there."""
        if not placed:
            return
        need = {
            j.spec.name: feed_cores(
                cast(InputModel, j.truth),  # pooled cores need cores per node
                j.gpus,
                j.batch / j.app.iteration_time(j.placement, j.batch),
            )
            for j in placed
        }
        whole = Cluster((self.cluster.capacity,), (float(sum(self.cluster.cpus or ())),))
        got = divide_cores({j.spec.name: (j.gpus,) for j in placed}, need, {}, whole)
        for j in placed:
            (c,) = got[j.spec.name]
            j.cores = tuple(c * g / j.gpus for g in j.placement)
            j.remote = 0.0  # cores lent across nodes are in the pool already

    @staticmethod
    def _record(j: _SimJob) -> SimJobResult:
        return SimJobResult(
            j.spec.name,
            j.spec.application,
            j.spec.time,
            j.start,
            j.end,
            None if j.end is None else j.end - j.spec.time,
            j.restarts,
            j.batch_changes,
            j.gpu_seconds,
            j.gpus,
            j.batch,
            (j.end - j.spec.time - j.held_s) if j.end is not None else 0.0,
            j.restart_s,
            j.placement_s,
            j.cpu_seconds,
            j.input_s,
            j.remote_seconds,
        )
