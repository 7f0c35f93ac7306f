"""The sidecar's core, free of any transport: jobs, reports, models, decisions, directives.

The gRPC servicer (:mod:`dloader.sidecar.server`) only translates messages
(:mod:`dloader._shared.node_messages`) and calls this object. All methods run on one asyncio event
loop; every decision is the pure policy's (:mod:`dloader.sidecar.node_policy`: worker counts, CPU
sets, which report windows teach a model), over the pure models (:mod:`dloader.predictor`). The OS
is reached through small interfaces given to the constructor: process-tree measurement and cgroup
weights (a fake of each in tests), and the list of CPUs to divide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dloader._daemon.peer import Role, Shares, current_caller, require, same_token
from dloader._daemon.streams import Mailbox, Streams
from dloader._shared.allocator_messages import key_digest
from dloader._shared.node_messages import Directive, JobReport, Registration
from dloader.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    finite_within,
    shown,
)
from dloader.predictor import LoaderModel, LoaderObservation, PredictorError
from dloader.sidecar import node_policy as pol
from dloader.sidecar.config import STORED_POLICY, PolicySettings
from dloader.sidecar.monitors import (
    ProcessTreeStats,
    available_memory_bytes,
    host_pids,
    process_owner,
    process_start,
    process_tree_stats,
)
from dloader.sidecar.store import SidecarStore, StoredJob

__all__ = ["CpuWeights", "Directive", "Job", "NodeCore", "PolicySettings"]

log = logging.getLogger(__name__)

#: Processes of a job's tree read beyond the node's worker budget (its training processes,
#: pin-memory and launcher children): a tree is not walked further.
TREE_SLACK = 32

_NAME_MAX = 200
_SAVE_MODEL_EVERY = 5  # reports
_COALESCE_S = 0.2  # after an event, wait this long for more before deciding
_MAX_WORKERS = 4096  # worker processes one loader may report
MAX_JOBS = 256  # registered jobs on one node
OPERATOR_RESERVE = 32  # of those, kept for operators: other users together hold at most the rest
MAX_JOBS_PER_USER = 64  # registered jobs of one local user (operators: no own cap)
JOBS = Shares(MAX_JOBS, OPERATOR_RESERVE, MAX_JOBS_PER_USER)
MAX_PIDS = 64  # training processes one job may name
MAX_GPUS = 64  # GPUs one job may name
_MAIN_CPU_CHANGE = 0.1  # relative change of a job's main-process CPU that calls for a decision
_MEMORY_CHANGE = 0.1  # a worker's peak memory grown by this much: re-decide
_MEMORY_GROWTH = 0.02, 2**20  # (share, bytes) a peak must pass the last mark by to be growth
_MEMORY_FLAT_S = 20.0  # a job's workers' memory has settled after this long without growth
_EWMA = 0.3  # weight of a new measurement of a job's main-process CPU per sample
_CORES_STEP = 0.05  # the cores an observation says a job's workers could use, rounded to this
#: A reported rate below this many samples/s is no throughput at all (a subnormal rate made the
#: trainer's CPU per sample infinite, and every job's decision NaN).
_MIN_RATE = 1e-3
#: The most CPU seconds per sample a job's training process is credited with (whatever its CPU
#: over its rate says): derived numbers stay finite.
_MAX_MAIN_CPU_PER_SAMPLE = 100.0
_MAX_UPKEEP_CORES = 0.05  # a worker's upkeep counted at most (a measurement off by a window)
_PRUNE_PERIOD_S = 600.0  # how often the state file's old history is pruned (SidecarStore.prune)


class CpuWeights(Protocol):
    """Sets the jobs' relative CPU weights (cgroup v2 ``cpu.weight``: :mod:`.cgroups`)."""

    def apply(self, shares: dict[str, tuple[Sequence[int], float]]) -> None:
        """``shares``: job id -> (its training PIDs, its CPU share in cores)."""


@dataclass(frozen=True)
class Walk:
    """One job's processes as :meth:`NodeCore.walk` read them off the event loop."""

    kept: list[tuple[int, int]]
    """The pinned (PID, start time) pairs that still name the process registered."""
    tree: ProcessTreeStats | None
    """The tree of the job's live processes (None: none is left)."""


@dataclass
class Job:
    """A registered job, as the core holds it."""

    record: StoredJob
    model: LoaderModel
    directive: Directive
    last_report: JobReport | None = None
    last_report_at: float = 0.0
    tree: ProcessTreeStats | None = None
    tree_at: float = 0.0  # when ``tree`` was measured (clock of the core)
    cpu_wait_share: float | None = None  # of its workers' time: waiting for a CPU (None: unknown)
    worker_cores: float = 0.0  # cores its workers used in its last report's window
    decision: pol.WorkerDecision | None = None
    reports: int = 0
    directive_at: float = 0.0  # when the worker count last changed (clock of the core)
    initial_workers: int = 0  # the count the job registered with (exploration starts there)
    main_cpu_per_sample: float = 0.0  # CPU seconds the training process spends per sample
    worker_upkeep_cores: float = 0.0  # cores each worker takes beyond its samples' work
    run_length: int = 0  # windows observed in a row at the current worker count
    drift: int = 0  # surprising windows in a row: > 0 faster than predicted, < 0 slower
    registered_at: float = 0.0  # clock of the core
    placed: bool = False  # its model has decided its worker count at least once
    worker_memory_bytes: float = 0.0  # the most private memory (USS) one of its workers held
    worker_memory_bound: float = 0.0  # while that grows: the most one may hold (0: settled)
    memory_mark: float = 0.0  # the workers' peak USS when it last grew
    memory_grew_at: float = -math.inf  # when that was (clock of the core); -inf: never measured
    cpu_target: float = 0.0  # the allocator's cores for it it last started from (0: none)
    watchers: set[Mailbox[Directive | None]] = field(default_factory=set)

    @property
    def job_id(self) -> str:
        return self.record.job_id


class NodeCore:
    """Jobs on one node and the policy that divides the node's loader resources between them."""

    def __init__(
        self,
        store: SidecarStore,
        settings: PolicySettings,
        *,
        tree_stats: Callable[[list[int]], ProcessTreeStats] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pin_cpus: Sequence[int] = (),
        cgroup: CpuWeights | None = None,
        worker_nice: int = 0,
        job_timeout_s: float = 60.0,
        owner_of: Callable[[int], int | None] = process_owner,
        start_of: Callable[[int], int | None] = process_start,
        translate_pids: Callable[[Sequence[int], int], list[int]] = host_pids,
        available_memory: Callable[[], int] = available_memory_bytes,
    ) -> None:
        """Args:
        store: the state database.
        settings: policy and budgets (the daemon's settings resolve flags against the stored
            policy: :mod:`dloader.sidecar.config`).
        tree_stats: how process trees are measured (a fake in tests; None: ``/proc``, each
            job's tree read to at most the node's worker budget plus :data:`TREE_SLACK`
            processes: a user's tree of 1,500 processes once cost the sidecar 34-78% of a
            core).
        clock: monotonic seconds.
        pin_cpus: the CPUs to divide into disjoint CPU sets for the jobs' loader workers,
            sized by their CPU shares (when there is at least one CPU per job); empty: off.
        cgroup: sets each job's CPU weight from its CPU share.
        worker_nice: the nice value every job's loader workers are directed to (1-19; 0:
            left alone): each training process, at its own, then comes first for a core over
            every job's workers (a trainer that needs a core is not starved by its neighbours'
            workers), and the policy models the cores shared that way.
        job_timeout_s: a job that neither reports nor registers for this long is ended (its
            agent re-registers if it comes back); 0: never.
        owner_of: the uid owning a process (a fake in tests).
        start_of: when a process started (None: no such process); with its PID it names one
            process, so a PID the kernel reuses leaves the job (a fake in tests).
        translate_pids: a local caller's PIDs (numbered in its PID namespace, e.g. a pod's)
            in this process's numbering, given the caller's PID.
        available_memory: bytes of memory the node has available now (``MemAvailable``).
        """
        self._available_memory = available_memory
        self._owner_of = owner_of
        self._start_of = start_of
        self._translate_pids = translate_pids
        if not (math.isfinite(job_timeout_s) and job_timeout_s >= 0):
            raise ValueError(f"job_timeout_s={job_timeout_s} must be >= 0 (0: never)")
        self.job_timeout_s = job_timeout_s
        self.pin_cpus = tuple(pin_cpus)
        self.cgroup = cgroup
        self._trainer_weight = pol.trainer_weight(worker_nice)  # checks it
        self._nice = worker_nice or None
        self.store = store
        self.settings = settings
        self._tree_stats = tree_stats or self._read_tree
        self._clock = clock
        self.jobs: dict[str, Job] = {}
        self._revision = 0
        self._changed_at = -math.inf  # when any job's worker count last changed
        self._truth = pol.MeasuredTruth()  # what each split measured; the probe state machine
        self._streams: Streams[Directive | None] = Streams("WatchDirectives")
        self._pruned_at = -math.inf  # when the state file's history was last pruned
        self._decided_at = -math.inf  # when the policy last ran
        self._wake = asyncio.Event()
        self._dirty = True  # something the decision depends on changed since the last one
        #: The cluster allocator's cores for each job on this node, by job name (its job id
        #: there): a prior (:meth:`set_cpu_targets`).
        self.cpu_targets: dict[str, float] = {}
        for rec in store.active_jobs():  # a restart keeps the jobs and what was learned
            model = LoaderModel()
            payload = store.load_model(rec.job_id)
            if payload is not None:
                try:
                    model = LoaderModel.from_dict(payload)
                except PredictorError as exc:
                    log.warning(
                        "job %s: stored model unreadable (%s); starting afresh", rec.job_id, exc
                    )
            self.jobs[rec.job_id] = Job(
                rec,
                model,
                Directive(
                    rec.num_workers,
                    rec.batch_size,
                    reason="restored after restart",
                    worker_nice=self._nice,
                ),
                last_report_at=clock(),  # a full timeout to report again
            )
        if self.jobs:
            log.info("restored %d job(s) from %s", len(self.jobs), store.path)

    # ------------------------------------------------------------------ jobs

    def register(self, reg: Registration) -> Job:
        """Registers a job; validates every field, naming the bad one."""
        name, limits = reg.name, reg.limits
        if not name or len(name) > _NAME_MAX or not name.isprintable():
            raise InvalidArgument(
                "name", f"{shown(name)}: must be 1..{_NAME_MAX} printable characters (no newline)"
            )
        lo, hi = limits.min_workers, limits.max_workers
        if hi and lo > hi:
            raise InvalidArgument(
                "limits.min_workers", f"min_workers={lo} is above max_workers={hi}"
            )
        if limits.max_remote_workers > _MAX_WORKERS:
            raise InvalidArgument(
                "limits.max_remote_workers",
                f"{limits.max_remote_workers} must be within [0, {_MAX_WORKERS}]",
            )
        blo, bhi = limits.min_batch_size, limits.max_batch_size
        if bhi and blo > bhi:
            raise InvalidArgument(
                "limits.min_batch_size", f"min_batch_size={blo} is above max_batch_size={bhi}"
            )
        owner = self._check_room()
        if not reg.pids or len(reg.pids) > MAX_PIDS:
            raise InvalidArgument("pids", f"{len(reg.pids)} ids: give 1 to {MAX_PIDS}")
        if len(reg.gpus) > MAX_GPUS:
            raise InvalidArgument("gpus", f"{len(reg.gpus)} GPUs: at most {MAX_GPUS}")
        if not 0 <= reg.num_workers <= _MAX_WORKERS:
            raise InvalidArgument(
                "num_workers", f"{reg.num_workers} must be within [0, {_MAX_WORKERS}]"
            )
        if reg.batch_size < 1:
            raise InvalidArgument("batch_size", f"{reg.batch_size} must be >= 1")
        if reg.job_key and (
            len(reg.job_key) != 64 or any(c not in "0123456789abcdef" for c in reg.job_key)
        ):
            raise InvalidArgument(
                "job_key", f"{shown(reg.job_key)}: expected 64 lowercase hex digits (or none)"
            )
        pids = self._local_pids(list(reg.pids))
        starts = self._pin(pids)
        tree = self._tree_stats(pids)
        if not tree.alive:
            raise InvalidArgument("pids", f"no process of {pids} is running on this node")
        rec = StoredJob(
            uuid.uuid4().hex[:12],
            name,
            secrets.token_hex(16),
            limits,
            pids,
            list(reg.gpus),
            reg.num_workers,
            reg.batch_size,
            time.time(),
            starts,
            owner,
            key_digest(reg.job_key),
        )
        model = self._model_of_last(name, owner)
        self.store.add_job(rec)
        job = Job(
            rec,
            model,
            Directive(reg.num_workers, reg.batch_size, reason="registered", worker_nice=self._nice),
            last_report_at=self._clock(),
            tree=tree,
            # Nothing changed for it: it runs at its own count, so its first report's window
            # (from its first batch, after registration) teaches the model at once.
            directive_at=self._clock() - pol.SETTLE_S,
            initial_workers=reg.num_workers,
            registered_at=self._clock(),
        )
        # what its workers cost (or may come to cost) in memory, from the tree read above: its
        # first decision below must not grow it on memory nothing has measured yet
        self._note_memory(job)
        self.jobs[rec.job_id] = job
        log.info(
            "job %s (%s) registered: pids %s, %d workers", rec.job_id, name, pids, reg.num_workers
        )
        self._start_from_target(job)
        self.decide()
        return job

    def _model_of_last(self, name: str, owner: int | None) -> LoaderModel:
        """What the node knows of a job of this name and owner: the model of one running now
        (another rank of it), else of the last that ended (it comes back). It is placed at
        once from that (its first windows then correct the model); a fresh model otherwise."""
        for other in self.jobs.values():
            if other.record.name == name and other.record.uid == owner and other.model.observations:
                log.info("%s starts from the model of job %s, of its name", name, other.job_id)
                return LoaderModel.from_dict(other.model.to_dict())
        found = self.store.last_model_of(name, owner)
        if found is None:
            return LoaderModel()
        job_id, payload = found
        try:
            model = LoaderModel.from_dict(payload)
        except PredictorError as exc:
            log.warning(
                "job %s's stored model unreadable (%s): %s starts afresh", job_id, exc, name
            )
            return LoaderModel()
        if model.observations:
            log.info(
                "%s comes back: it starts from the model of job %s (%d observations)",
                name,
                job_id,
                len(model.observations),
            )
        return model

    def set_cpu_targets(self, targets: Mapping[str, float]) -> None:
        """The cluster allocator's cores for its jobs on this node, by the digest of each
        job's key (:attr:`StoredJob.allocator_key`: never by name, which anyone may give): a
        prior, not a cage. A job its model has not placed yet starts (and explores) from the
        worker count its share of the target feeds, within its limits and the node's budget;
        from then on the node's policy arbitrates from what the jobs measure, as for any job.
        Kept for the jobs of those keys that register later (only the latest targets: bounded
        by the allocator's jobs on this node)."""
        self.cpu_targets = dict(targets)
        for job in list(self.jobs.values()):
            self._start_from_target(job)

    def allocator_jobs(self, digest: str) -> list[Job]:
        """The local jobs (one per rank) tied to the allocator's job whose key has ``digest``."""
        return [j for j in self.jobs.values() if digest and j.record.allocator_key == digest]

    def _start_from_target(self, job: Job) -> None:
        key = job.record.allocator_key
        target = self.cpu_targets.get(key) if key else None
        if target is None or job.placed or abs(target - job.cpu_target) <= 0.05 * target:
            return  # no target, its model decides, or it already started from this one
        job.cpu_target = target
        cores = target / max(len(self.allocator_jobs(key)), 1)
        if job.model.observations:
            workers = job.model.workers_for(max(cores, 1e-3))
        else:
            workers = round(cores)
        low, high = pol.bounds(self._view(job), self._budget())
        workers = min(max(workers, low), high)
        if workers == job.initial_workers == job.directive.num_workers:
            return
        job.initial_workers = workers
        reason = f"the allocator's target: {cores:.2f} cores feed {workers} worker(s)"
        log.info("job %s (%s): %s", job.job_id, job.record.name, reason)
        if workers != job.directive.num_workers:
            self._direct(job, reason, num_workers=workers)
            job.directive_at = self._changed_at = self._clock()

    def _check_room(self) -> int | None:
        """The caller's uid as the owner of one more job (None: an operator), if it may
        register one: the node's table is not full; and, for a caller who is not an operator,
        neither the users' part of it (the last ``OPERATOR_RESERVE`` places are the operators')
        nor its own ``MAX_JOBS_PER_USER`` is. Else RESOURCE_EXHAUSTED. So no user can fill the
        node for the others or shut the operator out."""
        caller = current_caller()
        owner = None if caller.at_least(Role.OPERATOR) else caller.uid
        refused = JOBS.refusal(Counter(j.record.uid for j in self.jobs.values()), owner)
        if refused is not None:
            bound, n = refused
            raise ResourceExhausted(
                "name",
                {
                    "all": f"this node has {n} jobs, the most it takes",
                    "users": f"users hold {n} jobs on this node, the most they may (the last "
                    f"{OPERATOR_RESERVE} places are kept for the operator)",
                    "owner": f"uid {owner} holds {n} jobs on this node, the most one user may",
                }[bound],
            )
        return owner

    def _local_pids(self, pids: list[int]) -> list[int]:
        """A local caller's PIDs in the sidecar's numbering (a pod numbers its own)."""
        caller = current_caller()
        if caller.pid is None:
            return pids
        try:
            return self._translate_pids(pids, caller.pid)
        except ValueError as exc:
            raise InvalidArgument("pids", str(exc)) from None

    def _pin(self, pids: list[int]) -> list[int]:
        """Each claimed process's start time, once it is checked: it runs now, and it is the
        caller's (operators: anyone's). A PID that no process holds yet is refused, so no one
        can claim the processes that other users will start. The sidecar divides CPU and
        workers by these processes and may write their cgroup's weight."""
        caller = current_caller()
        if not caller.at_least(Role.OPERATOR) and not caller.local:
            raise PermissionDenied("pids", f"registering processes needs a local caller; {caller}")
        starts = []
        for pid in pids:
            start = self._start_of(pid)
            owner = self._owner_of(pid)
            if start is None or owner is None or self._start_of(pid) != start:
                raise InvalidArgument("pids", f"process {pid} is not running on this node")
            if not caller.at_least(Role.OPERATOR) and owner != caller.uid:
                raise PermissionDenied(
                    "pids", f"process {pid} belongs to uid {owner}, not to the caller ({caller})"
                )
            starts.append(start)
        return starts

    def _repin(self, job: Job, kept: list[tuple[int, int]]) -> bool:
        """Drops the job's processes that exited, or whose PID now names another process (its
        start time changed; ``kept``: those still pinned, from :meth:`walk`); False when none is
        left."""
        rec = job.record
        if not rec.starts:  # nothing was pinned (an operator's job stored without starts)
            return True
        if len(kept) < len(rec.pids):
            gone = sorted(set(rec.pids) - {p for p, _ in kept})
            log.info("job %s (%s): processes %s exited or were reused", rec.job_id, rec.name, gone)
            rec.pids, rec.starts = [p for p, _ in kept], [t for _, t in kept]
            self.store.update_pids(rec.job_id, rec.pids, rec.starts)
        return bool(kept)

    def authenticate(self, job_id: str, token: str) -> Job:
        """The job ``job_id`` if ``token`` is its token, for an operator or the local user who
        registered it (a token that leaked to another user is not enough)."""
        job = self.get(job_id)
        caller = current_caller()
        owner = job.record.uid
        if not caller.at_least(Role.OPERATOR) and owner is not None and caller.uid != owner:
            raise PermissionDenied(
                "caller", f"job {shown(job_id)} was registered by uid {owner}, not by {caller}"
            )
        if not same_token(job.record.token, token):
            raise PermissionDenied("token", f"the token does not authorise job {shown(job_id)}")
        return job

    def get(self, job_id: str) -> Job:
        """A job by id (for operators)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound("job_id", f"no job {shown(job_id)} on this node")
        return job

    def report_age(self, job: Job) -> float:
        """Seconds since the job's last report (or its registration)."""
        return max(self._clock() - job.last_report_at, 0.0)

    def deregister(self, job_id: str, token: str) -> None:
        """Removes a job and frees its resources (the holder of its token, or an operator:
        e.g. a Slurm Epilog ending a finished job's loaders)."""
        if not token and current_caller().at_least(Role.OPERATOR):
            self._end(self.get(job_id), "ended by an operator")
            return
        self._end(self.authenticate(job_id, token), "deregistered")

    def _end(self, job: Job, why: str) -> None:
        self.jobs.pop(job.job_id, None)
        self.store.save_model(job.job_id, job.model.to_dict())
        self.store.end_job(job.job_id)
        for box in job.watchers:
            box.put(None)
        log.info("job %s (%s) %s", job.job_id, job.record.name, why)
        self.decide()

    # ------------------------------------------------------------------ reports

    def report(self, job: Job, r: JobReport) -> None:
        """Takes one report of ``job``'s loader (already authenticated)."""
        k, b = r.num_workers, r.batch_size
        if b < 1:
            raise InvalidArgument("batch_size", f"{b} must be >= 1")
        if not 0 <= k <= _MAX_WORKERS:
            raise InvalidArgument("num_workers", f"{k} must be within [0, {_MAX_WORKERS}]")
        tput = finite_within("samples_per_second", r.samples_per_second, 0, 1e9)
        if tput < _MIN_RATE:
            tput = 0.0
            r = replace(r, samples_per_second=0.0)
        idle = finite_within("idle_share", r.idle_share, 0, 1)
        step = finite_within("step_seconds", r.step_seconds, 0, 86400)
        window = finite_within("window_seconds", r.window_seconds, 0, 86400)
        if len(r.workers) > _MAX_WORKERS:
            raise InvalidArgument("workers", f"{len(r.workers)} entries: at most {_MAX_WORKERS}")
        for i, w in enumerate(r.workers):
            finite_within(f"workers[{i}].fetch_seconds", w.fetch_seconds, 0, 86400)
            finite_within(f"workers[{i}].cpu_seconds", w.cpu_seconds, 0, 86400)
            if w.run_delay_seconds is not None:
                finite_within(f"workers[{i}].run_delay_seconds", w.run_delay_seconds, 0, 86400)
        job.last_report, job.last_report_at = r, self._clock()
        job.reports += 1
        if (k, b) != (job.record.num_workers, job.record.batch_size):
            job.record.num_workers, job.record.batch_size = k, b
            self.store.update_job(job.job_id, num_workers=k, batch_size=b)
            self._dirty = True
        self.store.add_report(job.job_id, r.to_json())
        if not (tput > 0 and step > 0):
            return
        busy = [w for w in r.workers if w.batches > 0]
        fetch = sum(w.fetch_seconds for w in busy) / len(busy) if busy else None
        cpu = sum(w.cpu_seconds for w in busy) / len(busy) if busy else None
        job.worker_cores = tput * cpu / b if cpu is not None else 0.0
        obs = LoaderObservation(
            num_workers=k,
            cores=self._available_cores(job) if cpu is not None else self.settings.cpu_budget,
            batch_size=b,
            samples_per_s=tput,
            idle_share=idle,
            step_s=step,
            fetch_s=fetch,
            cpu_s=cpu,
            cpu_wait_s=pol.run_queue_wait(
                [w.run_delay_seconds for w in busy],
                job.cpu_wait_share,
                fetch,
                cpu,
                len(busy) * b / tput,
            ),
        )
        self._measure(job, r, window, busy=len(busy))
        gate = pol.learning_gate(
            job.model,
            obs,
            window_s=window,
            directed_workers=k if self.guided else job.directive.num_workers,
            busy_workers=len(busy),
            since_directive_s=self._clock() - job.directive_at,
            since_node_change_s=self._clock() - self._changed_at,
            reports=job.reports,
            run_length=job.run_length,
        )
        job.run_length = gate.run_length
        if not gate.observe:
            return
        job.model.update(obs, refit=gate.redecide_now)  # refit on news only
        self._note_drift(job, gate.surprise)
        if len(job.model.observations) % _SAVE_MODEL_EVERY == 0:
            self.store.save_model(job.job_id, job.model.to_dict())
        budget = self._budget()
        decided = job.decision.candidates if job.decision else ()
        if gate.redecide_now or pol.curve_moved(self._view(job), budget, decided):
            self._dirty = True
        if gate.redecide_now:
            self._wake.set()

    def _available_cores(self, job: Job) -> float:
        """The cores ``job``'s workers could have used in its last window: those they used,
        and those no job used (the node's CPU budget less every job's workers and training
        process, from their last reports). On a full node that is what the job's workers
        got, not the node's cores: its model learns its own curve, how fast it loads given
        the cores it gets, and the policy's CPU sharing says how many it will get at a split
        (a model fitted as if each job had every core reads the others' contention as its
        own limit, and a CPU-bound job's fewer workers as a loss they are not). Rounded to
        ``_CORES_STEP``."""
        budget = float(self.settings.cpu_budget)
        taken = sum(
            j.worker_cores + j.main_cpu_per_sample * j.last_report.samples_per_second
            for j in self.jobs.values()
            if j.last_report is not None
        )
        free = job.worker_cores + max(budget - taken, 0.0)
        return min(max(round(free / _CORES_STEP) * _CORES_STEP, _CORES_STEP), budget)

    def _note_drift(self, job: Job, surprise: float) -> None:
        """``DRIFT_WINDOWS`` surprising windows in a row, all one way: the job's costs changed.
        Its model restarts from those windows, and what every split measured is forgotten (it
        was measured under the old costs)."""
        way = (surprise > 0) - (surprise < 0)  # +1 faster, -1 slower, 0 as predicted
        job.drift = job.drift + way if way * job.drift > 0 else way
        if abs(job.drift) < pol.DRIFT_WINDOWS:
            return
        log.info(
            "job %s: %d windows in a row %s than its model predicted (last: %.0f%%): its costs "
            "changed; the model restarts from them",
            job.job_id,
            abs(job.drift),
            "faster" if surprise > 0 else "slower",
            100 * math.expm1(surprise),
        )
        job.model.keep_recent(pol.DRIFT_WINDOWS)
        job.drift = 0
        self._truth.forget()
        # what the restarted model expects here (the last one logged was the old model's)
        budget = self._budget()
        counts = {j.job_id: j.directive.num_workers for j in self.jobs.values()}
        expect = pol.expected([self._view(j) for j in self.jobs.values()], budget, counts)
        if job.job_id in expect and not self.guided:  # guided: the job's own count
            log.info(
                "job %s: %d workers (its model restarted) [model: %s samples/s]",
                job.job_id,
                counts[job.job_id],
                f"{expect[job.job_id]:,.0f}",
            )

    # ------------------------------------------------------------------ decisions

    def _budget(self) -> pol.Budget:
        """The node's worker and CPU budgets (the memory budget is :meth:`decide`'s own)."""
        return pol.Budget(
            self.settings.worker_budget,
            float(self.settings.cpu_budget),
            trainer_weight=self._trainer_weight,
        )

    def _split(self) -> pol.Split:
        return pol.split_of({j.job_id: j.directive.num_workers for j in self.jobs.values()})

    def _limits(self) -> dict[str, float]:
        return {
            j.job_id: j.model.accelerator_limit(j.directive.batch_size or j.record.batch_size)
            for j in self.jobs.values()
            if j.model.observations
        }

    def _measure(self, job: Job, r: JobReport, window: float, *, busy: int) -> None:
        """Records a steady window of ``job`` at the node's current split: at its directed
        count, the whole window after the last change of any job plus ``SETTLE_S``, one per
        window. A split measured in full for the first time calls for a decision."""
        now = self._clock()
        steady = (
            pol.steady_window(
                window,
                r.num_workers,
                job.directive.num_workers,
                busy,
                now - job.directive_at,
                now - self._changed_at,
            )
            and job.reports % max(int(window), 1) == 0
        )
        if not steady or self.settings.name != "adaptive":
            return
        split, limits = self._split(), self._limits()
        known = self._truth.known(split, limits, now)
        if self._truth.record(split, job.job_id, r.samples_per_second, now):
            log.info(
                "job %s measured %s samples/s at %s, unlike before there: the node changed; "
                "every split's measurements are forgotten",
                job.job_id,
                f"{r.samples_per_second:,.0f}",
                pol.show_split(split),
            )
            self._dirty = True
        elif not known and self._truth.known(split, limits, now):
            self._dirty = True

    def _note_memory(self, job: Job) -> None:
        """One more worker of ``job`` costs what its largest worker holds privately (its USS
        grows over an epoch as the worker copies the dataset pages Python touches: the peak
        is kept). Before any worker was measured, the training process's own USS: what a
        worker that touched all of it would copy.

        While that peak still grows (it passed its last mark by ``_MEMORY_GROWTH`` within
        ``_MEMORY_FLAT_S``; a job's first measurement counts as growth), the job's workers may
        come to hold up to the anonymous memory they map (private, or shared with the trainer
        and not yet copied): the policy counts new workers at that bound, so no job grows on
        memory its workers have not shown they stay within."""
        tree = job.tree
        if tree is None:
            return
        now = self._clock()
        workers = [tree.uss_bytes[p] for p in tree.worker_pids if p in tree.uss_bytes]
        if workers:
            peak = float(max(workers))
            first = job.memory_mark == 0
            if first or peak > job.worker_memory_bytes * (1 + _MEMORY_CHANGE):
                self._dirty = True
            # the first measured worker replaces the guess made from the trainer
            job.worker_memory_bytes = peak if first else max(job.worker_memory_bytes, peak)
            share, floor = _MEMORY_GROWTH
            if first or peak > job.memory_mark * (1 + share) + floor:
                job.memory_mark, job.memory_grew_at = peak, now
            anon = [tree.anon_bytes[p] for p in tree.worker_pids if p in tree.anon_bytes]
            bound = max(anon, default=0.0) if now - job.memory_grew_at < _MEMORY_FLAT_S else 0.0
        elif job.memory_mark == 0:  # no worker measured yet: a guess from the trainer
            main = [tree.uss_bytes[p] for p in tree.pids if p in tree.uss_bytes]
            job.worker_memory_bytes = float(sum(main))
            bound = float(sum(tree.anon_bytes.get(p, 0) for p in tree.pids))
        else:  # none now (e.g. resized to 0): what its workers showed stands
            return
        if (bound == 0) != (job.worker_memory_bound == 0):  # settled, or growing again
            self._dirty = True
        job.worker_memory_bound = max(bound, job.worker_memory_bytes) if bound else 0.0

    def memory_budget(self) -> tuple[float, float]:
        """``(budget, used)``: bytes the loader workers of all jobs may hold, and hold now.

        ``--memory-budget`` as a fraction is a share of what the node could give them: the
        memory available now plus what their workers already hold."""
        used = 0.0
        for job in self.jobs.values():
            if job.tree is not None:
                used += sum(job.tree.uss_bytes.get(p, 0) for p in job.tree.worker_pids)
        limit = self.settings.memory_budget
        if limit <= 1:
            return limit * (self._available_memory() + used), used
        return limit, used

    @property
    def guided(self) -> bool:
        """The jobs' own tuners choose their counts, within the ceilings the policy sets."""
        return self.settings.name == "guided"

    def _view(self, j: Job) -> pol.JobView:
        return pol.JobView(
            j.job_id,
            j.record.batch_size,
            j.record.num_workers if self.guided else j.directive.num_workers,
            j.record.limits.min_workers,
            j.record.limits.max_workers,
            j.model,
            j.initial_workers,
            j.main_cpu_per_sample,
            j.worker_memory_bytes,
            j.worker_memory_bound,
            j.worker_upkeep_cores,
        )

    def decide(self) -> None:
        """Runs the policy and sends every changed directive."""
        self._dirty = False
        self._decided_at = self._clock()
        jobs = list(self.jobs.values())
        if not jobs:
            return
        views = [self._view(j) for j in jobs]
        memory, _ = self.memory_budget()
        budget = replace(self._budget(), memory_bytes=memory)
        decisions = pol.decide(self.settings.name, views, budget)
        if self.settings.name == "adaptive":
            decisions = self._truth.steer(
                views,
                budget,
                decisions,
                self._split(),
                self._limits(),
                self._clock(),
                self._changed_at,
            )
        self._enforce_cpu(jobs, decisions)
        if self.guided:
            self._guide(jobs, decisions)
            return
        changed = any(decisions[j.job_id].num_workers != j.directive.num_workers for j in jobs)
        expect = (
            pol.expected(views, budget, {j: d.num_workers for j, d in decisions.items()})
            if changed and self.settings.name == "adaptive"
            else {}
        )
        for job in jobs:
            d = decisions[job.job_id]
            job.decision = d
            if not job.placed and self.settings.name == "adaptive" and job.model.observations:
                job.placed = d.placed
                if job.placed:
                    log.info(
                        "job %s: placed by its model %.1f s after registering: %d workers (%s)",
                        job.job_id,
                        self._clock() - job.registered_at,
                        d.num_workers,
                        d.reason,
                    )
            if d.num_workers != job.directive.num_workers:
                self._direct(job, d.reason, num_workers=d.num_workers)
                job.directive_at = self._changed_at = self._clock()
                # what the model expects of the job at this split, the node's cores shared
                log.info(
                    "job %s: %d workers (%s)%s",
                    job.job_id,
                    d.num_workers,
                    d.reason,
                    f" [model: {expect[job.job_id]:,.0f} samples/s]"
                    if job.job_id in expect
                    else "",
                )
        if expect:  # every job's expectation at the new split: the benchmarks check it
            log.info(
                "the model expects (samples/s): %s",
                ", ".join(f"{j}={v:.0f}" for j, v in expect.items()),
            )

    def _guide(self, jobs: list[Job], decisions: dict[str, pol.WorkerDecision]) -> None:
        """The guided policy: every job's own tuner chooses its count, up to its ceiling."""
        for job in jobs:
            d = job.decision = decisions[job.job_id]
            if d.num_workers != job.directive.tune_up_to:
                # num_workers: for a loader that cannot tune itself, its count within the ceiling
                held = min(job.record.num_workers, d.num_workers)
                self._direct(job, d.reason, tune_up_to=d.num_workers, num_workers=held)
                log.info("job %s: %s", job.job_id, d.reason)

    def _direct(self, job: Job, reason: str, **changes: Any) -> None:
        """Sends ``job`` a new directive (``changes`` to its current one, a new revision) and
        logs it in the store."""
        self._revision += 1
        job.directive = d = replace(
            job.directive, reason=reason, revision=self._revision, **changes
        )
        self.store.add_decision(job.job_id, d.num_workers, d.batch_size, list(d.cpus), reason)
        for box in job.watchers:
            box.put(d)

    def _enforce_cpu(self, jobs: list[Job], decisions: dict[str, pol.WorkerDecision]) -> None:
        """CPU sets for the loader workers and cgroup weights, from the jobs' CPU shares."""
        if not (self.pin_cpus or self.cgroup):
            return
        cores = self.settings.cpu_budget
        known = [d.cpu_share for d in decisions.values() if d.cpu_share > 0]
        fallback = (cores - sum(known)) / max(len(jobs) - len(known), 1) if known else 1.0
        shares = {j.job_id: decisions[j.job_id].cpu_share or max(fallback, 0.1) for j in jobs}
        if self.cgroup is not None:
            self.cgroup.apply({j.job_id: (j.record.pids, shares[j.job_id]) for j in jobs})
        if not self.pin_cpus:
            return
        sets = pol.cpu_sets(shares, sorted(self.pin_cpus)[:cores])
        for job in jobs:
            cpus = sets.get(job.job_id, ())
            if cpus and cpus != job.directive.cpus:
                reason = f"CPU set {list(cpus)}: its share {shares[job.job_id]:.2f} cores"
                self._direct(job, reason, cpus=cpus)

    def direct_batch_size(self, job_id: str, batch_size: int, reason: str) -> bool:
        """Directs a job to a new batch size (from the cluster allocator); False if not allowed.

        The size is clamped to the job's limits; a job that does not allow batch-size changes
        (``may_change_batch_size`` false) keeps its own.
        """
        job = self.get(job_id)
        limits = job.record.limits
        if not limits.may_change_batch_size:
            return False
        lo = limits.min_batch_size or 1
        hi = limits.max_batch_size or batch_size
        b = min(max(batch_size, lo), hi)
        if b == (job.directive.batch_size or job.record.batch_size):
            return True
        self._direct(job, reason, batch_size=b)
        log.info("job %s: batch size %d (%s)", job_id, b, reason)
        return True

    def direct_remote_workers(self, job_id: str, workers: int, reason: str) -> bool:
        """Directs a job's loader to ``workers`` remote (Ray) workers, within what its owner
        allows (``max_remote_workers``; False: none, the job has no remote workers)."""
        job = self.get(job_id)
        most = job.record.limits.max_remote_workers
        if most <= 0:
            return False
        n = min(max(workers, 0), most)
        if n != job.directive.remote_workers:
            self._direct(job, reason, remote_workers=n)
            log.info("job %s: %d remote worker(s) (%s)", job_id, n, reason)
        return True

    def reap(self) -> list[str]:
        """Ends jobs whose processes are all gone, or that stopped reporting for the job
        timeout; returns their ids. (:meth:`run` walks the process trees in a thread of its
        own and applies them here: :meth:`walk`, :meth:`apply_walks`.)"""
        return self.apply_walks(self.walk(self.walk_plan()))

    def _read_tree(self, pids: list[int]) -> ProcessTreeStats:
        """``pids``' tree from ``/proc``, to as many processes as a job's loader may have."""
        return process_tree_stats(pids, limit=self.settings.worker_budget + TREE_SLACK)

    def walk_plan(self) -> list[tuple[str, list[int], list[int]]]:
        """What :meth:`walk` reads: each job's id, PIDs and pinned start times."""
        return [(j.job_id, list(j.record.pids), list(j.record.starts)) for j in self.jobs.values()]

    def walk(self, plan: list[tuple[str, list[int], list[int]]]) -> dict[str, Walk]:
        """The process trees of ``plan``'s jobs, and which pinned PIDs still name the process
        registered. Reads ``/proc`` only, and touches no state of the core: it runs off the
        event loop (64 jobs over 1,500 processes took the loop 2.9 s a walk)."""
        out = {}
        for job_id, pids, starts in plan:
            kept = [(p, s) for p, s in zip(pids, starts, strict=True) if self._start_of(p) == s]
            alive = [p for p, _ in kept] if starts else pids
            out[job_id] = Walk(kept, self._tree_stats(alive) if alive else None)
        return out

    def apply_walks(self, walks: dict[str, Walk]) -> list[str]:
        """Applies :meth:`walk`'s trees (jobs that came or went meanwhile are left to the next
        period); returns the ids of the jobs ended."""
        gone = []
        for job in list(self.jobs.values()):
            silent = self._clock() - job.last_report_at
            if self.job_timeout_s and silent > self.job_timeout_s:
                gone.append(job.job_id)
                self._end(job, f"expired: no report for {silent:.0f} s")
                continue
            walked = walks.get(job.job_id)
            if walked is None:
                continue
            if not self._repin(job, walked.kept) or walked.tree is None:
                gone.append(job.job_id)
                self._end(job, "ended: its processes are gone")
                continue
            before, before_at = job.tree, job.tree_at
            job.tree, job.tree_at = walked.tree, self._clock()
            if job.tree.truncated and (before is None or not before.truncated):
                log.warning(
                    "job %s (%s): its process tree has more than %d processes; only the "
                    "nearest are read (the node's worker budget plus %d)",
                    job.job_id,
                    job.record.name,
                    self.settings.worker_budget + TREE_SLACK,
                    TREE_SLACK,
                )
            if not job.tree.alive:
                gone.append(job.job_id)
                self._end(job, "ended: its processes are gone")
                continue
            if before is not None and job.tree_at > before_at:
                # the share of time the job's workers waited, runnable, for a CPU
                was, now = before.run_delay_s, job.tree.run_delay_s
                waits = [
                    (now[p] - was[p]) / (job.tree_at - before_at)
                    for p in job.tree.worker_pids
                    if p in now and p in was
                ]
                job.cpu_wait_share = min(sum(waits) / len(waits), 1.0) if waits else None
            self._note_memory(job)
            rate = job.last_report.samples_per_second if job.last_report else 0.0
            if rate > 0 and job.tree.main_cpu_percent > 0:
                x = min(job.tree.main_cpu_percent / 100.0 / rate, _MAX_MAIN_CPU_PER_SAMPLE)
                m = job.main_cpu_per_sample
                job.main_cpu_per_sample = x if m == 0 else m + _EWMA * (x - m)
                if m == 0 or abs(job.main_cpu_per_sample / m - 1) > _MAIN_CPU_CHANGE:
                    self._dirty = True
            self._note_upkeep(job)
        self.store.flush()  # the period's reports, in one transaction
        if self._clock() - self._pruned_at >= _PRUNE_PERIOD_S:
            self._pruned_at = self._clock()
            self.store.prune()
        return gone

    def _note_upkeep(self, job: Job) -> None:
        """What each of ``job``'s workers costs the node beyond its samples' work: its tree's
        CPU less the training process's and the per-sample CPU its workers report (waking,
        sending batches, idling), per worker; a moving average, at most
        ``_MAX_UPKEEP_CORES``. The policy counts it in the job's CPU demand at every count, so
        that a worker more for an I/O-bound job on a full node is priced at what it takes."""
        tree, k = job.tree, job.record.num_workers
        if tree is None or k < 1 or job.last_report is None or not tree.worker_pids:
            return
        workers = max(tree.cpu_percent - tree.main_cpu_percent, 0.0) / 100.0
        x = min(max(workers - job.worker_cores, 0.0) / k, _MAX_UPKEEP_CORES)
        u = job.worker_upkeep_cores
        job.worker_upkeep_cores = x if u == 0 else u + _EWMA * (x - u)

    async def run(self, stop: asyncio.Event) -> None:
        """The periodic loop: every period, measure the jobs' process trees (reaping dead
        jobs) and re-decide if anything the decision depends on changed; on news (a new
        allocation's first window, a surprising throughput), re-decide at once."""
        last_reap = -math.inf
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.period_s)
            # Evidence comes in bursts (every job's report within a second): decide once for
            # the burst. Process trees are measured every period, not on every event.
            await asyncio.sleep(_COALESCE_S)
            self._wake.clear()
            try:
                if self._clock() - last_reap >= self.settings.period_s:
                    last_reap = self._clock()
                    walks = await asyncio.to_thread(self.walk, self.walk_plan())
                    self.apply_walks(walks)
                # the decision is a function of the jobs, models and settings; steady, it is
                # also time to probe a neighbouring split now and then
                now = self._clock()
                probe_due = (
                    self.settings.name == "adaptive"
                    and min(now - self._changed_at, now - self._decided_at)
                    >= self._truth.probe_wait
                )
                if self._dirty or probe_due:
                    self.decide()
            except Exception:  # the daemon must outlive a bad decision
                log.exception("node policy loop failed; keeping the last allocation")

    def open_watch(self, job: Job) -> Mailbox[Directive | None]:
        """A new stream of ``job``'s directives for the current caller (RESOURCE_EXHAUSTED past
        its share of the node's streams: :mod:`dloader._daemon.streams`)."""
        box = self._streams.open()
        job.watchers.add(box)
        return box

    async def watch(self, job: Job, box: Mailbox[Directive | None]) -> AsyncIterator[Directive]:
        """The job's current directive, then the newest whenever the reader is ready for it,
        until the job ends."""
        try:
            yield job.directive
            while True:
                d = await box.get()
                if d is None:
                    return
                yield d
        finally:
            job.watchers.discard(box)
            self._streams.close(box)

    def set_policy(self, settings: PolicySettings) -> None:
        """Switches policy or budget (kept across restarts unless a flag says otherwise);
        re-decides at once. Operators only."""
        require(Role.OPERATOR, "SetPolicy")
        self.settings = settings
        self.store.set_setting(STORED_POLICY, settings.to_json())
        log.info("policy set to %s", settings)
        if not self.guided:  # the sidecar sets the counts again: the jobs' tuners stop
            for job in self.jobs.values():
                if job.directive.tune_up_to is not None:
                    reason = f"policy {settings.name}: the sidecar sets the count"
                    self._direct(job, reason, tune_up_to=None, num_workers=job.record.num_workers)
        self.decide()
