"""Trace-driven cluster simulator: replays a workload under a policy, on measured behaviour.

Every ``interval_s`` the policy (the same code the live service runs) sees the active jobs and
decides placements and batch sizes; then each job advances by the interval on its measured
behaviour (:class:`dloader.allocator.traces.AppTrace`): a change of placement first costs
``restart_s`` seconds (checkpoint, restart, resume), a batch-size change alone costs nothing
(dloader applies it live). Jobs complete mid-interval at the exact moment their progress reaches
the target. Jobs submitted between two decisions wait for the next.

Deterministic: the same workload, traces and settings give the same result.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dloader.allocator.optimizer import DEFAULT_RESTART_S, Cluster
from dloader.allocator.policies import JobState, Policy
from dloader.allocator.traces import AppTrace, WorkloadJob, placement_key
from dloader.errors import AllocatorError
from dloader.predictor import ScalingModel, ScalingParams, ScalingPoint

__all__ = ["LEARNING", "Learning", "SimJobResult", "SimResult", "Simulator"]

Learning = Literal["online", "oracle"]
#: How jobs' throughput models are learned (see :class:`Simulator`).
LEARNING: tuple[Learning, ...] = ("online", "oracle")
#: Before a job has run: throughput proportional to GPUs, the same at every batch size.
_PRIOR = ScalingModel(ScalingParams(0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0))


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
            "restarts": sum(j.restarts for j in self.jobs),
            "batch_changes": sum(j.batch_changes for j in self.jobs),
            "optimizer_ms_p50": float(np.percentile(opt, 50)),
            "optimizer_ms_p99": float(np.percentile(opt, 99)),
            "optimizer_ms_max": float(opt.max()),
        }

    def losses(self) -> dict[str, dict[str, float]]:
        """Per application (completed jobs), where the time went, in mean seconds per job:
        ``jct``, ``queue`` (no GPUs), ``restart``, ``placement`` (lost to spread placements),
        ``run`` (the rest), and ``restarts`` (mean count). JSON-compatible."""
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
            }
            mean["run"] = mean["jct"] - mean["queue"] - mean["restart"] - mean["placement"]
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
            ``oracle``: the model fitted offline to every measurement of its application.
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
    ) -> None:
        if not interval_s > 0 or restart_s < 0:
            raise AllocatorError(f"{interval_s=} must be > 0 and {restart_s=} >= 0")
        if learning not in LEARNING:
            raise AllocatorError(f"learning={learning!r}: expected one of {', '.join(LEARNING)}")
        self.learning = learning
        missing = sorted({j.application for j in workload} - set(apps))
        if missing:
            raise AllocatorError(f"workload uses application(s) {missing} without traces")
        self.policy = policy
        self.cluster = cluster
        self.interval_s = interval_s
        self.restart_s = restart_s
        self._jobs = [_SimJob(w, apps[w.application], w.batch_size) for w in workload]
        self._jobs.sort(key=lambda j: (j.spec.time, j.spec.name))

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
        )

    def _observe(self, job: _SimJob) -> None:
        point = job.app.measure(job.placement, job.batch)
        key = (point.nodes, point.replicas, point.local_bsz)
        if key not in job.seen:
            job.seen[key] = point
            job.model = ScalingModel.fit_observed(list(job.seen.values()))

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
        while left > 0 and job.end is None:
            step = app.iteration_time(job.placement, job.batch)
            rate = app.gain(job.batch, job.epoch) / step
            need = (app.marks[job.epoch] - job.progress) / rate
            run = min(need, left)
            job.progress += rate * run
            job.gpu_seconds += run * k
            if packed != placement_key(job.placement):
                job.placement_s += run * max(1.0 - app.iteration_time(packed, job.batch) / step, 0)
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
                self._apply(active, decision.placements, decision.batch_sizes, t)
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
        )

    def _apply(
        self,
        active: list[_SimJob],
        placements: dict[str, tuple[int, ...]],
        batches: dict[str, int],
        t: float,
    ) -> None:
        per_node = [0] * len(self.cluster.nodes)
        for p in placements.values():
            per_node = [a + b for a, b in zip(per_node, p, strict=True)]
        if any(u > c for u, c in zip(per_node, self.cluster.nodes, strict=True)):
            raise AllocatorError(f"policy {self.policy.name} over-allocated a node: {per_node}")
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
        )
