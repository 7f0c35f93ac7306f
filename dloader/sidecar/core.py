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
from dloader._shared.node_messages import Directive, JobReport, Registration, fit_remote
from dloader.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    finite_within,
    shown,
)
from dloader.predictor import LoaderModel, PredictorError
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
_LENT_STEP = 0.1
"""Cores lent (:meth:`NodeCore.set_lent_cores`) that change the node's budget, and the least
a node that lends all its cores keeps for its own jobs."""
_MAX_WORKERS = 4096  # worker processes one loader may report
MAX_JOBS = 256  # registered jobs on one node
OPERATOR_RESERVE = 32  # of those, kept for operators: other users together hold at most the rest
MAX_JOBS_PER_USER = 64  # registered jobs of one local user (operators: no own cap)
JOBS = Shares(MAX_JOBS, OPERATOR_RESERVE, MAX_JOBS_PER_USER)
MAX_PIDS = 64  # training processes one job may name
MAX_GPUS = 64  # GPUs one job may name
#: A reported rate below this many samples/s is no throughput at all (a subnormal rate made the
#: trainer's CPU per sample infinite, and every job's decision NaN).
_MIN_RATE = 1e-3
_PRUNE_PERIOD_S = 600.0  # how often the state file's old history is pruned (SidecarStore.prune)


def window(r: JobReport) -> pol.ReportWindow:
    """A report's window as the policy reads it (its workers: those that delivered a batch in
    it; a worker with none sends its moving average, as old as its last batch, without a wait
    for a CPU: counted, it made the window's timings a mix of old and new, and its wait one
    estimated from the process tree that moved a window's storage time by 148% on its own)."""
    busy = [w for w in r.workers if w.in_window]
    return pol.ReportWindow(
        r.num_workers,
        r.batch_size,
        r.samples_per_second,
        r.idle_share,
        r.step_seconds,
        r.window_seconds,
        tuple(w.fetch_seconds for w in busy),
        tuple(w.cpu_seconds for w in busy),
        tuple(w.run_delay_seconds for w in busy),
    )


def sample(tree: ProcessTreeStats) -> pol.TreeSample:
    """A walk of a job's process tree as the policy reads it."""
    workers, uss, anon = tree.worker_pids, tree.uss_bytes, tree.anon_bytes
    return pol.TreeSample(
        tree.cpu_percent / 100.0,
        tree.main_cpu_percent / 100.0,
        {p: d for p, d in tree.run_delay_s.items() if p in workers},
        tuple(uss[p] for p in workers if p in uss),
        tuple(anon[p] for p in workers if p in anon),
        tuple(uss[p] for p in tree.pids if p in uss),
        sum(anon.get(p, 0) for p in tree.pids),
        bool(workers),
    )


def _without(tree: ProcessTreeStats, agent: int | None) -> ProcessTreeStats:
    """``tree`` with the job's agent helper (``agent``: the process that registered the job)
    not counted as a loader worker: a small process the training process spawned, which, taken
    for its first worker, made the policy price the job's workers at the helper's size."""
    if agent is None or agent not in tree.worker_pids:
        return tree
    return replace(tree, worker_pids=tuple(p for p in tree.worker_pids if p != agent))


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
    """A registered job, as the core holds it; what the policy knows of it is ``state``."""

    record: StoredJob
    state: pol.PolicyJob
    directive: Directive
    last_report: JobReport | None = None
    last_report_at: float = 0.0
    tree: ProcessTreeStats | None = None
    """Its processes as last walked (None: not yet)."""
    agent_pid: int | None = None
    """The process that registered it (the loader's agent helper, a child of the training
    process): in its tree, but no loader worker (None: unknown, e.g. restored)."""
    watchers: set[Mailbox[Directive | None]] = field(default_factory=set)

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def model(self) -> LoaderModel:
        return self.state.model

    @property
    def decision(self) -> pol.WorkerDecision | None:
        """The policy's last answer for it."""
        return self.state.decision


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
        spare_workers: float = pol.HEDGE_COST,
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
            workers), and the policy models the cores shared that way; a new job's once the
            adaptive policy has placed it (:meth:`~.node_policy.NodePolicy.nice_for`).
        spare_workers: an I/O-bound job keeps the workers that carry its throughput were its
            storage this many times slower (1: none; :data:`~.node_policy.HEDGE_COST`).
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
        self.store = store
        self.settings = settings
        #: cores of this node lent to other nodes' jobs (the cluster allocator's lending)
        self.lent_cores = 0.0
        #: the whole decision: every job's state, the node's measured truth
        self.policy = pol.NodePolicy(
            settings.name, self._budget(), spare=spare_workers, worker_nice=worker_nice
        )
        self._tree_stats = tree_stats or self._read_tree
        self._clock = clock
        self.jobs: dict[str, Job] = {}
        self._revision = 0
        self._streams: Streams[Directive | None] = Streams("WatchDirectives")
        self._pruned_at = -math.inf  # when the state file's history was last pruned
        self._wake = asyncio.Event()
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
            state = pol.PolicyJob(
                rec.job_id,
                model,
                rec.batch_size,
                rec.num_workers,
                rec.num_workers,
                rec.batch_size,
                rec.limits.min_workers,
                rec.limits.max_workers,
                niced=True,  # its workers ran under the directive before the restart
            )
            self.policy.add(state, clock())
            self.jobs[rec.job_id] = Job(
                rec,
                state,
                Directive(
                    rec.num_workers,
                    rec.batch_size,
                    reason="restored after restart",
                    worker_nice=self.policy.worker_nice or None,
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
        agent = current_caller().pid
        tree = _without(self._tree_stats(pids), agent)
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
        now = self._clock()
        state = pol.PolicyJob(
            rec.job_id,
            model,
            reg.batch_size,
            reg.num_workers,
            reg.num_workers,
            reg.batch_size,
            limits.min_workers,
            limits.max_workers,
            initial_workers=reg.num_workers,
            registered_at=now,  # its count never changed: its first report teaches its model
        )
        job = Job(
            rec,
            state,
            Directive(
                reg.num_workers,
                reg.batch_size,
                reason="registered",
                worker_nice=self.policy.nice_for(state, now),
            ),
            last_report_at=now,
            tree=tree,
            agent_pid=agent,
        )
        self.jobs[rec.job_id] = job
        self.policy.add(state, now, sample(tree))  # its memory, before its first decision
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

    def set_lent_cores(self, cores: float) -> None:
        """Cores of this node the cluster allocator lends to other nodes' jobs (their remote
        loader workers run here, as Ray actors taking this node's ``dloader_node:<id>``): the
        node's policy divides its CPU budget less these among its own jobs, and decides again
        soon."""
        cores = min(max(float(cores), 0.0), float(self.settings.cpu_budget))
        if abs(cores - self.lent_cores) < _LENT_STEP:
            return
        self.lent_cores = cores
        log.info(
            "%.1f of the node's %s cores lent to other nodes' jobs", cores, self.settings.cpu_budget
        )
        self._enact(pol.Decided(self.policy.configure(self.settings.name, self._budget())))
        self._wake.set()

    def allocator_jobs(self, digest: str) -> list[Job]:
        """The local jobs (one per rank) tied to the allocator's job whose key has ``digest``."""
        return [j for j in self.jobs.values() if digest and j.record.allocator_key == digest]

    def _start_from_target(self, job: Job) -> None:
        key = job.record.allocator_key
        target = self.cpu_targets.get(key) if key else None
        if target is not None:
            ranks = len(self.allocator_jobs(key))
            self._enact(self.policy.target(job.job_id, target, ranks, self._clock()))

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
        self.policy.remove(job.job_id)
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
        if finite_within("samples_per_second", r.samples_per_second, 0, 1e9) < _MIN_RATE:
            r = replace(r, samples_per_second=0.0)
        finite_within("idle_share", r.idle_share, 0, 1)
        finite_within("step_seconds", r.step_seconds, 0, 86400)
        finite_within("window_seconds", r.window_seconds, 0, 86400)
        finite_within("done", r.done, 0, 1)
        if len(r.workers) > _MAX_WORKERS:
            raise InvalidArgument("workers", f"{len(r.workers)} entries: at most {_MAX_WORKERS}")
        for i, w in enumerate(r.workers):
            finite_within(f"workers[{i}].fetch_seconds", w.fetch_seconds, 0, 86400)
            finite_within(f"workers[{i}].cpu_seconds", w.cpu_seconds, 0, 86400)
            if w.run_delay_seconds is not None:
                finite_within(f"workers[{i}].run_delay_seconds", w.run_delay_seconds, 0, 86400)
        job.last_report, job.last_report_at = r, self._clock()
        if (k, b) != (job.record.num_workers, job.record.batch_size):
            job.record.num_workers, job.record.batch_size = k, b
            self.store.update_job(job.job_id, num_workers=k, batch_size=b)
        self.store.add_report(job.job_id, r.to_json())
        done = self.policy.report(job.job_id, window(r), self._clock())
        for note in done.notes:
            log.info("%s", note)
        self.store.add_events(done.events)
        if done.learned and len(job.model.observations) % _SAVE_MODEL_EVERY == 0:
            self.store.save_model(job.job_id, job.model.to_dict())
        if done.wake:
            self._wake.set()

    # ------------------------------------------------------------------ decisions

    def _budget(self) -> pol.Budget:
        """The node's worker and CPU budgets (the memory budget comes with each decision)."""
        return pol.Budget(
            self.settings.worker_budget,
            max(float(self.settings.cpu_budget) - self.lent_cores, _LENT_STEP),
            trainer_weight=self._trainer_weight,
        )

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

    def decide(self) -> None:
        """Runs the policy and enacts what it decides: directives, CPU sets, cgroup weights."""
        memory = self.memory_budget()[0] if self.jobs else math.inf  # no jobs: no /proc read
        cpus = sorted(self.pin_cpus)[: self.settings.cpu_budget]
        self._enact(self.policy.decide(self._clock(), memory, cpus=cpus, shares=bool(self.cgroup)))

    def _enact(self, decided: pol.Decided) -> None:
        if self.cgroup is not None and decided.shares:
            self.cgroup.apply({j: (self.jobs[j].record.pids, c) for j, c in decided.shares.items()})
        for order in decided.orders:
            self._direct(self.jobs[order.job_id], order.reason, **order.changes)
        for note in decided.notes:
            log.info("%s", note)
        self.store.add_events(decided.events)

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
        self.policy.direct_batch(job_id, b)
        log.info("job %s: batch size %d (%s)", job_id, b, reason)
        return True

    def direct_remote_workers(
        self, job_id: str, workers: int, reason: str, lent: Mapping[str, int] | None = None
    ) -> bool:
        """Directs a job's loader to ``workers`` remote (Ray) workers in the CPU pool and
        ``lent`` more on nodes that lend it cores (by node id), within what its owner allows
        (``max_remote_workers`` in all, the pool's first; False: none, the job has no remote
        workers)."""
        job = self.get(job_id)
        most = job.record.limits.max_remote_workers
        if most <= 0:
            return False
        n, on = fit_remote(workers, lent or {}, most)
        if (n, on) != (job.directive.remote_workers, job.directive.remote_lent):
            self._direct(job, reason, remote_workers=n, remote_lent=on)
            where = "".join(f", {k} on {node}'s lent cores" for node, k in on)
            log.info("job %s: %d remote worker(s)%s (%s)", job_id, n, where, reason)
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
            before, tree = job.tree, _without(walked.tree, job.agent_pid)
            if tree.truncated and (before is None or not before.truncated):
                log.warning(
                    "job %s (%s): its process tree has more than %d processes; only the "
                    "nearest are read (the node's worker budget plus %d)",
                    job.job_id,
                    job.record.name,
                    self.settings.worker_budget + TREE_SLACK,
                    TREE_SLACK,
                )
            if not tree.alive:
                gone.append(job.job_id)
                self._end(job, "ended: its processes are gone")
                continue
            job.tree = tree
            self.policy.tree(job.job_id, sample(tree), self._clock())
        self.store.flush()  # the period's reports, in one transaction
        if self._clock() - self._pruned_at >= _PRUNE_PERIOD_S:
            self._pruned_at = self._clock()
            self.store.prune()
        return gone

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
                if self.policy.due(self._clock()):
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
        orders = self.policy.configure(settings.name, self._budget())
        self._enact(pol.Decided(orders))
        self.decide()
