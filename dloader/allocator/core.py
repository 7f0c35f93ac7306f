"""The live allocator, transport-free: requests, who may make them, and the autoscaler loop.

Every ``interval_s`` and soon after each event (a job submitted or completed, a node registered
or its free GPUs changed) the loop runs the policy (:mod:`.policies`, the same code the
simulator runs) over the active jobs in submission order and the nodes' usable GPUs. The policy
runs in a worker thread over a snapshot of the jobs' states, so no request waits for a decision;
the event loop then applies the result (jobs that ended meanwhile are skipped, jobs that arrived
meanwhile wait for the next decision, which their arrival has already asked for). A decision
bumps the version, is logged with each changed job's reason (SQLite, one transaction, and the
log) and goes to every watcher. In dry-run mode the decision is published as a recommendation
and nothing is applied: jobs keep the allocation they had, for schedulers that keep control.

The parts: :mod:`.jobs` (a submitted job, its model fit, the policy's view of it),
:mod:`.nodes` (the node registry and rendezvous ports), :mod:`.store` (the state file), the
messages in :mod:`dloader._shared.allocator_messages`.

Jobs learn where they run by watching (``WatchAllocations``): node sidecars apply batch-size
changes to the job's loaders, and ``dloader-launch`` restarts a job under torchrun when its GPU
count changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from dloader._daemon.peer import Role, Shares, current_caller, require, same_token
from dloader._daemon.streams import Mailbox, Streams
from dloader._shared.allocator_messages import (
    MAX_GPUS,
    MAX_JOBS_PER_REPORT,
    MAX_MEASUREMENTS_PER_CALL,
    MAX_PRIORITY,
    Allocation,
    AllocationSet,
    GradientStats,
    JobSpec,
    Measurement,
    NodeJobReport,
    job_key,
    key_digest,
    split_batch,
)
from dloader.allocator.config import STORED_SETTINGS, Settings
from dloader.allocator.jobs import (
    MAX_MEASUREMENTS,
    SubmittedJob,
    fit_model,
    gradient_noise,
    unusable,
)
from dloader.allocator.nodes import DEFAULT_RENDEZVOUS_PORTS, Node, NodeRegistry
from dloader.allocator.optimizer import Cluster
from dloader.allocator.policies import JobState, Policy, make_policy
from dloader.allocator.policies.cores import borrowed_cores
from dloader.allocator.store import AllocatorStore, placement_of, service_of
from dloader.errors import (
    AlreadyExists,
    DLoaderError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    finite_within,
    shown,
)
from dloader.predictor import InputModel, ScalingModel

__all__ = ["DEFAULT_RENDEZVOUS_PORTS", "MAX_ACTIVE_JOBS", "AllocatorCore", "Settings"]

log = logging.getLogger(__name__)

_DEBOUNCE_S = 0.05  # events within this window share one decision
_PRUNE_PERIOD_S = 600.0  # how often the state file's old history is pruned (AllocatorStore.prune)
MAX_ACTIVE_JOBS = 100_000  # jobs submitted and not completed
OPERATOR_RESERVE = 1_000  # of those, kept for operators: other callers together hold the rest
MAX_JOBS_PER_CALLER = 1_000  # active jobs of one caller who is not an operator (a uid, a token)


@dataclass(frozen=True)
class _Inputs:
    """What one decision is made from, taken on the event loop (the policy's thread reads only
    this)."""

    policy: Policy
    node_ids: list[str]
    cluster: Cluster | None
    jobs: list[SubmittedJob]
    states: list[JobState]


@dataclass(frozen=True)
class _Outcome:
    """The policy's answer, not yet applied."""

    placements: dict[str, dict[str, int]]
    batch_sizes: dict[str, int]
    reasons: dict[str, str]
    ms: float
    cores: dict[str, dict[str, float]] = field(default_factory=dict)
    """Each job's cores per node id (empty: the nodes' cores are not limited)."""
    remote: dict[str, float] = field(default_factory=dict)
    """Each job's cores of the CPU pool (its remote loader workers), lent ones included."""
    lent: dict[str, dict[str, float]] = field(default_factory=dict)
    """Of those, each job's cores lent by other nodes, by node id (``goodput-dp-lend``)."""


@functools.lru_cache(maxsize=4096)
def _digest_of(token: str) -> str:
    """The key digest each allocation of the job with ``token`` carries (hashed once)."""
    return key_digest(job_key(token)) if token else ""


def _plan(inp: _Inputs) -> _Outcome | None:
    """Runs the policy (in a worker thread; reads nothing but ``inp``). None: the policy failed
    for every job, keep the last allocation."""
    began = time.perf_counter()
    if inp.cluster is None or not inp.jobs:
        reasons = {j.job_id: "waiting: no node has free GPUs" for j in inp.jobs}
        return _Outcome({}, {}, reasons, 0.0)
    aside: dict[str, str] = {}
    try:
        d = inp.policy.decide(inp.states, inp.cluster)
    except Exception:  # any error: one job must never stop the decisions for the others
        # find the jobs the policy cannot decide for on this cluster, set them aside with the
        # reason, decide the rest
        aside = {
            s.job_id: why
            for s in inp.states
            if (why := unusable(inp.policy, s, inp.cluster)) is not None
        }
        try:
            if not aside:
                raise
            d = inp.policy.decide([s for s in inp.states if s.job_id not in aside], inp.cluster)
        except Exception:
            log.exception("policy %s failed; keeping the last allocation", inp.policy.name)
            return None
        for jid, why in aside.items():
            log.error("job %s set aside: the policy cannot place it: %s", jid, why)
    ids = inp.node_ids
    placements = {
        k: {n: g for n, g in zip(ids, p, strict=True) if g} for k, p in d.placements.items()
    }
    cores = {k: {n: c for n, c in zip(ids, v, strict=True) if c > 0} for k, v in d.cores.items()}
    lent = {
        k: {n: c for n, c in zip(ids, v, strict=True) if c > 0}
        for k, v in borrowed_cores(d.remote, d.lent).items()
    }
    reasons = dict(d.reasons)
    for jid, why in aside.items():
        reasons[jid] = f"set aside: the policy cannot place it ({why})"
    ms = (time.perf_counter() - began) * 1e3
    return _Outcome(placements, dict(d.batch_sizes), reasons, ms, cores, dict(d.remote), lent)


class AllocatorCore:
    """Jobs and nodes of a cluster, and the decisions of the policy over them."""

    def __init__(
        self,
        store: AllocatorStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        node_timeout_s: float = 0.0,
        rendezvous_ports: tuple[int, int] = DEFAULT_RENDEZVOUS_PORTS,
    ) -> None:
        """Args:
        store: the state database (jobs, nodes and allocations are restored from it).
        settings: policy, interval, dry run, default restart cost.
        clock: seconds (wall clock; a fake in tests).
        node_timeout_s: a node that neither registers nor reports for this long loses its
            GPUs from the pool until it reports again (0: never).
        rendezvous_ports: ``(first, last)`` TCP ports handed out, in turn, for the rendezvous
            of jobs that span nodes (each placement of such a job gets the next free one).
        """
        self.store = store
        self.settings = settings  # resolved against the stored Configure by the config
        self._policy: Policy = make_policy(self.settings.policy)
        self._clock = clock
        self._pruned_at = -math.inf  # when the state file's history was last pruned
        self.nodes = NodeRegistry(
            {
                # restored nodes get a full timeout to report again
                n.node_id: Node(
                    n.gpus, n.free, n.address, clock(), host=n.host, cpus=n.cpus, lends=n.lends
                )
                for n in store.nodes()
            },
            clock=clock,
            timeout_s=node_timeout_s,
            rendezvous_ports=rendezvous_ports,
        )
        self.jobs: dict[str, SubmittedJob] = {}
        self._seq = store.max_seq()
        for row in store.active_jobs():  # a restart keeps every job and its allocation
            try:
                spec = JobSpec.from_json(row.spec)
                # the fitted model is stored: a restart does not refit every job
                model = ScalingModel.from_dict(json.loads(row.model)) if row.model else None
                job = SubmittedJob(
                    spec,
                    row.seq,
                    model or fit_model(spec),
                    gradient_noise(spec.gradient, "job.gradient"),
                    row.token,
                    placement_of(row.placement),
                    row.batch_size,
                    generation=row.generation,
                    rendezvous=row.rendezvous,
                    submitted_at=row.submitted_at,
                    owner=row.owner,
                )
                job.restore_service(service_of(row))
            except (ValueError, TypeError, KeyError, DLoaderError) as exc:
                # one row that no longer validates must not keep the allocator down
                store.set_aside(row.job_id)
                log.error(
                    "state database %s: jobs row %s no longer validates (%s); it is set aside: "
                    "kept in the file, not scheduled (resubmit it under a new id)",
                    store.path,
                    shown(row.job_id),
                    exc,
                )
                continue
            self.jobs[spec.job_id] = job
        self._reasons: dict[str, str] = {}
        self._recommended: dict[str, tuple[dict[str, int], int]] = {}
        self._watchers: Streams[AllocationSet] = Streams("WatchAllocations")
        self._wake = asyncio.Event()
        self._snapshot = self._current(0, 0.0)

    # ------------------------------------------------------------------ jobs

    def prepare(self, spec: JobSpec) -> SubmittedJob:
        """A submission checked and its model fitted, not yet queued: the CPU-heavy half of
        :meth:`submit`, which the servicer runs off the event loop (it changes nothing)."""
        spec = spec.normalised(self.settings.restart_s)
        job = SubmittedJob(spec, 0, fit_model(spec), gradient_noise(spec.gradient, "job.gradient"))
        self._check_usable(job)
        return job

    def commit(self, job: SubmittedJob) -> tuple[str, int, str]:
        """Queues a prepared job; returns its id, its position among jobs not yet running, and
        its token (the credential for :meth:`update` and :meth:`complete`)."""
        spec = job.spec
        require(Role.CLIENT, "SubmitJob")
        if spec.job_id in self.jobs or self.store.known_job(spec.job_id):
            raise AlreadyExists("job.job_id", f"{shown(spec.job_id)} was already submitted")
        job.owner = self._check_room()
        self._seq += 1
        job.seq = self._seq
        job.submitted_at = self._clock()
        job.token = secrets.token_hex(16)
        self.jobs[spec.job_id] = job
        self.store.add_job(
            spec.job_id,
            job.seq,
            spec.to_json(),
            _model_json(job.model),
            job.token,
            job.submitted_at,
            job.owner,
        )
        most = "any" if spec.max_gpus >= MAX_GPUS else str(spec.max_gpus)
        log.info(
            "job %s submitted (%d-%s GPUs, batch %d)",
            spec.job_id,
            spec.min_gpus,
            most,
            spec.batch_size,
        )
        self._wake.set()
        return spec.job_id, sum(1 for j in self.jobs.values() if not j.placement) - 1, job.token

    def _check_room(self) -> str:
        """The caller as a job's owner ("": an operator), if it may hold one more active job:
        the table is not full; and, for a caller who is not an operator, neither the callers'
        part of it (the last ``OPERATOR_RESERVE`` places are the operators') nor its own
        ``MAX_JOBS_PER_CALLER`` is. Else RESOURCE_EXHAUSTED."""
        owner = current_caller().owner
        # read at each call: tests make the caps small
        shares = Shares(MAX_ACTIVE_JOBS, OPERATOR_RESERVE, MAX_JOBS_PER_CALLER)
        refused = shares.refusal(
            Counter(j.owner or None for j in self.jobs.values()), owner or None
        )
        if refused is not None:
            bound, n = refused
            raise ResourceExhausted(
                "job.job_id",
                {
                    "all": f"{n} active jobs, the most allowed",
                    "users": f"callers hold {n} active jobs, the most they may (the last "
                    f"{OPERATOR_RESERVE} places are kept for operators)",
                    "owner": f"{owner} holds {n} active jobs, the most one caller may",
                }[bound],
            )
        return owner

    def submit(self, spec: JobSpec) -> tuple[str, int, str]:
        """Queues a job (:meth:`prepare` then :meth:`commit`)."""
        return self.commit(self.prepare(spec))

    def _unusable(self, job: SubmittedJob) -> str | None:
        """Why the policy cannot decide for ``job`` alone, on its minimum GPUs and, where
        nodes are registered, on this cluster (its cores included)."""
        state = job.state([], self._clock())
        why = unusable(self._policy, state)
        if why is None and (cluster := self.nodes.cluster()[1]) is not None:
            why = unusable(self._policy, state, cluster)
        return why

    def _check_usable(self, job: SubmittedJob) -> None:
        """INVALID_ARGUMENT naming the field if the policy cannot use the job's model."""
        why = self._unusable(job)
        if why is None:
            return
        field = "job.measurements" if len(job.spec.measurements) >= 2 else "job.scaling"
        if job.noise is not None and self._unusable(replace(job, noise=None)) is None:
            field = "job.gradient"
        raise InvalidArgument(field, f"the job's model is unusable by the policy: {why}")

    def owned(self, job_id: str, token: str, action: str) -> SubmittedJob:
        """An active job the caller may act on. Identity decides, then the token:

        * a token that is given must be the job's, whoever calls (an operator's launcher checks
          its token file with an empty UpdateJob; a wrong one must not pass for the operator);
        * an operator may act on any job without a token (``dloaderctl``, the daemon's loops);
        * a job an operator submitted is acted on by operators only: its token alone (leaked,
          or read from a file another user made) is not enough;
        * otherwise the holder of the job's token who is also the user who submitted it, where
          both are known as users (by uid on the Unix socket, by client certificate on TCP): a
          token that leaked to another user is not enough."""
        job = self.get(job_id)
        caller = current_caller()
        if token and not same_token(job.token, token):
            raise PermissionDenied(
                "token", f"{action} of job {shown(job_id)}: the token given is not the job's"
            )
        if caller.at_least(Role.OPERATOR):
            return job
        if not job.owner:
            raise PermissionDenied(
                "caller",
                f"{action} of job {shown(job_id)}: an operator submitted it, and only an "
                f"operator may act on it; the caller is {caller}",
            )
        if caller.identified and caller.owner != job.owner:
            raise PermissionDenied(
                "caller",
                f"{action} of job {shown(job_id)}: it was submitted by {job.owner}, not by "
                f"{caller}",
            )
        if not token:
            raise PermissionDenied(
                "token", f"{action} of job {shown(job_id)} needs its token (from SubmitJob)"
            )
        return job

    def get(self, job_id: str) -> SubmittedJob:
        """An active job, or NOT_FOUND."""
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound("job_id", f"no active job {shown(job_id)}")
        return job

    def stage_update(
        self,
        job_id: str,
        measurements: Sequence[Measurement],
        gradient: GradientStats | None = None,
        priority: float = 0.0,
        token: str = "",
        done: float = 0.0,
    ) -> SubmittedJob:
        """The job as it would be after the update (refitted, checked), not yet applied: the
        CPU-heavy half of :meth:`update`, which the servicer runs off the event loop. ``done``
        is checked here and applied by :meth:`apply_update` (not carried in the staged copy,
        whose share a node's report may outdate meanwhile)."""
        job = self.owned(job_id, token, "UpdateJob")
        if done:
            finite_within("done", done, 0.0, 1.0)
        return self._staged(job, measurements, gradient, priority)

    def _staged(
        self,
        job: SubmittedJob,
        measurements: Sequence[Measurement],
        gradient: GradientStats | None,
        priority: float = 0.0,
    ) -> SubmittedJob:
        spec = job.spec
        if len(measurements) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "measurements",
                f"{len(measurements)} measurements: at most {MAX_MEASUREMENTS_PER_CALL} per call",
            )
        noise = gradient_noise(gradient, "gradient") if gradient is not None else job.noise
        if priority:
            spec = replace(spec, priority=finite_within("priority", priority, 1e-3, MAX_PRIORITY))
        model = job.model
        if measurements:
            spec = replace(
                spec, measurements=(*spec.measurements, *measurements)[-MAX_MEASUREMENTS:]
            )
            model = fit_model(spec)
        if gradient is not None:
            spec = replace(spec, gradient=gradient)
        staged = replace(job, spec=spec, model=model, noise=noise)
        if model is not job.model or noise is not job.noise:
            why = self._unusable(staged)
            if why is not None:
                raise InvalidArgument(
                    "measurements" if measurements else "gradient",
                    f"the update would make the job's model unusable by the policy: {why}",
                )
        return staged

    def apply_update(self, staged: SubmittedJob, done: float = 0.0) -> None:
        """Applies an update from :meth:`stage_update` and the share ``done`` it checked (0:
        unchanged); NOT_FOUND if the job ended meanwhile."""
        job = self.get(staged.job_id)
        refit = staged.model is not job.model
        job.spec, job.model, job.noise = staged.spec, staged.model, staged.noise
        if done:
            job.report_done(done)
        self.store.update_spec(
            job.job_id, job.spec.to_json(), _model_json(job.model) if refit else None
        )

    def update(
        self,
        job_id: str,
        measurements: Sequence[Measurement],
        gradient: GradientStats | None = None,
        priority: float = 0.0,
        token: str = "",
        done: float = 0.0,
    ) -> None:
        """Adds measurements (refitting the model), replaces gradient statistics, priority or
        the share of its declared work done (``done``, (0, 1]; 0: unchanged)."""
        staged = self.stage_update(job_id, measurements, gradient, priority, token, done)
        self.apply_update(staged, done)

    def complete(self, job_id: str, failed: bool = False, token: str = "") -> None:
        """Ends a job and frees its GPUs (an operator, or the holder of the job's token)."""
        job = self.owned(job_id, token, "CompleteJob")
        del self.jobs[job_id]
        self.store.complete_job(job_id, failed)
        why = "failed or cancelled: GPUs freed" if failed else "completed: GPUs freed"
        self.store.add_decisions(
            self._snapshot.version, [(job_id, 0, {}, job.batch_size, why)], self.settings.dry_run
        )
        log.info("job %s %s", job_id, "failed" if failed else "completed")
        self._wake.set()

    # ------------------------------------------------------------------ nodes

    def register_node(
        self,
        node_id: str,
        gpus: int,
        address: str = "",
        host: str = "",
        cpus: float = 0.0,
        lends: bool = False,
    ) -> None:
        """Adds a node (or updates its GPU count); nodes and operators only.

        ``host``: where the launchers of other nodes reach this node's launcher for a job's
        rendezvous (a hostname or IP address; "": the node id). ``cpus``: the cores its jobs'
        input pipelines may use (0: not limited). ``lends``: its Ray node hosts other nodes'
        jobs' remote loader workers (``goodput-dp-lend`` may lend its spare cores)."""
        require(Role.NODE, "RegisterNode")
        self.nodes.register(node_id, gpus, address, host, cpus, lends)
        self.store.upsert_node(node_id, gpus, gpus, address, host, cpus, lends)
        cores = f" and {cpus:g} cores{' it may lend' if lends else ''}" if cpus else ""
        log.info("node %s registered with %d GPU(s)%s", node_id, gpus, cores)
        self._wake.set()

    def report_node(self, node_id: str, free: int, jobs: Sequence[NodeJobReport]) -> None:
        """A node's usable GPUs and, per job on it, samples/s, batch, measurements, gradient,
        share of its declared epochs done; nodes and operators only."""
        require(Role.NODE, "ReportNode")
        node = self.nodes.get(node_id)
        if len(jobs) > MAX_JOBS_PER_REPORT:
            raise InvalidArgument("jobs", f"{len(jobs)} jobs: at most {MAX_JOBS_PER_REPORT}")
        if sum(len(r.measurements) for r in jobs) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "jobs.measurements", f"at most {MAX_MEASUREMENTS_PER_CALL} measurements per call"
            )
        for r in jobs:
            rate = r.samples_per_second
            if not (math.isfinite(rate) and rate >= 0):
                raise InvalidArgument("jobs.samples_per_second", f"{rate} must be >= 0")
            job = self.get(r.job_id)
            job.samples_per_second = rate
            if r.input_curve:  # checked on arrival (NodeJobReport.from_pb)
                job.input = InputModel.of(r.input_curve)
            if r.remote_cores_max or node_id in job.remote_max:
                job.remote_max[node_id] = r.remote_cores_max
            if r.done:  # checked on arrival (NodeJobReport.from_pb)
                job.report_done(r.done)
            if r.measurements or r.gradient is not None:
                # a node reports for the jobs on it: its role, not the job's token, allows it
                self.apply_update(self._staged(job, r.measurements, r.gradient))
        if self.nodes.report(node_id, free):
            self._wake.set()
        self.store.upsert_node(
            node_id, node.gpus, free, node.address, node.host, node.cpus, node.lends
        )

    def configure(
        self,
        policy: str = "",
        interval_s: float = 0.0,
        restart_s: float = 0.0,
        dry_run: bool | None = None,
    ) -> Settings:
        """Changes the policy, interval, default restart cost or dry-run mode; decides at once.
        Operators only."""
        require(Role.OPERATOR, "Configure")
        s = Settings(
            policy or self.settings.policy,
            interval_s or self.settings.interval_s,
            self.settings.dry_run if dry_run is None else dry_run,
            restart_s or self.settings.restart_s,
        )
        self.settings = s
        self._policy = make_policy(s.policy)
        self.store.set_setting(STORED_SETTINGS, s.to_json())
        log.info("settings: %s", s)
        self._wake.set()
        return s

    # ------------------------------------------------------------------ decisions

    def _inputs(self) -> _Inputs:
        ids, cluster = self.nodes.cluster()
        jobs = sorted(self.jobs.values(), key=lambda j: j.seq)
        now = self._clock()
        for j in jobs:
            j.count_service(now)
        return _Inputs(self._policy, ids, cluster, jobs, [j.state(ids, now) for j in jobs])

    def decide(self) -> AllocationSet:
        """Runs the policy once, here; applies (unless dry-run), logs and publishes the result.
        (The loop, :meth:`run`, runs the policy in a worker thread instead.)"""
        inputs = self._inputs()
        return self._apply(inputs, _plan(inputs))

    def _apply(self, inputs: _Inputs, outcome: _Outcome | None) -> AllocationSet:
        """Applies a decision on the event loop: the jobs still active get their new placement
        (unless dry-run); the change is stored, logged and published."""
        if outcome is None:
            return self._snapshot
        dry = self.settings.dry_run
        reasons = dict(outcome.reasons)
        changed = []
        applied = []
        for job in inputs.jobs:
            jid = job.job_id
            if self.jobs.get(jid) is not job:
                continue  # completed while the policy ran
            new = outcome.placements.get(jid, {})
            batch = outcome.batch_sizes.get(jid, job.batch_size)
            if not dry:
                job.cores = outcome.cores.get(jid, {}) if new else {}
                job.remote_cpus = outcome.remote.get(jid, 0.0) if new else 0.0
                job.lent_cpus = outcome.lent.get(jid, {}) if new else {}
            if new == job.placement and batch == job.batch_size:
                continue
            if not new:
                reasons.setdefault(jid, "waiting: the policy gave it no GPUs")
            changed.append((jid, sum(new.values()), new, batch, reasons.get(jid, "")))
            if not dry:
                if new != job.placement:
                    job.generation += 1
                    taken = (j.rendezvous for j in self.jobs.values() if j is not job)
                    job.rendezvous = self.nodes.rendezvous(jid, new, taken)
                job.placement, job.batch_size = new, batch if new else job.batch_size
                applied.append((jid, job.placement, job.batch_size, job.generation, job.rendezvous))
        version = self._snapshot.version + 1
        # the service counted for this decision (_inputs), so that a restart goes on from it
        self.store.save_service([j.service() for j in inputs.jobs if self.jobs.get(j.job_id) is j])
        if changed:
            self.store.add_decisions(version, changed, dry, applied)
            for jid, g, new, b, why in changed:
                log.info(
                    "%sjob %s: %d GPU(s) %s, batch %d: %s",
                    "[dry run] " if dry else "",
                    jid,
                    g,
                    new,
                    b,
                    why,
                )
        self._reasons = reasons
        self._recommended = {c[0]: (c[2], c[3]) for c in changed} if dry else {}
        self._snapshot = self._current(version, outcome.ms)
        self._watchers.publish(self._snapshot)
        return self._snapshot

    def _current(self, version: int, ms: float) -> AllocationSet:
        views = []
        queue = 0
        rec = self._recommended
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            jid = job.job_id
            nodes, batch = rec.get(jid, (job.placement, job.batch_size))
            pos = 0
            if not nodes:
                pos, queue = queue, queue + 1
            gpus = sum(nodes.values())
            local, steps = split_batch(batch, gpus, job.spec.max_local_batch_size)
            views.append(
                Allocation(
                    jid,
                    gpus,
                    dict(nodes),
                    batch,
                    self._reasons.get(jid, ""),
                    pos,
                    job.rendezvous if jid not in rec else "",
                    job.generation,
                    dict(job.cores) if jid not in rec else {},
                    local,
                    steps,
                    _digest_of(job.token),
                    job.remote_cpus if jid not in rec else 0.0,
                    job.done or 0.0,
                    dict(job.lent_cpus) if jid not in rec else {},
                )
            )
        return AllocationSet(
            version, self.settings.dry_run, self.settings.policy, tuple(views), self._clock(), ms
        )

    def snapshot(self) -> AllocationSet:
        """The latest decision."""
        return self._snapshot

    def open_watch(self) -> Mailbox[AllocationSet]:
        """A new stream of decisions for the current caller (RESOURCE_EXHAUSTED past its share:
        :mod:`dloader._daemon.streams`)."""
        return self._watchers.open()

    async def watch(self, box: Mailbox[AllocationSet]) -> AsyncIterator[AllocationSet]:
        """The latest decision, then the newest one whenever the reader is ready for it (a
        slow reader skips those it missed), until the stream is closed."""
        try:
            yield self._snapshot
            while True:
                yield await box.get()
        finally:
            self._watchers.close(box)

    async def run(self, stop: asyncio.Event) -> None:
        """The autoscaler loop: decide every interval and soon after each event. The policy
        runs in a worker thread; requests are served meanwhile."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.interval_s)
            if stop.is_set():
                return
            await asyncio.sleep(_DEBOUNCE_S)
            self._wake.clear()
            try:
                inputs = self._inputs()
                outcome = await asyncio.to_thread(_plan, inputs)
                self._apply(inputs, outcome)
            except Exception:  # the daemon must outlive a bad decision
                log.exception("allocator loop failed; keeping the last allocation")
            if self._clock() - self._pruned_at >= _PRUNE_PERIOD_S:
                self._pruned_at = self._clock()
                try:
                    await asyncio.to_thread(self.store.prune)
                except Exception:  # the daemon must outlive a failed pruning
                    log.exception("pruning the state file's history failed; retrying later")


def _model_json(model: ScalingModel) -> str:
    return json.dumps(model.to_dict())
