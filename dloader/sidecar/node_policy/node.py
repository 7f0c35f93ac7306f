"""The whole node decision behind one object: :class:`NodePolicy`.

It holds what the policy knows of every job (:class:`PolicyJob`: its loader model, its measured
costs, where it stands in its learning) and of the node (what each split measured, when the
split last changed), and answers with one entry point, :meth:`NodePolicy.decide`: the jobs'
state and measurements in, the split out (:class:`Decided`: the directive changes to send, the
jobs' CPU shares, and what to log). :class:`~dloader.sidecar.core.NodeCore` feeds it (jobs that
come and go, their report windows, their process trees, the allocator's targets) and enacts what
it decides (directives, CPU sets, cgroup weights); it decides nothing itself.

Pure code: no I/O, no clock of its own (every call is given ``now``) and no logging: what is
worth a line in the daemon's log comes back as text (``notes``), which the core logs, and what
is worth a record (placements, worker counts directed, the model's expectation of every job at
each new split, cost changes) as :class:`PolicyEvent` values, which the core stores (the
sidecar's state file, table ``events``: what the node benchmarks read).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dloader.predictor import LoaderModel, LoaderObservation
from dloader.sidecar.node_policy.allocation import (
    HEDGE_COST,
    MAX_SPARE,
    curve_moved,
    decide,
    expected,
)
from dloader.sidecar.node_policy.learning import (
    COST_HISTORY,
    DRIFT_WINDOWS,
    cost_change,
    learning_gate,
    run_queue_wait,
    steady_window,
    timed,
)
from dloader.sidecar.node_policy.measured import MeasuredTruth, Split, show_split, split_of
from dloader.sidecar.node_policy.sharing import cpu_sets
from dloader.sidecar.node_policy.views import (
    Budget,
    JobView,
    ReportWindow,
    TreeSample,
    WorkerDecision,
    bounds,
)

__all__ = [
    "CORES_STEP",
    "EVENT_KINDS",
    "EWMA",
    "MAIN_CPU_CHANGE",
    "MAX_MAIN_CPU_PER_SAMPLE",
    "MAX_UPKEEP_CORES",
    "MEMORY_CHANGE",
    "MEMORY_FLAT_S",
    "MEMORY_GROWTH",
    "MIN_ACTIVITY",
    "TARGET_CHANGE",
    "Decided",
    "NodePolicy",
    "Order",
    "PolicyEvent",
    "PolicyJob",
    "Reported",
]

MAIN_CPU_CHANGE = 0.1
"""Relative change of a job's training-process CPU per sample, or of its workers' activity,
that calls for a decision."""

MEMORY_CHANGE = 0.1
"""A worker's peak memory grown by this share calls for a decision."""

MEMORY_GROWTH = 0.02, 2**20
"""(share, bytes) a workers' memory peak must pass its last mark by to count as growth."""

MEMORY_FLAT_S = 20.0
"""A job's workers' memory has settled after this long without growth."""

EWMA = 0.3
"""Weight of a new measurement of a job's training-process CPU, or of its workers' upkeep."""

CORES_STEP = 0.05
"""The cores an observation says a job's workers could use, rounded to this."""

CONTENDED = 0.05
"""Run-queue wait per unit of CPU time above which a job's workers were short of cores: then
the cores they were given come from the wait itself. Below it the wait is wake-up latency, not a
shortage, and the reports' sum of what the node has spare stands."""

MAX_MAIN_CPU_PER_SAMPLE = 100.0
"""The most CPU seconds per sample a job's training process is credited with (whatever its CPU
over its rate says): derived numbers stay finite."""

MAX_UPKEEP_CORES = 0.05
"""A worker's upkeep counted at most (a measurement off by a window)."""

MIN_ACTIVITY = 0.5
"""The lowest exponent of a job's workers' activity (``JobView.worker_activity``). An I/O-bound
job's workers are runnable a small part of the time at the cores they had, but the more they are
starved, the more of them wait runnable: an exponent measured where they had enough is not
carried below this."""

TARGET_CHANGE = 0.05
"""An allocator's target for a job within this share of the one it started from is the same."""


@dataclass
class PolicyJob:
    """What the policy knows of one job."""

    job_id: str
    model: LoaderModel
    batch_size: int
    """Its batch size, as it last reported."""
    workers: int
    """Its worker count, as it last reported (under ``guided``, its own tuner chose it)."""
    directed: int
    """The worker count it was last directed to."""
    directed_batch: int = 0
    """The batch size it was last directed to (0: its own)."""
    min_workers: int = 0
    max_workers: int = 0
    cpus: tuple[int, ...] = ()
    """The CPU set its workers were last directed to (empty: none)."""
    ceiling: int | None = None
    """Under ``guided``: the most its own tuner may choose (None: the policy sets the count)."""
    initial_workers: int = 0
    """The count the job registered with, or the allocator's target fed (exploration starts
    there)."""
    registered_at: float = 0.0
    directive_at: float = -math.inf
    """When its worker count last changed (never: it runs at the count it came with, since its
    loader started, so a window from its first batch counts, before or after it registered)."""
    reports: int = 0
    rate: float | None = None
    """Samples/s of its last report (None: no report yet)."""
    worker_cores: float = 0.0
    """Cores its workers used in its last report's window."""
    cpu_wait_share: float | None = None
    """Of its workers' time: waiting for a CPU, from its last two process-tree walks (None:
    unknown)."""
    tree: TreeSample | None = None
    """Its process tree, as last walked (None: not yet)."""
    tree_at: float = 0.0
    """When ``tree`` was walked."""
    main_cpu_per_sample: float = 0.0
    """CPU seconds its training process spends per sample (a moving average; 0: unknown)."""
    worker_upkeep_cores: float = 0.0
    """Cores each worker takes beyond its samples' work (a moving average; 0: unknown)."""
    worker_activity: float | None = None
    """How its workers claim cores when short (``JobView.worker_activity``; a moving average;
    None: not yet measured short of cores)."""
    run_length: int = 0
    """Windows observed in a row at its current worker count."""
    drift: int = 0
    """Surprising windows in a row: > 0 faster than predicted, < 0 slower."""
    recent: list[tuple[Split, LoaderObservation]] = field(default_factory=list)
    """The last windows (``COST_HISTORY``) its model learnt from since its costs last changed,
    each with the node's split then: what a new window's time per sample is compared with."""
    placed: bool = False
    """Its model has decided its worker count at least once."""
    niced: bool = False
    """Its workers were directed to the node's worker nice value (:meth:`NodePolicy.nice_for`)."""
    worker_memory_bytes: float = 0.0
    """The most private memory (USS) one of its workers held."""
    worker_memory_bound: float = 0.0
    """While that grows: the most one may come to hold (0: settled)."""
    memory_mark: float = 0.0
    """Its workers' peak USS when it last grew."""
    memory_grew_at: float = -math.inf
    """When that was; -inf: never measured."""
    cpu_target: float = 0.0
    """The allocator's cores for it that it last started from (0: none)."""
    decision: WorkerDecision | None = None
    """The policy's last answer for it."""


UNPLACED_NICE_S = 10.0
"""How long a new job's workers may run at the trainers' priority while ``adaptive`` has not
placed it (:meth:`NodePolicy.nice_for`): a bound for a job whose model cannot place it (a
loader that times no batch); a timed one is placed within a few seconds."""

MIN_SHARE = 0.1
"""The least CPU share (cores) a job is given: one the policy could not size, or a loader not
started."""

EVENT_KINDS = ("placed", "directed", "expected", "restarted", "changed", "target", "ceiling")
"""What a :class:`PolicyEvent` records: a job placed by its model for the first time; a worker
count directed by a decision (with the model's expectation of the job there, under
``adaptive``); the model's expectation of a job at a new split (every job with a model, each
change of the split); a job's model restarted after its costs changed; a job measured unlike
before at the same split (every split's measurements forgotten); a count started from the
allocator's target; a ceiling set for the job's own tuner (``guided``)."""


@dataclass(frozen=True)
class PolicyEvent:
    """One record of what the policy did or learnt about a job (:data:`EVENT_KINDS`)."""

    kind: str
    job_id: str
    num_workers: int
    """The job's worker count it concerns (``ceiling``: the ceiling)."""
    samples_per_s: float | None = None
    """Samples/s the job's model expects of it at that count, the node's cores shared as at
    the split (None: no expectation: no model yet, or not ``adaptive``); ``changed``: what the
    job measured."""


@dataclass(frozen=True)
class Order:
    """A change to one job's directive: ``changes`` are :class:`~dloader._shared.node_messages.
    Directive` fields (``num_workers``, ``tune_up_to``, ``cpus``, ``worker_nice``)."""

    job_id: str
    reason: str
    changes: dict[str, Any]


@dataclass
class Decided:
    """What one decision directs and says."""

    orders: list[Order] = field(default_factory=list)
    """Directive changes, in the order to send them."""
    shares: dict[str, float] = field(default_factory=dict)
    """Each job's CPU share in cores (for cgroup weights; empty unless asked for)."""
    notes: list[str] = field(default_factory=list)
    """Lines for the daemon's log."""
    events: list[PolicyEvent] = field(default_factory=list)
    """Records for the state file."""


@dataclass(frozen=True)
class Reported:
    """What one report window did to the policy."""

    learned: bool
    """Its job's model took the window."""
    wake: bool
    """News: decide now rather than at the next period."""
    notes: tuple[str, ...] = ()
    events: tuple[PolicyEvent, ...] = ()


class NodePolicy:
    """Every job's state, the node's measured truth, and the decision (:meth:`decide`)."""

    def __init__(
        self, name: str, budget: Budget, *, spare: float = HEDGE_COST, worker_nice: int = 0
    ) -> None:
        """``name``: a policy of :data:`~.views.POLICIES`; ``budget``: the node's worker and CPU
        budgets (the memory budget comes with each decision: it moves with the node);
        ``spare``: the storage slow-down an I/O-bound job's spare workers carry (1: none;
        ``HEDGE_COST``); ``worker_nice``: the nice value the jobs' loader workers run at
        (0: left alone; :meth:`nice_for`)."""
        if not (math.isfinite(spare) and 1.0 <= spare <= MAX_SPARE):
            raise ValueError(f"spare={spare}: expected within [1, {MAX_SPARE:g}] (1: none)")
        self.name = name
        self.budget = budget
        self.spare = spare
        self.worker_nice = worker_nice
        self.jobs: dict[str, PolicyJob] = {}
        self.truth = MeasuredTruth()
        self.dirty = True
        """Something the decision depends on changed since the last one."""
        self.changed_at = -math.inf
        """When any job's worker count last changed."""
        self.decided_at = -math.inf

    @property
    def guided(self) -> bool:
        """The jobs' own tuners choose their counts, within the ceilings the policy sets."""
        return self.name == "guided"

    # ------------------------------------------------------------------ what it is fed

    def configure(self, name: str, budget: Budget) -> list[Order]:
        """Another policy or budget; the orders that hand counts back to the policy (leaving
        ``guided``, the jobs' own tuners stop)."""
        self.name, self.budget, self.dirty = name, budget, True
        orders = []
        if not self.guided:
            for s in self.jobs.values():
                if s.ceiling is not None:
                    s.ceiling, s.directed = None, s.workers
                    orders.append(
                        Order(
                            s.job_id,
                            f"policy {name}: the sidecar sets the count",
                            {"tune_up_to": None, "num_workers": s.workers},
                        )
                    )
        return orders

    def add(self, state: PolicyJob, now: float, tree: TreeSample | None = None) -> None:
        """A new job (or one restored after a restart). A new job's ``tree``, walked as it
        registered, is noted at once (:meth:`tree`): its first decision must not grow it on
        memory nothing has measured yet."""
        self.jobs[state.job_id] = state
        state.niced = state.niced or self.nice_for(state, now) is not None
        if tree is not None:
            self.tree(state.job_id, tree, now)
        self.dirty = True

    def remove(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)
        self.dirty = True

    def direct_batch(self, job_id: str, batch_size: int) -> None:
        """The job was directed to ``batch_size`` (by the cluster allocator)."""
        self.jobs[job_id].directed_batch = batch_size

    def target(self, job_id: str, cores: float, ranks: int, now: float) -> Decided:
        """The cluster allocator's ``cores`` for the job's ``ranks`` local processes (a prior,
        not a cage): a job its model has not placed yet starts (and explores) from the worker
        count its share feeds, within its limits and the node's budget; from then on the
        policy arbitrates from what the jobs measure. Nothing to do for a target it already
        started from (within ``TARGET_CHANGE``), or once its model decides."""
        s, out = self.jobs[job_id], Decided()
        if s.placed or abs(cores - s.cpu_target) <= TARGET_CHANGE * cores:
            return out
        s.cpu_target = cores
        share = cores / max(ranks, 1)
        workers = s.model.workers_for(max(share, 1e-3)) if s.model.observations else round(share)
        low, high = bounds(self._view(s), self.budget)
        workers = min(max(workers, low), high)
        if workers == s.initial_workers == s.directed:
            return out
        s.initial_workers = workers
        reason = f"the allocator's target: {share:.2f} cores feed {workers} worker(s)"
        out.notes.append(f"job {job_id}: {reason}")
        out.events.append(PolicyEvent("target", job_id, workers))
        if workers != s.directed:
            out.orders.append(Order(job_id, reason, {"num_workers": workers}))
            self._moved(s, workers, now)
        return out

    def report(self, job_id: str, w: ReportWindow, now: float) -> Reported:
        """One report window of a job (its fields already checked): learns from it what it
        teaches (:func:`~.learning.learning_gate`) and what the split measured."""
        s = self.jobs[job_id]
        k, b = w.num_workers, w.batch_size
        s.reports += 1
        s.rate = w.samples_per_s
        if (k, b) != (s.workers, s.batch_size):
            s.workers, s.batch_size = k, b
            self.dirty = True
        tput, step, busy = w.samples_per_s, w.step_s, w.busy
        if not (tput > 0 and step > 0):
            return Reported(False, False)
        fetch = sum(w.fetch_s) / busy if busy else None
        cpu = sum(w.cpu_s) / busy if busy else None
        s.worker_cores = tput * cpu / b if cpu is not None else 0.0
        wait = run_queue_wait(list(w.run_delay_s), s.cpu_wait_share, fetch, cpu, busy * b / tput)
        if cpu is not None and wait is not None:
            self._note_activity(s, tput * (cpu + wait) / b, cpu, wait)
        obs = LoaderObservation(
            num_workers=k,
            cores=self._available_cores(s, cpu, wait) if cpu is not None else self.budget.cores,
            batch_size=b,
            samples_per_s=tput,
            idle_share=w.idle_share,
            step_s=step,
            fetch_s=fetch,
            cpu_s=cpu,
            cpu_wait_s=wait,
        )
        notes: list[str] = []
        events: list[PolicyEvent] = []
        if self._measure(s, w, now):
            notes.append(
                f"job {s.job_id} measured {w.samples_per_s:,.0f} samples/s at "
                f"{show_split(self.split())}, unlike before there: the node changed; every "
                "split's measurements are forgotten"
            )
            events.append(PolicyEvent("changed", s.job_id, s.directed, w.samples_per_s))
        gate = learning_gate(
            s.model,
            obs,
            window_s=w.window_s,
            directed_workers=k if self.guided else s.directed,
            busy_workers=busy,
            since_directive_s=now - s.directive_at,
            since_node_change_s=now - self.changed_at,
            reports=s.reports,
            run_length=s.run_length,
        )
        s.run_length = gate.run_length
        if not gate.observe:
            return Reported(False, False, tuple(notes), tuple(events))
        split = self.split()
        # against the recent windows the model learnt from at the same split of the node; where
        # none is (the split moved since), their CPU time per sample alone, which the split
        # moves less: a cost that changed just after a move was otherwise missed (a job whose
        # samples became half as dear ran 40 s at the count of the dearer ones)
        same = [o for at, o in s.recent if at == split]
        cost = cost_change(same or [o for _, o in s.recent], obs, split_moved=not same)
        moved = cost.moved
        s.model.update(obs, refit=gate.redecide_now and not moved)  # refit on news only
        s.recent = [*s.recent, (split, obs)][-COST_HISTORY:]
        why = ""
        if moved:
            bound = math.copysign(cost.threshold, cost.change)  # e.g. 1.4x more, or 1.4x less
            what = "time per sample" if same else "CPU time per sample"
            where = "at this split" if same else "before the split moved"
            why = (
                f"its workers' {what} {100 * math.expm1(cost.change):+.0f}% from its recent "
                f"windows' {where} (beyond {100 * math.expm1(bound):+.0f}%)"
            )
            keep = 1
        elif self._note_drift(s, obs, gate.surprise):
            why = (
                f"{DRIFT_WINDOWS} windows in a row {'faster' if gate.surprise > 0 else 'slower'} "
                f"than its model predicted (last: {100 * math.expm1(gate.surprise):.0f}%)"
            )
            keep = DRIFT_WINDOWS
        if why:
            s.model.keep_recent(keep, keep_shape=True)
            s.drift, s.recent = 0, [(split, obs)]
            self.truth.forget()
            self.dirty = True
            notes.append(
                f"job {s.job_id}: {why}: its costs changed; the model restarts from the last "
                f"{keep} window(s), its shape kept"
            )
            # what the restarted model expects here (the last one recorded was the old model's)
            counts = {j.job_id: j.directed for j in self.jobs.values()}
            expect = expected([self._view(j) for j in self.jobs.values()], self.budget, counts)
            if s.job_id in expect and not self.guided:  # guided: the job's own count
                notes.append(
                    f"job {s.job_id}: {counts[s.job_id]} workers (its model restarted) "
                    f"[model: {expect[s.job_id]:,.0f} samples/s]"
                )
            events.append(PolicyEvent("restarted", s.job_id, s.directed, expect.get(s.job_id)))
        decided = s.decision.candidates if s.decision else ()
        if gate.redecide_now or curve_moved(self._view(s), self.budget, decided):
            self.dirty = True
        wake = gate.redecide_now or moved
        return Reported(True, wake, tuple(notes), tuple(events))

    def tree(self, job_id: str, tree: TreeSample, now: float) -> None:
        """A new walk of the job's process tree (alive): its workers' wait for a CPU, their
        memory, its training process's CPU per sample, each worker's upkeep."""
        s = self.jobs[job_id]
        before, before_at = s.tree, s.tree_at
        was_started = _started(s)
        s.tree, s.tree_at = tree, now
        if _started(s) != was_started:  # its loader's workers came (or went before a batch)
            self.dirty = True
        if before is not None and now > before_at:
            # the share of time the job's workers waited, runnable, for a CPU
            was, is_ = before.run_delay_s, tree.run_delay_s
            waits = [(is_[p] - was[p]) / (now - before_at) for p in is_ if p in was]
            s.cpu_wait_share = min(sum(waits) / len(waits), 1.0) if waits else None
        self._note_memory(s, now)
        if s.rate and tree.main_cores > 0:
            x = min(tree.main_cores / s.rate, MAX_MAIN_CPU_PER_SAMPLE)
            m = s.main_cpu_per_sample
            s.main_cpu_per_sample = x if m == 0 else m + EWMA * (x - m)
            if m == 0 or abs(s.main_cpu_per_sample / m - 1) > MAIN_CPU_CHANGE:
                self.dirty = True
        self._note_upkeep(s)

    def nice_for(self, s: PolicyJob, now: float) -> int | None:
        """The nice value ``s``'s workers are to run at now (None: left alone): the node's,
        but for a new job ``adaptive`` has not placed yet, whose workers run at the trainers'
        priority until its model places it (at most ``UNPLACED_NICE_S``): on a crowded node a
        niced worker's batch took seconds, and the model waits for timed batches to place the
        job. Niced once placed (the agent never lowers a nice value)."""
        if not self.worker_nice:
            return None
        if self.name == "adaptive" and not s.placed and now - s.registered_at < UNPLACED_NICE_S:
            return None
        return self.worker_nice

    # ------------------------------------------------------------------ the decision

    def due(self, now: float) -> bool:
        """Whether to decide now: something changed, a job's workers are due their nice value
        (:meth:`nice_for`), or (``adaptive``, steady) a probe of a neighbouring split is
        due."""
        steady = min(now - self.changed_at, now - self.decided_at)
        return (
            self.dirty
            or (self.name == "adaptive" and steady >= self.truth.probe_wait)
            or any(not s.niced and self.nice_for(s, now) is not None for s in self.jobs.values())
        )

    def decide(
        self,
        now: float,
        memory_bytes: float = math.inf,
        *,
        cpus: Sequence[int] = (),
        shares: bool = False,
    ) -> Decided:
        """The split: every job's worker count (``guided``: its ceiling), the orders that
        enact it, and (with ``cpus`` to divide, or ``shares``) each job's CPU share and CPU
        set. ``memory_bytes``: what all jobs' workers may hold now."""
        self.dirty, self.decided_at = False, now
        out = Decided()
        states = list(self.jobs.values())
        if not states:
            return out
        views = [self._view(s) for s in states]
        budget = replace(self.budget, memory_bytes=memory_bytes)
        decisions = decide(self.name, views, budget, hedge=self.spare)
        if self.name == "adaptive":
            # measurements steer the jobs that run: a loader never iterated holds nothing and
            # would keep them all unsteered until it ran (a job that comes when it starts)
            live = [v for v in views if v.started]
            ids = {v.job_id for v in live}
            steered = self.truth.steer(
                live,
                budget,
                {j: d for j, d in decisions.items() if j in ids},
                self.split(),
                self._limits(),
                now,
                self.changed_at,
            )
            decisions = {**decisions, **steered}
        if cpus or shares:
            self._divide_cpus(states, decisions, cpus, out)
        if self.guided:
            for s in states:
                d = s.decision = decisions[s.job_id]
                if d.num_workers != s.ceiling:
                    # num_workers: for a loader that cannot tune itself, its count within it
                    s.ceiling, s.directed = d.num_workers, min(s.workers, d.num_workers)
                    changes = {"tune_up_to": s.ceiling, "num_workers": s.directed}
                    out.orders.append(Order(s.job_id, d.reason, changes))
                    out.notes.append(f"job {s.job_id}: {d.reason}")
                    out.events.append(PolicyEvent("ceiling", s.job_id, d.num_workers))
            self._nice_workers(states, now, out)
            return out
        changed = any(decisions[s.job_id].num_workers != s.directed for s in states)
        expect = (
            expected(views, budget, {j: d.num_workers for j, d in decisions.items()})
            if changed and self.name == "adaptive"
            else {}
        )
        for s in states:
            d = s.decision = decisions[s.job_id]
            if not s.placed and self.name == "adaptive" and s.model.observations:
                s.placed = d.placed
                if s.placed:
                    out.events.append(PolicyEvent("placed", s.job_id, d.num_workers))
                    out.notes.append(
                        f"job {s.job_id}: placed by its model {now - s.registered_at:.1f} s "
                        f"after registering: {d.num_workers} workers ({d.reason})"
                    )
            if d.num_workers != s.directed:
                out.orders.append(Order(s.job_id, d.reason, {"num_workers": d.num_workers}))
                self._moved(s, d.num_workers, now)
                # what the model expects of the job at this split, the node's cores shared
                model = f" [model: {expect[s.job_id]:,.0f} samples/s]" if s.job_id in expect else ""
                out.notes.append(f"job {s.job_id}: {d.num_workers} workers ({d.reason}){model}")
                out.events.append(
                    PolicyEvent("directed", s.job_id, d.num_workers, expect.get(s.job_id))
                )
        self._nice_workers(states, now, out)
        if expect:  # every job's expectation at the new split: the benchmarks check it
            shown = ", ".join(f"{j}={v:.0f}" for j, v in expect.items())
            out.notes.append(f"the model expects (samples/s): {shown}")
            out.events += [
                PolicyEvent("expected", j, decisions[j].num_workers, v) for j, v in expect.items()
            ]
        return out

    def split(self) -> Split:
        """The node's split: every running job's directed worker count (a loader never
        iterated holds none: it joins the split when its workers run)."""
        return split_of({s.job_id: s.directed for s in self.jobs.values() if _started(s)})

    def view(self, job_id: str) -> JobView:
        """What the allocation sees of a job."""
        return self._view(self.jobs[job_id])

    # ------------------------------------------------------------------ internals

    def _view(self, s: PolicyJob) -> JobView:
        return JobView(
            s.job_id,
            s.batch_size,
            s.workers if self.guided else s.directed,
            s.min_workers,
            s.max_workers,
            s.model,
            s.initial_workers,
            s.main_cpu_per_sample,
            s.worker_memory_bytes,
            s.worker_memory_bound,
            s.worker_upkeep_cores,
            1.0 if s.worker_activity is None else s.worker_activity,
            started=_started(s),
        )

    def _nice_workers(self, states: list[PolicyJob], now: float, out: Decided) -> None:
        """Orders the node's nice value for the jobs whose workers run without it and are now
        to have it (:meth:`nice_for`), with the job's other change of this decision if it has
        one (one directive)."""
        for s in states:
            nice = None if s.niced else self.nice_for(s, now)
            if nice is None:
                continue
            s.niced = True
            at = next((i for i, o in enumerate(out.orders) if o.job_id == s.job_id), None)
            if at is not None:
                o = out.orders[at]
                out.orders[at] = Order(o.job_id, o.reason, {**o.changes, "worker_nice": nice})
                continue
            if self.name != "adaptive":
                why = f"policy {self.name}"
            elif s.placed:
                why = "placed"
            else:
                why = f"not placed in {UNPLACED_NICE_S:g} s"
            reason = f"{why}: its loader workers at nice {nice}, behind the trainers"
            out.orders.append(Order(s.job_id, reason, {"worker_nice": nice}))

    def _moved(self, s: PolicyJob, workers: int, now: float) -> None:
        s.directed = workers
        s.directive_at = self.changed_at = now

    def _limits(self) -> dict[str, float]:
        return {
            s.job_id: s.model.accelerator_limit(s.directed_batch or s.batch_size)
            for s in self.jobs.values()
            if s.model.observations
        }

    def _available_cores(self, s: PolicyJob, cpu: float, wait: float | None) -> float:
        """The cores ``s``'s workers could have used in its last window (``cpu``, ``wait``:
        a batch's CPU time and run-queue wait): those they used, and those no job used (the
        node's CPU budget less every job's workers and training process, from their last
        reports). On a full node that is what the job's workers got, not the node's cores: its
        model learns its own curve, how fast it loads given the cores it gets, and the policy's
        CPU sharing says how many it will get at a split (a model fitted as if each job had
        every core reads the others' contention as its own limit, and a CPU-bound job's fewer
        workers as a loss they are not).

        Where the workers waited for a CPU (more than ``CONTENDED`` of their CPU time), the node
        was full for them whatever the reports add up to, and what they were given is measured
        directly: while runnable each ran ``cpu / (cpu + wait)`` of the time, so the workers
        were given their count times that. The reports' sum misses the CPU of whatever does not
        report (the training processes' other threads, the sidecar, the rest of the node): it
        once put a starved JPEG job at 1.35 cores where its workers were given 0.63, and the
        model, fitted to such windows, levelled off at half the job's throughput. Rounded to
        ``CORES_STEP``."""
        budget = self.budget.cores
        taken = sum(
            j.worker_cores + j.main_cpu_per_sample * j.rate
            for j in self.jobs.values()
            if j.rate is not None
        )
        free = s.worker_cores + max(budget - taken, 0.0)
        if wait is not None and _short_of_cores(cpu, wait):
            free = min(free, s.workers * cpu / (cpu + wait))
        return min(max(round(free / CORES_STEP) * CORES_STEP, CORES_STEP), budget)

    def _measure(self, s: PolicyJob, w: ReportWindow, now: float) -> bool:
        """Records a steady window of ``s`` at the node's current split: at its directed
        count, the whole window after the last change of any job plus ``SETTLE_S``, one per
        window. A split measured in full for the first time calls for a decision. True: the
        window is unlike what the job measured there before (the node changed; every split's
        measurements are forgotten)."""
        window = w.window_s
        steady = (
            steady_window(
                window,
                w.num_workers,
                s.directed,
                w.busy,
                now - s.directive_at,
                now - self.changed_at,
            )
            and s.reports % max(int(window), 1) == 0
        )
        if not steady or self.name != "adaptive":
            return False
        split, limits = self.split(), self._limits()
        known = self.truth.known(split, limits, now)
        if self.truth.record(split, s.job_id, w.samples_per_s, now):
            self.dirty = True
            return True
        if not known and self.truth.known(split, limits, now):
            self.dirty = True
        return False

    def _note_drift(self, s: PolicyJob, obs: LoaderObservation, surprise: float) -> bool:
        """Whether ``DRIFT_WINDOWS`` surprising windows came in a row, all one way (the job's
        costs changed, where its workers' timings could not say it in one window). A window
        with full timings (:func:`~.learning.timed`) breaks the row: they said no change."""
        # +1 faster, -1 slower, 0 as predicted (or timed)
        way = 0 if timed(obs) else (surprise > 0) - (surprise < 0)
        s.drift = s.drift + way if way * s.drift > 0 else way
        return abs(s.drift) >= DRIFT_WINDOWS

    def _note_memory(self, s: PolicyJob, now: float) -> None:
        """One more worker of the job costs what its largest worker holds privately (its USS
        grows over an epoch as the worker copies the dataset pages Python touches: the peak
        is kept). Before any worker was measured, the training process's own USS: what a
        worker that touched all of it would copy.

        While that peak still grows (it passed its last mark by ``MEMORY_GROWTH`` within
        ``MEMORY_FLAT_S``; a job's first measurement counts as growth), the job's workers may
        come to hold up to the anonymous memory they map (private, or shared with the trainer
        and not yet copied): the policy counts new workers at that bound, so no job grows on
        memory its workers have not shown they stay within."""
        tree = s.tree
        if tree is None:
            return
        workers = tree.worker_uss
        if workers:
            peak = float(max(workers))
            first = s.memory_mark == 0
            if first or peak > s.worker_memory_bytes * (1 + MEMORY_CHANGE):
                self.dirty = True
            # the first measured worker replaces the guess made from the trainer
            s.worker_memory_bytes = peak if first else max(s.worker_memory_bytes, peak)
            share, floor = MEMORY_GROWTH
            if first or peak > s.memory_mark * (1 + share) + floor:
                s.memory_mark, s.memory_grew_at = peak, now
            growing = now - s.memory_grew_at < MEMORY_FLAT_S
            bound = float(max(tree.worker_anon, default=0.0)) if growing else 0.0
        elif s.memory_mark == 0:  # no worker measured yet: a guess from the trainer
            s.worker_memory_bytes = float(sum(tree.main_uss))
            bound = float(tree.main_anon)
        else:  # none now (e.g. resized to 0): what its workers showed stands
            return
        if (bound == 0) != (s.worker_memory_bound == 0):  # settled, or growing again
            self.dirty = True
        s.worker_memory_bound = max(bound, s.worker_memory_bytes) if bound else 0.0

    def _note_activity(self, s: PolicyJob, runnable: float, cpu: float, wait: float) -> None:
        """How many of ``s``'s workers were runnable (running or waiting for a CPU) in a window
        where they were short of cores (run-queue wait above ``CONTENDED`` of their CPU time):
        ``runnable`` threads on average, its samples/s times a batch's CPU time and wait per
        sample. The kernel shares the node between runnable threads, and a job's workers are not
        all runnable: they block on a full queue, on I/O, on a training process that has not
        taken the last batch. Recorded as the exponent ``a`` with ``k ** a = runnable`` (``k``
        workers, at least 2; ``MIN_ACTIVITY`` to 1), which carries the measurement to the other
        counts (a CPU-bound job's 2-9 workers held an exponent of 0.77-0.88 while the share of
        them runnable fell from 0.92 to 0.63). With every worker counted as runnable, its
        one-worker neighbour was given 0.19 cores where the kernel gave it 0.33, and predicted
        30-40% slow at every split. A moving average; a change beyond ``MAIN_CPU_CHANGE`` calls
        for a decision."""
        k = s.workers
        if k < 2 or not _short_of_cores(cpu, wait):
            return
        x = min(max(math.log(max(runnable, 1.0)) / math.log(k), MIN_ACTIVITY), 1.0)
        a = s.worker_activity
        s.worker_activity = x if a is None else a + EWMA * (x - a)
        if a is None or abs(s.worker_activity / a - 1) > MAIN_CPU_CHANGE:
            self.dirty = True

    def _note_upkeep(self, s: PolicyJob) -> None:
        """What each of the job's workers costs the node beyond its samples' work: its tree's
        CPU less the training process's and the per-sample CPU its workers report (waking,
        sending batches, idling), per worker; a moving average, at most ``MAX_UPKEEP_CORES``.
        The policy counts it in the job's CPU demand at every count, so that a worker more for
        an I/O-bound job on a full node is priced at what it takes."""
        tree, k = s.tree, s.workers
        if tree is None or k < 1 or s.rate is None or not tree.has_workers:
            return
        workers = max(tree.cpu_cores - tree.main_cores, 0.0)
        x = min(max(workers - s.worker_cores, 0.0) / k, MAX_UPKEEP_CORES)
        u = s.worker_upkeep_cores
        s.worker_upkeep_cores = x if u == 0 else u + EWMA * (x - u)

    def _divide_cpus(
        self,
        states: list[PolicyJob],
        decisions: dict[str, WorkerDecision],
        cpus: Sequence[int],
        out: Decided,
    ) -> None:
        """Each job's CPU share (a job the policy could not size gets an equal part of what
        the others leave) and, with ``cpus``, disjoint CPU sets sized by the shares. A loader
        never iterated (:func:`_started`) gets the least share and no set: it has no workers
        to run, and a set of its own would idle CPUs the others need."""
        cores = self.budget.cores
        live = [s.job_id for s in states if _started(s)]
        known = [decisions[j].cpu_share for j in live if decisions[j].cpu_share > 0]
        fallback = (cores - sum(known)) / max(len(live) - len(known), 1) if known else 1.0
        out.shares = dict.fromkeys((s.job_id for s in states), MIN_SHARE)
        out.shares |= {j: decisions[j].cpu_share or max(fallback, MIN_SHARE) for j in live}
        if not cpus:
            return
        sets = cpu_sets({j: out.shares[j] for j in live}, cpus)
        for s in states:
            got = sets.get(s.job_id, ())
            if got and got != s.cpus:
                s.cpus = got
                reason = f"CPU set {list(got)}: its share {out.shares[s.job_id]:.2f} cores"
                out.orders.append(Order(s.job_id, reason, {"cpus": got}))


def _short_of_cores(cpu: float, wait: float) -> bool:
    """Whether workers whose batch took ``cpu`` seconds of CPU and ``wait`` of run-queue wait
    were short of cores: a wait beyond ``CONTENDED`` of their CPU time (below it, wake-up
    latency)."""
    return cpu > 0 and wait > CONTENDED * cpu


def _started(s: PolicyJob) -> bool:
    """Whether ``s``'s loader runs (:attr:`JobView.started`): it has delivered a batch, or its
    last tree walk found loader workers (not walked yet, or no workers asked for: assumed)."""
    return (
        bool(s.model.observations)
        or bool(s.rate)
        or s.workers == 0
        or s.tree is None
        or s.tree.has_workers
    )
