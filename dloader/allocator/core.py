"""The live allocator, transport-free: jobs, nodes and the autoscaler loop around a policy.

Every ``interval_s`` and soon after each event (a job submitted or completed, a node registered
or its free GPUs changed) the loop runs the policy (:mod:`.policies`, the same code the
simulator runs) over the active jobs in submission order and the nodes' usable GPUs. A decision
bumps the version, is logged with each changed job's reason (SQLite and the log) and goes to
every watcher. In dry-run mode the decision is published as a recommendation and nothing is
applied: jobs keep the allocation they had, for schedulers that keep control.

Jobs learn where they run by watching (``WatchAllocations``): node sidecars apply batch-size
changes to the job's loaders, and ``dloader-launch`` restarts a job under torchrun when its GPU
count changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dloader._daemon.peer import Role, current_caller, require, same_token
from dloader.allocator.config import STORED_SETTINGS, Settings
from dloader.allocator.optimizer import Cluster
from dloader.allocator.policies import JobState, Policy, make_policy
from dloader.allocator.store import Store
from dloader.errors import (
    AllocatorError,
    AlreadyExists,
    DLoaderError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    finite_within,
    shown,
)
from dloader.predictor import (
    GradientNoise,
    PredictorError,
    ScalingModel,
    ScalingParams,
    ScalingPoint,
)

__all__ = [
    "AllocationView",
    "AllocatorCore",
    "GradientStats",
    "JobRequest",
    "Measurement",
    "NodeJobReport",
    "Settings",
    "Snapshot",
]

log = logging.getLogger(__name__)

_ID_MAX = 200
#: a hostname, an IPv4 address, or an IPv6 address in brackets (what goes before ":port")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
#: TCP ports handed out for multi-node rendezvous (dloader-allocator --rendezvous-ports)
DEFAULT_RENDEZVOUS_PORTS = (29400, 29999)
_DEBOUNCE_S = 0.05  # events within this window share one decision
_MAX_MEASUREMENTS = 2000  # per job; the oldest are dropped beyond
MAX_MEASUREMENTS_PER_CALL = 1000
MAX_JOBS_PER_REPORT = 1024
MAX_ACTIVE_JOBS = 100_000  # jobs submitted and not completed
MAX_GPUS = 1 << 16  # per job and per cluster
MAX_BATCH = 1 << 24  # samples per global or local batch
MAX_PRIORITY = 1000.0
MAX_SCALING_PARAM = 1e6  # seconds (per step, per sample): far beyond any real job
MAX_GAMMA = 10.0
GRADIENT_RANGE = (1e-30, 1e30)


@dataclass(frozen=True)
class Measurement:
    """One measured step of a job (``dloader.v1.Measurement``); validated on creation."""

    nodes: int
    replicas: int
    local_batch_size: int
    step_s: float
    sync_s: float = 0.0
    """The gradient-synchronisation part of ``step_s`` (0: unknown)."""

    def __post_init__(self) -> None:
        n, r, b = self.nodes, self.replicas, self.local_batch_size
        if not 1 <= n <= r <= MAX_GPUS or not 1 <= b <= MAX_BATCH:
            raise InvalidArgument(
                "measurements",
                f"nodes={n}, replicas={r}, local_batch_size={b}: need 1 <= nodes <= "
                f"replicas <= {MAX_GPUS} and 1 <= local_batch_size <= {MAX_BATCH}",
            )
        step, sync = self.step_s, self.sync_s
        if not (
            math.isfinite(step) and 0 < step <= 86400 and math.isfinite(sync) and 0 <= sync <= step
        ):
            raise InvalidArgument(
                "measurements",
                f"step_seconds={step}, sync_seconds={sync}: need 0 <= sync <= step <= 86400",
            )

    @classmethod
    def from_json(cls, m: list[Any] | dict[str, Any]) -> Measurement:
        """From stored JSON (a dict, or the older 5-item list)."""
        return cls(**m) if isinstance(m, dict) else cls(*m)


@dataclass(frozen=True)
class GradientStats:
    """Gradient-noise statistics of a job at ``base_batch_size`` (``dloader.v1.GradientStats``)."""

    base_batch_size: int
    grad_sqr: float
    grad_var: float


@dataclass(frozen=True)
class NodeJobReport:
    """A node's report of one job running on it."""

    job_id: str
    samples_per_second: float
    batch_size: int = 0
    measurements: tuple[Measurement, ...] = ()
    gradient: GradientStats | None = None


@dataclass
class JobRequest:
    """A submitted job (see ``JobSpec`` in ``allocator.proto`` for the fields and defaults)."""

    job_id: str
    batch_size: int
    min_gpus: int = 0
    max_gpus: int = 0
    requested_gpus: int = 0
    min_batch_size: int = 0
    max_batch_size: int = 0
    min_local_batch_size: int = 0
    max_local_batch_size: int = 0
    priority: float = 0.0
    restart_s: float = 0.0
    scaling: dict[str, float] | None = None
    measurements: list[Measurement] = field(default_factory=list)
    gradient: GradientStats | None = None

    def normalised(self, default_restart_s: float) -> JobRequest:
        """Defaults filled in and every field checked (errors name the field)."""
        jid = self.job_id
        if not jid or len(jid) > _ID_MAX or not jid.isprintable() or jid.strip() != jid:
            raise InvalidArgument(
                "job.job_id", f"{shown(jid)} must be 1-{_ID_MAX} printable characters"
            )
        for name in ("batch_size", "min_batch_size", "max_batch_size"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_BATCH)
        for name in ("min_local_batch_size", "max_local_batch_size"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_BATCH)
        for name in ("min_gpus", "max_gpus", "requested_gpus"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_GPUS)
        if len(self.measurements) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "job.measurements",
                f"{len(self.measurements)} measurements: at most {MAX_MEASUREMENTS_PER_CALL} "
                "per call (send more with UpdateJob)",
            )
        if self.batch_size < 1:
            raise InvalidArgument("job.batch_size", f"{self.batch_size} must be >= 1")
        lo_g = self.min_gpus or 1
        hi_g = self.max_gpus or MAX_GPUS
        if lo_g > hi_g:
            raise InvalidArgument("job.min_gpus", f"{lo_g} is above max_gpus={hi_g}")
        lo_b = self.min_batch_size or self.batch_size
        hi_b = self.max_batch_size or self.batch_size
        if not lo_b <= self.batch_size <= hi_b:
            raise InvalidArgument(
                "job.batch_size",
                f"{self.batch_size} must lie within [min_batch_size={lo_b}, max_batch_size={hi_b}]",
            )
        lo_l = self.min_local_batch_size or 1
        hi_l = self.max_local_batch_size or hi_b
        if lo_l > hi_l:
            raise InvalidArgument(
                "job.min_local_batch_size", f"{lo_l} is above max_local_batch_size={hi_l}"
            )
        prio = self.priority or 1.0
        finite_within("job.priority", prio, 1e-3, MAX_PRIORITY)
        restart = self.restart_s or default_restart_s
        finite_within("job.restart_seconds", restart, 0, 86400)
        return replace(
            self,
            min_gpus=lo_g,
            max_gpus=hi_g,
            requested_gpus=min(max(self.requested_gpus or lo_g, lo_g), hi_g),
            min_batch_size=lo_b,
            max_batch_size=hi_b,
            min_local_batch_size=lo_l,
            max_local_batch_size=hi_l,
            priority=prio,
            restart_s=restart,
        )


def _model(req: JobRequest) -> ScalingModel:
    """The job's scaling model: learned from its measurements (>= 1) as the simulator learns
    online (:meth:`ScalingModel.fit_observed`), else its stated parameters."""
    try:
        points = [
            ScalingPoint(m.nodes, m.replicas, m.local_batch_size, m.step_s, m.sync_s or None)
            for m in req.measurements
        ]
    except PredictorError as exc:
        raise InvalidArgument("job.measurements", str(exc)) from None
    if points:
        try:
            return ScalingModel.fit_observed(points)
        except (PredictorError, ValueError) as exc:
            raise InvalidArgument("job.measurements", f"cannot fit a model: {exc}") from None
    if req.scaling:
        try:
            params = ScalingParams(**req.scaling)
        except TypeError as exc:
            raise InvalidArgument("job.scaling", str(exc)) from None
        for name, value in req.scaling.items():
            if name == "gamma":
                finite_within("job.scaling.gamma", value, 1.0, MAX_GAMMA)
            else:
                finite_within(f"job.scaling.{name}", value, 0.0, MAX_SCALING_PARAM)
        if params.alpha_c + params.beta_c <= 0:
            raise InvalidArgument("job.scaling", "alpha_c + beta_c must be > 0 (compute time)")
        return ScalingModel(params)
    raise InvalidArgument(
        "job.scaling", "need scaling parameters or at least 1 measurement to predict throughput"
    )


def _noise(gradient: GradientStats | None, where: str) -> GradientNoise | None:
    if gradient is None:
        return None
    finite_within(f"{where}.base_batch_size", gradient.base_batch_size, 1, MAX_BATCH)
    finite_within(f"{where}.grad_sqr", gradient.grad_sqr, *GRADIENT_RANGE)
    if gradient.grad_var != 0:
        finite_within(f"{where}.grad_var", gradient.grad_var, *GRADIENT_RANGE)
    try:
        return GradientNoise(gradient.base_batch_size, gradient.grad_sqr, gradient.grad_var)
    except PredictorError as exc:
        raise InvalidArgument(where, str(exc)) from None


@dataclass
class _Job:
    req: JobRequest
    seq: int
    model: ScalingModel
    noise: GradientNoise | None
    token: str = ""
    """The job's credential, returned at submission ("": stored before tokens)."""
    placement: dict[str, int] = field(default_factory=dict)
    batch_size: int = 0
    samples_per_second: float = 0.0
    generation: int = 0
    """How many times its placement changed: its launchers restart into each new one."""
    rendezvous: str = ""
    """``host:port`` of the c10d rendezvous of the current generation while it spans nodes."""
    submitted_at: float | None = None
    """Clock time of its submission (None: restored from the database; its age then counts
    from the allocator's start)."""


@dataclass(frozen=True)
class AllocationView:
    """One job's allocation (or recommendation)."""

    job_id: str
    gpus: int
    nodes: dict[str, int]
    batch_size: int
    reason: str
    queue_position: int = 0
    rendezvous: str = ""
    generation: int = 0


@dataclass(frozen=True)
class Snapshot:
    """The allocations after a decision."""

    version: int
    dry_run: bool
    policy: str
    allocations: tuple[AllocationView, ...]
    decided_at: float = 0.0
    decision_ms: float = 0.0


@dataclass
class _Node:
    gpus: int
    free: int
    address: str
    last_seen: float  # clock of the core
    silent: bool = False  # said to be silent (its GPUs out of the pool)
    host: str = ""  # where other nodes reach it ("": its node id)


class AllocatorCore:
    """Jobs and nodes of a cluster, and the decisions of the policy over them."""

    def __init__(
        self,
        store: Store,
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
        if not node_timeout_s >= 0:
            raise ValueError(f"node_timeout_s={node_timeout_s} must be >= 0 (0: never)")
        first, last = rendezvous_ports
        if not 1 <= first <= last <= 65535:
            raise ValueError(f"rendezvous_ports={rendezvous_ports} must be 1 <= first <= last")
        self._ports = rendezvous_ports
        self._next_port = first
        self.node_timeout_s = node_timeout_s
        self.store = store
        self.settings = settings  # resolved against the stored Configure by the config
        self._policy: Policy = make_policy(self.settings.policy)
        self._clock = clock
        self._started = clock()
        self.jobs: dict[str, _Job] = {}
        self.nodes: dict[str, _Node] = {
            # restored nodes get a full timeout to report again
            n.node_id: _Node(n.gpus, n.free, n.address, clock(), host=n.host)
            for n in store.nodes()
        }
        self._seq = store.max_seq()
        for row in store.active_jobs():  # a restart keeps every job and its allocation
            try:
                req = _request_from_json(row.spec)
                # the fitted model is stored: a restart does not refit every job
                model = ScalingModel.from_dict(json.loads(row.model)) if row.model else _model(req)
                job = _Job(
                    req, row.seq, model, _noise(req.gradient, "job.gradient"), row.token or ""
                )
            except (ValueError, TypeError, KeyError, DLoaderError) as exc:
                # one row that no longer validates must not keep the allocator down
                store.set_aside(row.job_id)
                log.error(
                    "state database %s: job row %s no longer validates (%s); it is set aside: "
                    "kept in the file, not scheduled (resubmit it under a new id)",
                    store.path,
                    shown(row.job_id),
                    exc,
                )
                continue
            job.placement, job.batch_size = row.placement, row.batch_size
            job.generation, job.rendezvous = row.generation, row.rendezvous
            self.jobs[req.job_id] = job
        self._reasons: dict[str, str] = {}
        self._recommended: dict[str, tuple[dict[str, int], int]] = {}
        self._watchers: set[asyncio.Queue[Snapshot]] = set()
        self._wake = asyncio.Event()
        self._snapshot = self._current(0, 0.0)

    # ------------------------------------------------------------------ requests

    def prepare(self, req: JobRequest) -> _Job:
        """A submission checked and its model fitted, not yet queued: the CPU-heavy half of
        :meth:`submit`, which the servicer runs off the event loop (it changes nothing)."""
        req = req.normalised(self.settings.restart_s)
        job = _Job(req, 0, _model(req), _noise(req.gradient, "job.gradient"))
        self._check_usable(job)
        return job

    def commit(self, job: _Job) -> tuple[str, int, str]:
        """Queues a prepared job; returns its id, its position among jobs not yet running, and
        its token (the credential for :meth:`update` and :meth:`complete`)."""
        req = job.req
        require(Role.CLIENT, "SubmitJob")
        if req.job_id in self.jobs or self.store.known_job(req.job_id):
            raise AlreadyExists("job.job_id", f"{shown(req.job_id)} was already submitted")
        if len(self.jobs) >= MAX_ACTIVE_JOBS:
            raise ResourceExhausted("job.job_id", f"{len(self.jobs)} active jobs, the most allowed")
        self._seq += 1
        job.seq = self._seq
        job.submitted_at = self._clock()
        job.token = secrets.token_hex(16)
        self.jobs[req.job_id] = job
        self.store.add_job(
            req.job_id, job.seq, _request_to_json(req), _model_json(job.model), job.token
        )
        most = "any" if req.max_gpus >= MAX_GPUS else str(req.max_gpus)
        log.info(
            "job %s submitted (%d-%s GPUs, batch %d)",
            req.job_id,
            req.min_gpus,
            most,
            req.batch_size,
        )
        self._wake.set()
        return req.job_id, sum(1 for j in self.jobs.values() if not j.placement) - 1, job.token

    def submit(self, req: JobRequest) -> tuple[str, int, str]:
        """Queues a job (:meth:`prepare` then :meth:`commit`)."""
        return self.commit(self.prepare(req))

    def _unusable(self, job: _Job) -> str | None:
        """Why the policy cannot decide for ``job`` alone, on its minimum GPUs (None: it can)."""
        need = max(job.req.min_gpus, 1)
        cluster = Cluster((need,)) if need <= 64 else Cluster.uniform(-(-need // 8), 8)
        state = replace(self._state(job, []), placement=(), batch_size=None)
        try:
            self._policy.decide([state], cluster)
        except AllocatorError as exc:
            return str(exc)
        return None

    def _check_usable(self, job: _Job) -> None:
        """INVALID_ARGUMENT naming the field if the policy cannot use the job's model."""
        why = self._unusable(job)
        if why is None:
            return
        field = "job.measurements" if len(job.req.measurements) >= 2 else "job.scaling"
        if job.noise is not None:
            plain = _Job(job.req, job.seq, job.model, None)
            if self._unusable(plain) is None:
                field = "job.gradient"
        raise InvalidArgument(field, f"the job's model is unusable by the policy: {why}")

    def owned(self, job_id: str, token: str, action: str) -> _Job:
        """An active job the caller may act on: an operator, or the holder of its token."""
        job = self.get(job_id)
        if current_caller().at_least(Role.OPERATOR):
            return job
        if not same_token(job.token, token):
            raise PermissionDenied(
                "token", f"{action} of job {shown(job_id)} needs its token (from SubmitJob)"
            )
        return job

    def get(self, job_id: str) -> _Job:
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
    ) -> _Job:
        """The job as it would be after the update (refitted, checked), not yet applied: the
        CPU-heavy half of :meth:`update`, which the servicer runs off the event loop."""
        job = self.owned(job_id, token, "UpdateJob")
        req = job.req
        if len(measurements) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "measurements",
                f"{len(measurements)} measurements: at most {MAX_MEASUREMENTS_PER_CALL} per call",
            )
        noise = _noise(gradient, "gradient") if gradient is not None else job.noise
        if priority:
            req = replace(req, priority=finite_within("priority", priority, 1e-3, MAX_PRIORITY))
        model = job.model
        if measurements:
            req = replace(
                req, measurements=(req.measurements + list(measurements))[-_MAX_MEASUREMENTS:]
            )
            model = _model(req)
        if gradient is not None:
            req = replace(req, gradient=gradient)
        staged = _Job(req, job.seq, model, noise, job.token)
        if model is not job.model or noise is not job.noise:
            why = self._unusable(staged)
            if why is not None:
                raise InvalidArgument(
                    "measurements" if measurements else "gradient",
                    f"the update would make the job's model unusable by the policy: {why}",
                )
        return staged

    def _stage_for_node(
        self, job_id: str, measurements: Sequence[Measurement], gradient: GradientStats | None
    ) -> _Job:
        """An update a node reports for a job running on it (the caller holds the node role,
        checked by :meth:`report_node`, not the job's token)."""
        job = self.get(job_id)
        return self.stage_update(job_id, measurements, gradient, token=job.token)

    def apply_update(self, staged: _Job) -> None:
        """Applies an update from :meth:`stage_update` (NOT_FOUND if the job ended meanwhile)."""
        job = self.get(staged.req.job_id)
        refit = staged.model is not job.model
        job.req, job.model, job.noise = staged.req, staged.model, staged.noise
        self.store.update_spec(
            job.req.job_id, _request_to_json(job.req), _model_json(job.model) if refit else None
        )

    def update(
        self,
        job_id: str,
        measurements: Sequence[Measurement],
        gradient: GradientStats | None = None,
        priority: float = 0.0,
        token: str = "",
    ) -> None:
        """Adds measurements (refitting the model), replaces gradient statistics or priority."""
        self.apply_update(self.stage_update(job_id, measurements, gradient, priority, token))

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

    def register_node(self, node_id: str, gpus: int, address: str = "", host: str = "") -> None:
        """Adds a node (or updates its GPU count); nodes and operators only.

        ``host``: where the launchers of other nodes reach this node's launcher for a job's
        rendezvous (a hostname or IP address; "": the node id)."""
        require(Role.NODE, "RegisterNode")
        if not node_id or len(node_id) > _ID_MAX or not node_id.isprintable():
            raise InvalidArgument(
                "node_id", f"{shown(node_id)} must be 1-{_ID_MAX} printable chars"
            )
        if not 1 <= gpus <= 1024:
            raise InvalidArgument("gpus", f"{gpus} must be within [1, 1024]")
        if host and not _HOST.fullmatch(host):
            raise InvalidArgument(
                "host", f"{shown(host)} must be a hostname, an IPv4 address or [IPv6 address]"
            )
        self.nodes[node_id] = _Node(gpus, gpus, address, self._clock(), host=host)
        self.store.upsert_node(node_id, gpus, gpus, address, host)
        log.info("node %s registered with %d GPU(s)", node_id, gpus)
        self._wake.set()

    def report_node(
        self,
        node_id: str,
        free: int,
        jobs: Sequence[NodeJobReport],
    ) -> None:
        """A node's usable GPUs and, per job on it, samples/s, batch, measurements, gradient;
        nodes and operators only."""
        require(Role.NODE, "ReportNode")
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFound("node_id", f"node {shown(node_id)} is not registered")
        if not 0 <= free <= node.gpus:
            raise InvalidArgument("free_gpus", f"{free} must be within [0, {node.gpus}]")
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
            if r.measurements or r.gradient is not None:  # a node reports for the jobs on it
                self.apply_update(self._stage_for_node(r.job_id, r.measurements, r.gradient))
        node.last_seen = self._clock()
        if free != node.free or node.silent:
            node.free = free
            self._wake.set()
        self.store.upsert_node(node_id, node.gpus, free, node.address, node.host)

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

    def _usable(self, node_id: str) -> int:
        """GPUs of a node the policy may use: none once it has been silent for the timeout."""
        node = self.nodes[node_id]
        quiet = self._clock() - node.last_seen
        silent = self.node_timeout_s > 0 and quiet > self.node_timeout_s
        if silent != node.silent:
            node.silent = silent
            if silent:
                log.warning("node %s silent for %.0f s: its GPUs leave the pool", node_id, quiet)
            else:
                log.info("node %s reports again: its GPUs rejoin the pool", node_id)
        return 0 if silent else min(node.free, node.gpus)

    def _cluster(self) -> tuple[list[str], Cluster | None]:
        usable = {n: self._usable(n) for n in sorted(self.nodes)}
        ids = [n for n, g in usable.items() if g > 0]
        if not ids:
            return [], None
        return ids, Cluster(tuple(usable[n] for n in ids))

    def _state(self, job: _Job, ids: list[str]) -> JobState:
        r = job.req
        return JobState(
            r.job_id,
            float(job.seq),
            job.model,
            requested_gpus=r.requested_gpus,
            requested_batch=r.batch_size,
            batch_range=(r.min_batch_size, r.max_batch_size),
            local_bsz_range=(r.min_local_batch_size, r.max_local_batch_size),
            min_gpus=r.min_gpus,
            max_gpus=r.max_gpus,
            noise=job.noise,
            priority=r.priority,
            placement=tuple(job.placement.get(n, 0) for n in ids) if job.placement else (),
            batch_size=job.batch_size or None,
            restart_s=r.restart_s,
            age_s=max(self._clock() - (job.submitted_at or self._started), 0.0),
            restarts=max(job.generation - 1, 0),
            # a model learned from measurements is trusted up to twice the GPUs they cover
            explored_gpus=max(m.replicas for m in r.measurements) if r.measurements else None,
        )

    def decide(self) -> Snapshot:
        """Runs the policy once; applies (unless dry-run), logs and publishes the result."""
        ids, cluster = self._cluster()
        jobs = sorted(self.jobs.values(), key=lambda j: j.seq)
        began = time.perf_counter()
        if cluster is None or not jobs:
            placements: dict[str, dict[str, int]] = {}
            batches: dict[str, int] = {}
            reasons = {j.req.job_id: "waiting: no node has free GPUs" for j in jobs}
        else:
            aside: dict[str, str] = {}
            try:
                d = self._policy.decide([self._state(j, ids) for j in jobs], cluster)
            except AllocatorError:
                # One job must never stop the decisions for the others: find the jobs the
                # policy cannot decide for, set them aside with the reason, decide the rest.
                aside = {j.req.job_id: why for j in jobs if (why := self._unusable(j)) is not None}
                rest = [j for j in jobs if j.req.job_id not in aside]
                try:
                    if not aside:
                        raise
                    d = self._policy.decide([self._state(j, ids) for j in rest], cluster)
                except AllocatorError:
                    log.exception(
                        "policy %s failed; keeping the last allocation", self._policy.name
                    )
                    return self._snapshot
                for jid, why in aside.items():
                    log.error("job %s set aside: the policy cannot use its model: %s", jid, why)
            placements = {
                k: {n: g for n, g in zip(ids, p, strict=True) if g} for k, p in d.placements.items()
            }
            batches, reasons = d.batch_sizes, dict(d.reasons)
            for jid, why in aside.items():
                reasons[jid] = f"set aside: its model is unusable ({why})"
        ms = (time.perf_counter() - began) * 1e3
        dry = self.settings.dry_run
        changed = []
        for job in jobs:
            jid = job.req.job_id
            new = placements.get(jid, {})
            batch = batches.get(jid, job.batch_size)
            if new == job.placement and batch == job.batch_size:
                continue
            if not new:
                reasons.setdefault(jid, "waiting: the policy gave it no GPUs")
            changed.append((jid, sum(new.values()), new, batch, reasons.get(jid, "")))
            if not dry:
                if new != job.placement:
                    job.generation += 1
                    job.rendezvous = self._rendezvous(jid, new)
                job.placement, job.batch_size = new, batch if new else job.batch_size
                self.store.set_allocation(
                    jid, job.placement, job.batch_size, job.generation, job.rendezvous
                )
        version = self._snapshot.version + 1
        if changed:
            self.store.add_decisions(version, changed, dry)
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
        self._snapshot = self._current(version, ms)
        for q in self._watchers:
            q.put_nowait(self._snapshot)
        return self._snapshot

    def _rendezvous(self, job_id: str, placement: dict[str, int]) -> str:
        """``host:port`` for a placement over several nodes (its first node hosts it), else "".

        Each new placement gets the next port of the range not used by another job's current
        rendezvous on that host, so that a restart never meets the previous generation's store.
        """
        if len(placement) < 2:
            return ""
        first = min(placement)
        host = self.nodes[first].host if first in self.nodes else ""
        host = host or first
        taken = {
            j.rendezvous for j in self.jobs.values() if j.req.job_id != job_id and j.rendezvous
        }
        lo, hi = self._ports
        for _ in range(hi - lo + 1):
            port, self._next_port = self._next_port, self._next_port + 1
            if self._next_port > hi:
                self._next_port = lo
            if f"{host}:{port}" not in taken:
                return f"{host}:{port}"
        raise AllocatorError(
            f"no free rendezvous port in {lo}-{hi} on {host} for job {job_id}: widen "
            "--rendezvous-ports"
        )

    def _current(self, version: int, ms: float) -> Snapshot:
        views = []
        queue = 0
        rec = self._recommended
        for job in sorted(self.jobs.values(), key=lambda j: j.seq):
            jid = job.req.job_id
            nodes, batch = rec.get(jid, (job.placement, job.batch_size))
            why = self._reasons.get(jid, "")
            pos = 0
            if not nodes:
                pos, queue = queue, queue + 1
            views.append(
                AllocationView(
                    jid,
                    sum(nodes.values()),
                    dict(nodes),
                    batch,
                    why,
                    pos,
                    job.rendezvous if jid not in rec else "",
                    job.generation,
                )
            )
        return Snapshot(
            version, self.settings.dry_run, self.settings.policy, tuple(views), self._clock(), ms
        )

    def snapshot(self) -> Snapshot:
        """The latest decision."""
        return self._snapshot

    async def watch(self) -> AsyncIterator[Snapshot]:
        """The latest decision, then every new one."""
        q: asyncio.Queue[Snapshot] = asyncio.Queue()
        self._watchers.add(q)
        try:
            yield self._snapshot
            while True:
                yield await q.get()
        finally:
            self._watchers.discard(q)

    async def run(self, stop: asyncio.Event) -> None:
        """The autoscaler loop: decide every interval and soon after each event."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.interval_s)
            if stop.is_set():
                return
            await asyncio.sleep(_DEBOUNCE_S)
            self._wake.clear()
            try:
                self.decide()
            except Exception:  # the daemon must outlive a bad decision
                log.exception("allocator loop failed; keeping the last allocation")


def _model_json(model: ScalingModel) -> str:
    return json.dumps(model.to_dict())


def _request_to_json(req: JobRequest) -> bytes:
    return json.dumps(asdict(req)).encode()


def _request_from_json(raw: bytes) -> JobRequest:
    d = json.loads(raw)
    d["measurements"] = [Measurement.from_json(m) for m in d.get("measurements", [])]
    g = d.get("gradient")
    if g is not None:
        d["gradient"] = GradientStats(**g) if isinstance(g, dict) else GradientStats(*g)
    return JobRequest(**d)
