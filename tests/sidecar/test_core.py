"""NodeCore with a fake clock and fake process trees: what reports teach the models."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dloader.sidecar.core as core_mod
import dloader.sidecar.node_policy as pol
import dloader.sidecar.node_policy.measured as measured_mod
import dloader.sidecar.node_policy.node as node_mod
from dloader._daemon.peer import CALLER, Caller, Role
from dloader._shared.node_messages import (
    Directive,
    JobLimits,
    JobReport,
    Registration,
    WorkerReport,
)
from dloader.errors import InvalidArgument, ResourceExhausted
from dloader.sidecar.config import PolicySettings
from dloader.sidecar.core import Job, NodeCore
from dloader.sidecar.monitors import ProcessTreeStats, process_start
from dloader.sidecar.store import SidecarStore


class FakeNode:
    """A job process 100 with workers 201 and 202, each waiting ``wait_share`` of the time for a
    CPU; a clock the test moves."""

    def __init__(self, wait_share: float) -> None:
        self.now = 1000.0
        self.wait_share = wait_share

    def clock(self) -> float:
        return self.now

    def start(self, pid: int) -> int | None:
        """The fake processes' start times (ticks after boot): all started at tick 1."""
        return 1 if pid in (100, 101, 102, 201, 202) else None

    def owner(self, pid: int) -> int | None:
        return 0 if self.start(pid) is not None else None

    def tree(self, pids: list[int]) -> ProcessTreeStats:
        delay = {p: self.now * self.wait_share for p in (201, 202)}
        return ProcessTreeStats(
            tuple(pids), True, 150.0, 1 << 20, (201, 202), 10.0, {100: 0.0, **delay}
        )


FAKE = FakeNode(0.0)  # its processes' start times and owners (the same for every FakeNode)


def fake_core(store: SidecarStore, settings: PolicySettings, **kw: Any) -> NodeCore:
    """A core whose processes are the fake node's (``tree_stats`` and the rest in ``kw``)."""
    return NodeCore(store, settings, start_of=FAKE.start, owner_of=FAKE.owner, **kw)


def node_core(tmp_path: Path, settings: PolicySettings, node: FakeNode, **kw: Any) -> NodeCore:
    """A core on the fake ``node`` (its process trees and clock), stored in ``tmp_path``."""
    return fake_core(
        SidecarStore(tmp_path / "s.db"), settings, tree_stats=node.tree, clock=node.clock, **kw
    )


def report(workers: int, tput: float) -> JobReport:
    return JobReport(
        timestamp=0.0,
        num_workers=workers,
        batch_size=32,
        samples_per_second=tput,
        idle_share=0.5,
        step_seconds=32 / tput,
        wait_seconds=0.0,
        window_seconds=2.0,
        samples=0,
        workers=tuple(WorkerReport(201 + i, 0.2, 0.1, 10) for i in range(workers)),
    )


def report_each_second(
    core: NodeCore,
    node: FakeNode,
    jobs: tuple[Job, ...],
    seconds: int,
    tput: dict[str, float],
) -> None:
    """Each job reports once a second for ``seconds``, at its directed count, at the samples/s
    ``tput`` gives its name."""
    for _ in range(seconds):
        node.now += 1.0
        for job in jobs:
            core.report(job, report(job.directive.num_workers, tput[job.record.name]))


@pytest.mark.parametrize("wait_share", [0.0, 0.25])
def test_observations_carry_the_workers_run_queue_wait(tmp_path: Path, wait_share: float) -> None:
    node = FakeNode(wait_share)
    core = node_core(tmp_path, PolicySettings("even", 2, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    core.reap()
    node.now += 2.0
    core.reap()  # two measurements 2 s apart: the wait share is known
    node.now += 5.0  # past the settling time of the first directive
    core.report(job, report(2, 300.0))
    obs = job.model.observations[-1]
    assert obs.fetch_s == pytest.approx(0.2)
    # each of the 2 workers delivers a batch of 32 every 2 * 32 / 300 s, and waits only
    # while it works on one: a batch waited the wait share of that time, not of its fetch
    assert obs.cpu_wait_s == pytest.approx(wait_share * 2 * 32 / 300)


def test_the_first_window_takes_the_waits_its_workers_timed(tmp_path: Path) -> None:
    """A CPU-bound job's first report, on a crowded node: its workers timed their run-queue
    waits (0.09 s of each 0.2 s batch). The observation carries them at once, with no two tree
    walks to wait for (its first window read as I/O-bound placed it at 5 workers where 2 were
    right); a worker that cannot say leaves the walks' estimate (here: none yet)."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 4, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 2.0
    timed = tuple(WorkerReport(201 + i, 0.2, 0.11, 10, 0.09) for i in range(2))
    core.report(job, replace(report(2, 300.0), workers=timed))
    assert job.model.observations[-1].cpu_wait_s == pytest.approx(0.09)
    assert job.model.io_seconds_per_sample == pytest.approx(0.0, abs=1e-9)  # no I/O
    half = (timed[0], WorkerReport(202, 0.2, 0.11, 10))
    other = core.register(Registration("b", pids=(101,), num_workers=2, batch_size=32))
    node.now += 2.0
    core.report(other, replace(report(2, 300.0), workers=half))
    assert other.model.observations[-1].cpu_wait_s is None


def test_a_worker_with_no_batch_in_the_window_is_left_out_of_its_timings(tmp_path: Path) -> None:
    """A worker that delivered nothing in the window (slow, or retiring after a cut) sends its
    moving average and no wait: counted, its stale timings and the walks' estimate of its wait
    moved a steady job's storage time by 148% and restarted its model. The window's timings are
    those of the workers that delivered in it; a loader too old to say keeps being read whole."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 4, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 2.0
    fresh = WorkerReport(201, 0.2, 0.11, 10, 0.09, window_batches=4)
    stale = WorkerReport(202, 0.9, 0.5, 10, window_batches=0)
    core.report(job, replace(report(2, 300.0), workers=(fresh, stale)))
    obs = job.model.observations[-1]
    assert (obs.fetch_s, obs.cpu_s, obs.cpu_wait_s) == pytest.approx((0.2, 0.11, 0.09))
    old = core.register(Registration("b", pids=(101,), num_workers=2, batch_size=32))
    node.now += 2.0
    unknown = (WorkerReport(201, 0.2, 0.1, 10), WorkerReport(202, 0.4, 0.1, 10))
    core.report(old, replace(report(2, 300.0), workers=unknown))
    assert old.model.observations[-1].fetch_s == pytest.approx(0.3)


def test_a_loaders_workers_say_which_delivered_in_the_window() -> None:
    """What a loader sends: a worker's window means with their batch count, or (none in the
    window) its moving average marked as such."""
    stats = SimpleNamespace(
        pid=7,
        batches=9,
        fetch_seconds=0.5,
        cpu_seconds=0.4,
        window_batches=0,
        window_fetch_seconds=0.0,
        window_cpu_seconds=0.0,
        window_run_delay_seconds=None,
    )
    assert WorkerReport.from_stats(stats) == WorkerReport(7, 0.5, 0.4, 9, None, 0)
    assert not WorkerReport.from_stats(stats).in_window
    busy = SimpleNamespace(
        **{
            **vars(stats),
            "window_batches": 3,
            "window_fetch_seconds": 0.2,
            "window_cpu_seconds": 0.1,
            "window_run_delay_seconds": 0.05,
        }
    )
    assert WorkerReport.from_stats(busy) == WorkerReport(7, 0.2, 0.1, 9, 0.05, 3)
    assert WorkerReport.from_stats(busy).in_window


@pytest.mark.parametrize("delay", [-0.5, math.nan, math.inf])
def test_a_timed_wait_that_cannot_be_is_refused_naming_it(tmp_path: Path, delay: float) -> None:
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 4, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=1, batch_size=32))
    bad = replace(report(1, 300.0), workers=(WorkerReport(201, 0.2, 0.1, 10, delay),))
    with pytest.raises(InvalidArgument, match=r"workers\[0\]\.run_delay_seconds"):
        core.report(job, bad)


@pytest.mark.parametrize(("delay", "window"), [(None, None), (0.0, 0), (0.125, 6)])
def test_a_workers_timed_wait_crosses_both_transports(
    delay: float | None, window: int | None
) -> None:
    r = replace(report(2, 300.0), workers=(WorkerReport(201, 0.2, 0.1, 10, delay, window),))
    assert JobReport.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert JobReport.from_pb(r.to_pb("job", "token")) == r


def test_a_tuning_ceiling_crosses_both_transports_and_must_be_positive() -> None:
    d = Directive(3, reason="guided", revision=4, worker_nice=10, tune_up_to=12)
    assert Directive.from_json(json.loads(json.dumps(d.to_json()))) == d
    assert Directive.from_pb(d.to_pb("job")) == d
    assert Directive.from_pb(Directive(3).to_pb("job")).tune_up_to is None  # unset: unchanged
    with pytest.raises(ValueError, match="tune_up_to=0: expected >= 1 or none"):
        Directive(3, tune_up_to=0)


def test_remote_workers_on_lending_nodes_cross_both_transports() -> None:
    d = Directive(3, revision=2, remote_workers=1, remote_lent=(("gpu-a", 2), ("gpu-b", 1)))
    assert Directive.from_json(json.loads(json.dumps(d.to_json()))) == d
    assert Directive.from_pb(d.to_pb("job")) == d
    assert Directive.from_pb(Directive(3).to_pb("job")).remote_lent == ()


def test_remote_workers_on_lending_nodes_stay_within_the_loaders_bound(tmp_path: Path) -> None:
    """The pool's workers first, then each lending node's (by node id), within the job's
    ``max_remote_workers`` in all; the same placement again sends no new directive."""
    node = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("even", 8, 2, 60.0))
    job = node.register(
        Registration("train", (os.getpid(),), 1, 32, JobLimits(max_remote_workers=4))
    )
    assert node.direct_remote_workers(job.job_id, 1, "lent", {"gpu-b": 2, "gpu-a": 2})
    d = job.directive
    assert (d.remote_workers, d.remote_lent) == (1, (("gpu-a", 2), ("gpu-b", 1)))
    assert node.direct_remote_workers(job.job_id, 1, "again", {"gpu-a": 2, "gpu-b": 2})
    assert job.directive.revision == d.revision
    assert node.direct_remote_workers(job.job_id, 0, "returned", {})
    assert (job.directive.remote_workers, job.directive.remote_lent) == (0, ())


def test_guided_sends_ceilings_and_leaves_the_counts_to_the_jobs(tmp_path: Path) -> None:
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("guided", 12, 2, 1.0), node)
    a = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    b = core.register(Registration("b", pids=(101,), num_workers=8, batch_size=32))
    core.decide()
    assert (a.directive.tune_up_to, a.directive.num_workers) == (6, 2)
    assert (b.directive.tune_up_to, b.directive.num_workers) == (6, 6)  # if it cannot tune
    node.now += 5.0
    core.report(a, report(5, 300.0))  # a's own tuner moved it to 5
    revision = a.directive.revision
    core.decide()
    assert a.directive.revision == revision  # same ceiling: nothing sent, 5 is a's to keep
    core.set_policy(PolicySettings("even", 12, 2, 1.0))  # the sidecar takes the counts back
    assert a.directive.tune_up_to is None and a.directive.num_workers == 6


def test_observations_carry_the_cores_a_jobs_workers_could_use(tmp_path: Path) -> None:
    # a node of 2 cores; each report's workers spend 0.1 s of CPU per batch of 32
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("even", 4, 2, 1.0), node)
    a = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    b = core.register(Registration("b", pids=(101,), num_workers=2, batch_size=32))
    node.now += 5.0
    core.report(a, report(a.directive.num_workers, 320.0))  # 1 core; the other is free
    assert a.model.observations[-1].cores == pytest.approx(2.0)
    core.report(b, report(b.directive.num_workers, 480.0))  # 1.5 cores: the node is full
    assert b.model.observations[-1].cores == pytest.approx(1.5)  # what it got, not 2
    node.now += 2.0
    core.report(a, report(a.directive.num_workers, 160.0))  # 0.5 core; 1.5 taken by b
    assert a.model.observations[-1].cores == pytest.approx(0.5)


def test_a_workers_run_queue_wait_is_per_batch_and_at_most_its_non_cpu_time() -> None:
    # workers busy a quarter of the time (a batch every 0.8 s, 0.2 s of fetch): the wait
    # share of wall time, 0.1, is 0.08 s per batch, 40% of its fetch
    assert pol.run_queue_wait([], 0.1, 0.2, 0.05, 0.8) == pytest.approx(0.08)
    assert pol.run_queue_wait([], 0.5, 0.2, 0.05, 0.8) == pytest.approx(0.15)  # capped
    assert pol.run_queue_wait([], None, 0.2, 0.05, 0.8) is None
    assert pol.run_queue_wait([], 0.1, None, None, 0.8) is None
    # the workers' own timings win where every worker has one (also capped)
    assert pol.run_queue_wait([0.02, 0.04], 0.1, 0.2, 0.05, 0.8) == pytest.approx(0.03)
    assert pol.run_queue_wait([0.3, 0.3], None, 0.2, 0.05, 0.8) == pytest.approx(0.15)
    assert pol.run_queue_wait([0.02, None], 0.1, 0.2, 0.05, 0.8) == pytest.approx(0.08)


def test_jobs_that_stop_reporting_expire_and_a_restart_gives_a_full_timeout(
    tmp_path: Path,
) -> None:
    node = FakeNode(0.0)
    store = SidecarStore(tmp_path / "s.db")
    settings = PolicySettings("even", 4, 2, 1.0)
    core = fake_core(
        store,
        settings,
        tree_stats=node.tree,
        clock=node.clock,
        job_timeout_s=30,
    )
    quiet = core.register(Registration("quiet", pids=(100,), num_workers=1, batch_size=32))
    talks = core.register(Registration("talks", pids=(100,), num_workers=1, batch_size=32))
    node.now += 20
    core.report(talks, report(1, 100.0))
    node.now += 15
    assert core.reap() == [quiet.job_id]  # 35 s silent > 30 s; its process is alive
    assert list(core.jobs) == [talks.job_id]
    node.now += 1000  # the sidecar was down; restored jobs get a full timeout
    again = fake_core(
        store,
        settings,
        tree_stats=node.tree,
        clock=node.clock,
        job_timeout_s=30,
    )
    assert again.reap() == [] and list(again.jobs) == [talks.job_id]


def test_registration_lists_are_bounded(tmp_path: Path) -> None:
    node = FakeNode(0.0)
    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 4, 2, 1.0),
        tree_stats=node.tree,
    )
    with pytest.raises(InvalidArgument, match="pids: 50000 ids"):
        core.register(Registration("many", pids=tuple(range(50_000)), num_workers=1, batch_size=8))
    with pytest.raises(InvalidArgument, match="num_workers"):
        core.register(Registration("w", pids=(100,), num_workers=10**9, batch_size=8))


MiB = 2**20


def tree_with_memory(pids: list[int]) -> ProcessTreeStats:
    return ProcessTreeStats(
        tuple(pids),
        True,
        150.0,
        1 << 30,
        (201, 202),
        10.0,
        {},
        {100: 400 * MiB, 201: 150 * MiB, 202: 250 * MiB},
        700 * MiB,
    )


@pytest.mark.parametrize(
    ("setting", "budget"), [(0.5, 0.5 * (1000 + 400) * MiB), (1 << 30, 1 << 30)]
)
def test_memory_budget_and_the_cost_of_a_worker(
    tmp_path: Path, setting: float, budget: float
) -> None:
    """A worker costs the peak private memory of the job's workers; a fractional budget is a
    share of the available memory plus what the workers hold; the policy stays under it."""
    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 16, 2, 1.0, setting),
        tree_stats=tree_with_memory,
        available_memory=lambda: 1000 * MiB,
    )
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    core.reap()
    assert job.state.worker_memory_bytes == 250 * MiB  # the larger of its two workers
    assert core.memory_budget() == (pytest.approx(budget), 400 * MiB)
    core.decide()
    assert job.directive.num_workers * 250 * MiB <= budget
    assert job.decision is not None and job.decision.memory_limited
    assert "memory budget" in job.decision.reason


def test_before_any_worker_a_worker_is_assumed_to_copy_the_trainer(tmp_path: Path) -> None:
    def no_workers(pids: list[int]) -> ProcessTreeStats:
        return ProcessTreeStats(tuple(pids), True, 1.0, 1, (), 1.0, {}, {100: 300 * MiB})

    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 16, 2, 1.0, 1 << 30),
        tree_stats=no_workers,
    )
    job = core.register(Registration("a", pids=(100,), num_workers=0, batch_size=32))
    core.reap()
    assert job.state.worker_memory_bytes == 300 * MiB
    core.decide()
    assert job.directive.num_workers == 3  # 3 x 300 MiB fit in 1 GiB; 4 would not


def test_a_new_job_is_learned_from_its_first_window(tmp_path: Path) -> None:
    """Registration changes nothing for the job: its first report (a 2 s window after
    registration) feeds the model at once, no settling time added."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 4, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    assert job.directive.num_workers == 2  # it explores from its own count
    node.now += 2.0
    core.report(job, report(2, 300.0))
    assert len(job.model.observations) == 1


def test_a_neighbours_change_is_not_credited_to_a_job(tmp_path: Path) -> None:
    """While another job's worker count has just changed, a job's window is not observed: the
    CPU contention moved under it."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("even", 4, 2, 1.0), node)
    two = JobLimits(max_workers=2)
    a = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32, limits=two))
    node.now += 2.0
    core.report(a, report(2, 300.0))
    assert len(a.model.observations) == 1  # its first window
    node.now += 10.0
    b = core.register(Registration("b", pids=(100,), num_workers=4, batch_size=32))
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)  # b changed, a did not
    node.now += 2.0
    core.report(a, report(2, 300.0))
    assert len(a.model.observations) == 1  # b's change lies within a's window
    for _ in range(2):  # one observation per window: every other 1 s report
        node.now += 4.0
        core.report(a, report(2, 300.0))
    assert len(a.model.observations) == 2


def test_a_job_new_to_a_busy_node_is_learned_from_its_first_window(tmp_path: Path) -> None:
    """A job the model has not seen yet learns from its first window even while its neighbours
    move (they re-divide the node as it arrives): else it would wait at its own count."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("even", 4, 2, 1.0), node)
    a = core.register(Registration("a", pids=(100,), num_workers=4, batch_size=32))
    node.now += 10.0
    b = core.register(Registration("b", pids=(100,), num_workers=2, batch_size=32))
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)  # a moved, b did not
    node.now += 2.0
    core.report(b, report(2, 300.0))
    assert len(b.model.observations) == 1


def _free_pids(count: int) -> list[int]:
    """PIDs no process holds now, just above the last one the kernel handed out."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    out, pid = [], last + 50
    while len(out) < count:
        pid += 1
        if not Path(f"/proc/{pid}").exists():
            out.append(pid)
    return out


def test_pids_that_no_process_holds_yet_cannot_be_claimed(tmp_path: Path) -> None:
    """S2: a user registered its own PID plus the next 63; root's next process got one of them
    and was counted as that user's. Every claimed PID must run now and be the caller's."""
    core = NodeCore(SidecarStore(tmp_path / "s.db"), PolicySettings("even", 4, 2, 1.0))
    me = Caller(Role.CLIENT, uid=os.geteuid(), pid=os.getpid())
    future = _free_pids(3)
    token = CALLER.set(me)
    try:
        with pytest.raises(InvalidArgument, match=f"process {future[0]} is not running"):
            core.register(
                Registration("grab", pids=(os.getpid(), *future), num_workers=1, batch_size=8)
            )
        assert not core.jobs
        # its own running process alone: accepted, pinned to its start time
        job = core.register(Registration("own", pids=(os.getpid(),), num_workers=1, batch_size=8))
        assert job.record.starts == [process_start(os.getpid())]
    finally:
        CALLER.reset(token)


def test_a_reused_pid_leaves_the_job_and_a_job_with_none_left_ends(tmp_path: Path) -> None:
    starts = {100: 1, 101: 1}
    store = SidecarStore(tmp_path / "s.db")
    node = FakeNode(0.0)
    core = NodeCore(
        store,
        PolicySettings("even", 4, 2, 1.0),
        tree_stats=node.tree,
        clock=node.clock,
        start_of=starts.get,
        owner_of=FAKE.owner,
    )
    job = core.register(Registration("a", pids=(100, 101), num_workers=1, batch_size=8))
    starts[101] = 7  # the kernel gave PID 101 to another process
    assert core.reap() == []
    assert job.record.pids == [100] and job.record.starts == [1]
    assert store.active_jobs()[0].pids == [100]  # and a restarted sidecar knows it
    del starts[100]  # the trainer exited
    assert core.reap() == [job.job_id] and not core.jobs


def test_one_user_cannot_fill_the_node_for_the_others(tmp_path: Path) -> None:
    """S3: one unprivileged user registered 254 jobs and the operator's RegisterJob got
    RESOURCE_EXHAUSTED. Now each user holds at most its share, and the operator keeps a way
    in. (Fake processes: each user's pids are its own.)"""
    owners = {pid: 1000 + pid // 1000 for pid in range(1000, 9000)}  # pid 1xxx: uid 1001, ...
    core = NodeCore(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 4, 2, 1.0),
        tree_stats=FAKE.tree,
        start_of=lambda pid: 1 if pid in owners else None,
        owner_of=owners.get,
    )

    def register_as(uid: int, pid: int) -> None:
        token = CALLER.set(Caller(Role.CLIENT, uid=uid, pid=pid))
        try:
            core.register(Registration(f"j{pid}", pids=(pid,), num_workers=0, batch_size=8))
        finally:
            CALLER.reset(token)

    for i in range(core_mod.MAX_JOBS_PER_USER):
        register_as(1001, 1000 + i)
    with pytest.raises(ResourceExhausted, match="uid 1001 holds 64 jobs"):
        register_as(1001, 1999)
    for uid in range(1002, 1006):  # other users fill the users' part of the table
        for i in range(core_mod.MAX_JOBS_PER_USER):
            if len(core.jobs) < core_mod.MAX_JOBS - core_mod.OPERATOR_RESERVE:
                register_as(uid, uid * 1000 - 1000000 + i)
    with pytest.raises(ResourceExhausted, match="kept for the operator"):
        register_as(1006, 6000)
    core.register(Registration("operator's", pids=(1000,), num_workers=0, batch_size=8))
    assert len(core.jobs) == core_mod.MAX_JOBS - core_mod.OPERATOR_RESERVE + 1


def memory_tree(
    pids: list[int], workers: tuple[int, ...], uss: dict[int, int], anon: dict[int, int]
) -> ProcessTreeStats:
    """A live tree of ``pids`` and ``workers``: each process's USS and anonymous memory."""
    return ProcessTreeStats(tuple(pids), True, 1.0, 1, workers, 1.0, {}, uss, 0, anon)


def test_the_agent_helper_is_no_loader_worker(tmp_path: Path) -> None:
    """The process that registers a job (its agent's helper, a child the training process
    spawned) is in the job's tree but is not one of its loader workers: before any worker
    runs, one worker is priced from the trainer (what a fork may copy), not at the helper's
    size (which let a copy-on-read job be placed at 16 workers: test_memory_growth)."""
    node = FakeNode(0.0)
    workers = {"pids": (203,)}  # the helper alone, then the helper and a worker

    def tree(pids: list[int]) -> ProcessTreeStats:
        uss = {100: 300 * MiB, 201: 120 * MiB, 203: 30 * MiB}
        return memory_tree(
            pids, workers["pids"], uss, {100: 400 * MiB, 201: 390 * MiB, 203: 35 * MiB}
        )

    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 16, 2, 1.0, 1 << 30),
        tree_stats=tree,
        clock=node.clock,
        translate_pids=lambda pids, _caller: pids,
    )
    token = CALLER.set(Caller(Role.OPERATOR, uid=0, pid=203))
    try:
        job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    finally:
        CALLER.reset(token)
    assert job.agent_pid == 203 and job.tree is not None and job.tree.worker_pids == ()
    assert job.state.worker_memory_bytes == 300 * MiB  # the trainer's, not the helper's 30
    assert job.state.worker_memory_bound == 400 * MiB
    workers["pids"] = (201, 203)
    core.reap()
    assert job.tree.worker_pids == (201,)
    assert job.state.worker_memory_bytes == 120 * MiB  # its worker, measured
    assert job.state.worker_memory_bound == 390 * MiB


def test_growing_workers_are_bounded_until_their_memory_settles(tmp_path: Path) -> None:
    """While the workers' peak USS grows, the job carries a bound (the most anonymous memory a
    worker maps: what it may yet copy from the trainer); once the peak has not grown for
    ``MEMORY_FLAT_S``, the bound goes and the measured peak alone counts."""
    node = FakeNode(0.0)
    held = {"uss": 20 * MiB}

    def growing(pids: list[int]) -> ProcessTreeStats:
        uss = {100: 300 * MiB, 201: held["uss"], 202: held["uss"] // 2}
        return memory_tree(pids, (201, 202), uss, {100: 400 * MiB, 201: 260 * MiB, 202: 250 * MiB})

    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 16, 2, 1.0, 1 << 30),
        tree_stats=growing,
        clock=node.clock,
        job_timeout_s=0,
    )
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    # measured at registration, before its first decision (a decision before the first
    # period's walk once grew a copy-on-read job past the budget: test_memory_growth)
    assert job.state.worker_memory_bytes == 20 * MiB  # the worker measured, not the trainer's guess
    assert job.state.worker_memory_bound == 260 * MiB
    core.reap()  # the first period's measurement: still growth until shown otherwise
    assert job.state.worker_memory_bound == 260 * MiB
    for _ in range(3):  # still copying: 20 -> 80 MiB
        node.now += 10.0
        held["uss"] += 20 * MiB
        core.reap()
        assert job.state.worker_memory_bound == 260 * MiB
    node.now += pol.MEMORY_FLAT_S - 1
    held["uss"] += MiB // 2  # below the growth threshold
    core.reap()
    assert job.state.worker_memory_bound == 260 * MiB
    node.now += 2.0
    core.policy.dirty = False
    core.reap()
    assert job.state.worker_memory_bound == 0.0 and core.policy.dirty  # settled: re-decide
    assert job.state.worker_memory_bytes == pytest.approx(80.5 * MiB)
    node.now += 10.0
    held["uss"] += 30 * MiB  # growing again
    core.reap()
    assert job.state.worker_memory_bound == 260 * MiB


def test_measurements_overrule_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model (scripted here) keeps 2/2, then insists on 3/1. 3/1 is tried, measures
    worse than 2/2 did under the same neighbours, and the node goes back; the model's next
    proposal of 3/1 is not taken."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node, job_timeout_s=0)
    proposal: dict[str, int] = {}

    def scripted(policy: str, views: list[pol.JobView], budget: pol.Budget, **kw: Any) -> Any:
        return {
            v.job_id: pol.WorkerDecision(v.job_id, proposal.get(v.job_id, v.current_workers), "m")
            for v in views
        }

    monkeypatch.setattr(node_mod, "decide", scripted)
    a = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    b = core.register(Registration("b", pids=(100,), num_workers=2, batch_size=32))

    def run(seconds: int, tput: dict[str, float]) -> None:
        report_each_second(core, node, (a, b), seconds, tput)

    run(6, {"a": 300.0, "b": 300.0})  # 2/2 measured
    proposal.update({a.job_id: 3, b.job_id: 1})
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)  # untried: taken
    run(6, {"a": 320.0, "b": 150.0})  # 3/1 measures worse
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)
    assert a.directive.reason.startswith("back to (")
    run(6, {"a": 300.0, "b": 300.0})
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)
    assert a.decision is not None and a.decision.reason.startswith("kept: measured")


def test_a_job_whose_costs_change_is_relearned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job learned at 300 samples/s (its workers take 0.2 s a batch) slows to half (0.4 s a
    batch): after DRIFT_WINDOWS surprising windows in a row its model keeps only those, and
    predicts the new throughput (the log says what it now expects at the job's count); the
    splits measured under the old costs are forgotten."""
    caplog.set_level("INFO", logger="dloader.sidecar.core")
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("even", 2, 2, 1.0), node, job_timeout_s=0)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))

    def run(seconds: int, tput: float, fetch: float) -> None:
        for _ in range(seconds):
            node.now += 1.0
            r = report(2, tput)
            workers = tuple(WorkerReport(201 + i, fetch, 0.01, 10) for i in range(2))
            core.report(job, replace(r, idle_share=0.0, workers=workers))

    run(30, 300.0, 0.2)
    learned = len(job.model.observations)
    assert learned >= 5
    assert job.model.predict(2, 2.0, 32).samples_per_s == pytest.approx(300, rel=0.15)
    core.policy.truth.record(pol.split_of({job.job_id: 2}), job.job_id, 300.0, node.now)
    run(2 * pol.DRIFT_WINDOWS, 150.0, 0.4)
    assert len(job.model.observations) <= 2 * pol.DRIFT_WINDOWS < learned
    assert job.model.predict(2, 2.0, 32).samples_per_s == pytest.approx(150, rel=0.15)
    assert not core.policy.truth.measured.samples
    restarted = [r.getMessage() for r in caplog.records if "its model restarted" in r.getMessage()]
    assert len(restarted) == 1, restarted
    expected = float(restarted[0].rsplit("[model: ", 1)[1].split()[0].replace(",", ""))
    assert expected == pytest.approx(150, rel=0.15)


def test_the_log_says_when_a_job_is_placed_by_its_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One timed window places a new job (the adaptive policy's model decides its count); the
    log says when, counted from its registration."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    core.decide()
    assert not job.state.placed  # exploring: no observation yet
    node.now += 2.0
    with caplog.at_level("INFO", logger="dloader.sidecar.core"):
        core.report(job, report(2, 300.0))
        core.decide()
    assert job.state.placed
    assert f"job {job.job_id}: placed by its model 2.0 s after registering" in caplog.text
    # and the state file records it, with what the model expects of the job at its count
    kinds = {e.kind: e for _, e in core.store.events() if e.job_id == job.job_id}
    assert kinds["placed"].num_workers == job.directive.num_workers
    if "directed" in kinds:  # placed at another count than its own
        assert kinds["directed"].num_workers == job.directive.num_workers
        assert kinds["directed"].samples_per_s == kinds["expected"].samples_per_s > 0


def probing_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_count: Callable[[pol.JobView], int]
) -> tuple[NodeCore, Job, Job, Callable[[int], None]]:
    """Jobs ``a`` and ``b`` at 2 workers each on an adaptive node whose model proposes
    ``model_count`` workers for each job and whose probe is always a=3, b=1; and ``run(n)``:
    both report for ``n`` seconds at 300 samples/s (0.94 cores each, on 4: the cores are not
    all taken, so no split is on trial for a CPU-bound worker more: :func:`heavier`)."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 4, 1.0), node, job_timeout_s=0)

    def model(policy: str, views: list[pol.JobView], budget: pol.Budget, **kw: Any) -> Any:
        return {v.job_id: pol.WorkerDecision(v.job_id, model_count(v), "m") for v in views}

    monkeypatch.setattr(node_mod, "decide", model)
    a = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    b = core.register(Registration("b", pids=(100,), num_workers=2, batch_size=32))
    probed = pol.split_of({a.job_id: 3, b.job_id: 1})
    moves = core.probe_moves = []  # type: ignore[attr-defined]

    def probe(*args: Any, again: dict[str, int] | None = None) -> Any:
        moves.append(again)
        return pol.Probe(probed, "probing", lighter=False)

    monkeypatch.setattr(measured_mod, "probe", probe)

    def run(seconds: int, tput: float = 300.0) -> None:
        report_each_second(core, node, (a, b), seconds, {"a": tput, "b": tput})

    return core, a, b, run


def test_a_probe_that_does_not_pay_is_undone_and_the_next_waits_longer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model keeps whatever each job runs
    core, a, b, run = probing_node(tmp_path, monkeypatch, lambda v: v.current_workers)
    run(12)  # 2/2 measured and steady
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    run(6)  # the probe measures the same, short of its bar by less than the noise of a few
    core.decide()  # windows (WINDOW_SPREAD): measured longer
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    assert core.policy.truth.probed == pol.split_of({a.job_id: 3, b.job_id: 1})  # not judged
    run(8)  # PROBE_WINDOWS windows (one each 2 s here): judged, it did not pay
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)
    assert a.directive.reason.endswith("(a probe that did not pay)")
    assert core.policy.truth.probe_wait == 2 * pol.PROBE_AFTER_S
    assert core.probe_moves == [None]  # type: ignore[attr-defined]


def test_a_probe_that_pays_is_followed_by_the_same_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core, a, b, run = probing_node(tmp_path, monkeypatch, lambda v: v.current_workers)
    run(12)
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    run(6, 330.0)  # the probe measures 10% better: it stays, and the wait is not doubled
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    assert core.policy.truth.probe_wait == pol.PROBE_AFTER_S
    run(int(pol.PROBE_AFTER_S), 330.0)
    core.decide()  # steady again: the next probe is asked to make that move once more first
    moves = core.probe_moves[:2]  # type: ignore[attr-defined]
    assert moves == [None, {a.job_id: 1, b.job_id: -1}]


def moved_to_3_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[NodeCore, Job, Job, Callable[..., None], dict[str, int]]:
    """:func:`probing_node` without probes, whose model keeps 2/2 until 2/2 is measured, then
    proposes 3/1 (taken, as asserted); also the proposal, to change."""
    proposal: dict[str, int] = {}
    core, a, b, run = probing_node(
        tmp_path, monkeypatch, lambda v: proposal.get(v.job_id, v.current_workers)
    )
    monkeypatch.setattr(measured_mod, "probe", lambda *args, **kw: None)
    run(12)  # 2/2 measured
    proposal.update({a.job_id: 3, b.job_id: 1})
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    return core, a, b, run, proposal


def test_the_models_cpu_bound_worker_more_on_a_full_node_is_on_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's move to 3/1 gives a CPU-bound job a worker more on a full node (heavier,
    scripted here): taken, then judged like a probe; measured no better, the node goes back
    to 2/2, and the model's next proposal of 3/1 is not taken (it measured no better)."""
    monkeypatch.setattr(measured_mod, "heavier", lambda *args: True)
    core, a, b, run, _ = moved_to_3_1(tmp_path, monkeypatch)  # the model insists on 3/1
    assert core.policy.truth.probed == pol.split_of({a.job_id: 3, b.job_id: 1})
    run(14)  # the same as 2/2 over PROBE_WINDOWS windows: a probe would not have paid
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)
    assert a.directive.reason.endswith("(a probe that did not pay)")
    run(4)
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)
    assert a.decision is not None and a.decision.reason.startswith("kept: measured")


def test_a_split_the_model_moved_to_is_measured_before_its_next_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core, a, b, run, proposal = moved_to_3_1(tmp_path, monkeypatch)
    proposal.update({a.job_id: 1, b.job_id: 3})
    run(2)  # 3/1 not measured yet: held
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    assert a.decision is not None and "before the next move" in a.decision.reason
    run(6)  # measured: the model's move is taken
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (1, 3)


def test_a_probe_is_held_against_the_models_proposal_until_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the model proposes 2/2 whatever runs
    core, a, b, run = probing_node(tmp_path, monkeypatch, lambda v: 2)
    run(12)
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    run(2)  # one window each at the probe: not measured yet; the model proposes 2/2 again
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (3, 1)
    assert "measuring it" in a.decision.reason  # type: ignore[union-attr]
    run(12)  # measured, the same as 2/2 over PROBE_WINDOWS windows: it did not pay
    core.decide()
    assert (a.directive.num_workers, b.directive.num_workers) == (2, 2)


def test_metrics_are_read_from_the_core_when_scraped(tmp_path: Path) -> None:
    """/metrics shows the jobs as the core has them at the scrape (no refresh loop)."""
    from prometheus_client import generate_latest

    from dloader.sidecar.metrics import Metrics

    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("even", 4, 2, 1.0), node)
    metrics = Metrics(core, lambda: 150.0, lambda: 0.5)
    assert b"dloader_node_jobs 0.0" in generate_latest(metrics.registry)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 5.0
    core.report(job, report(2, 300.0))
    text = generate_latest(metrics.registry).decode()
    assert "dloader_node_jobs 1.0" in text
    assert f'dloader_job_samples_per_second{{job_id="{job.job_id}",name="a"}} 300.0' in text
    assert f'dloader_job_workers{{job_id="{job.job_id}",name="a"}} 2.0' in text
    assert f'dloader_job_done{{job_id="{job.job_id}",name="a"}} 0.0' in text  # none declared
    core.report(job, replace(report(2, 300.0), done=0.25))
    text = generate_latest(metrics.registry).decode()
    assert f'dloader_job_done{{job_id="{job.job_id}",name="a"}} 0.25' in text
    assert "dloader_node_cpu_percent 150.0" in text
    assert "dloader_node_normalized_throughput 0.5" in text
    core.deregister(job.job_id, job.record.token)
    assert "dloader_job_workers{" not in generate_latest(metrics.registry).decode()


@pytest.mark.parametrize("tiny", [5e-324, 1e-300, 1e-9])
def test_a_tiny_rate_cannot_poison_the_node(tmp_path: Path, tiny: float) -> None:
    """A job reporting a subnormal or tiny samples/s for its busy process: the sidecar's
    per-sample CPU estimate once became infinite, then NaN, and every job's Report failed
    (``cannot convert float NaN to integer``). Every derived number stays finite."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    bad = core.register(Registration("bad", pids=(100,), num_workers=2, batch_size=32))
    good = core.register(Registration("good", pids=(101,), num_workers=2, batch_size=32))
    for _ in range(6):
        node.now += 1.0
        core.report(bad, replace(report(2, 300.0), samples_per_second=tiny, step_seconds=1.0))
        core.report(good, report(2, 300.0))
        core.reap()  # the trainer's CPU (150%) over the tiny rate
        core.decide()
    assert math.isfinite(bad.state.main_cpu_per_sample) and math.isfinite(
        good.state.main_cpu_per_sample
    )
    node.now += 1.0
    core.report(good, report(2, 300.0))  # the other job's reports are served
    core.decide()
    assert good.directive.num_workers >= 1 and bad.directive.num_workers >= 1


def test_process_trees_are_walked_off_the_event_loop(tmp_path: Path) -> None:
    """64 jobs over 1,500 processes took the loop 2.9 s a walk, and the operator's calls waited
    as long. The walk runs in a thread: the loop keeps ticking while a (slow) walk goes on."""
    import asyncio
    import time as wall

    node = FakeNode(0.0)
    walking = []

    def slow_tree(pids: list[int]) -> ProcessTreeStats:
        walking.append(pids)
        wall.sleep(1.5)  # a walk of a large tree
        return node.tree(pids)

    core = fake_core(
        SidecarStore(tmp_path / "s.db"),
        PolicySettings("even", 4, 2, 0.2),
        tree_stats=slow_tree,
        clock=wall.monotonic,
    )
    core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(core.run(stop))
        gaps, last = [], wall.monotonic()
        while len(walking) < 2:  # through a whole walk and into the next
            await asyncio.sleep(0.01)
            now = wall.monotonic()
            gaps.append(now - last)
            last = now
        stop.set()
        await task
        return max(gaps)

    assert asyncio.run(scenario()) < 0.75


def _short(workers: int, tput: float, window: float) -> JobReport:
    return replace(report(workers, tput), window_seconds=window)


def test_a_new_job_is_placed_from_half_a_second_and_a_known_one_needs_a_second(
    tmp_path: Path,
) -> None:
    """A job the model has not seen learns from a window of ``FIRST_WINDOW_S`` (the agent
    reports four times a second at first); once it has a model, windows of a second count."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 0.25
    core.report(job, _short(2, 300.0, 0.3))
    assert not job.model.observations  # under half a second
    node.now += 0.25
    core.report(job, _short(2, 300.0, pol.FIRST_WINDOW_S))
    assert len(job.model.observations) == 1
    core.decide()  # what the run loop does at once on this news
    assert job.state.placed
    node.now += 10.0
    core.report(job, _short(job.directive.num_workers, 300.0, 0.6))
    assert len(job.model.observations) == 1  # a known job: a second at least


def test_a_job_registered_after_its_first_batches_is_placed_by_its_first_report(
    tmp_path: Path,
) -> None:
    """On a busy node a job's agent may register a second or two after the loader's first
    batch: its first report's window then began before it registered. Nothing changed for it
    in that window (it ran at its own count), so that report places it. It waited until its
    window was shorter than the time since registering (p95 5 s from the first batch)."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 0.25
    core.report(job, _short(2, 300.0, 1.5))  # 1.25 s of batches before it registered
    assert len(job.model.observations) == 1
    core.decide()
    assert job.state.placed
    assert job.directive.num_workers != 2  # its model moved it (300/s: far from its limit)
    # a change it was directed to still settles before a window counts
    node.now += 0.25
    core.report(job, _short(job.directive.num_workers, 300.0, 1.5))
    assert len(job.model.observations) == 1


def test_a_job_that_comes_back_is_placed_at_once_from_its_last_model(tmp_path: Path) -> None:
    """The model of the last ended job of the same name and owner is the new one's start: it
    is placed at registration. Another name starts afresh."""
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    first = core.register(Registration("train", pids=(100,), num_workers=2, batch_size=32))
    report_each_second(core, node, (first,), 6, {"train": 300.0})
    learned = len(first.model.observations)
    assert learned >= 2
    core.deregister(first.job_id, first.record.token)
    again = core.register(Registration("train", pids=(100,), num_workers=2, batch_size=32))
    assert len(again.model.observations) == learned and again.state.placed
    other = core.register(Registration("eval", pids=(101,), num_workers=2, batch_size=32))
    assert not other.model.observations and not other.state.placed


def test_a_rank_starts_from_the_model_of_a_running_rank_of_its_name(tmp_path: Path) -> None:
    node = FakeNode(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    r0 = core.register(Registration("ddp", pids=(100,), num_workers=2, batch_size=32))
    report_each_second(core, node, (r0,), 4, {"ddp": 300.0})
    r1 = core.register(Registration("ddp", pids=(101,), num_workers=2, batch_size=32))
    assert len(r1.model.observations) == len(r0.model.observations) >= 1
    assert r1.model is not r0.model  # a copy: each rank learns on its own


def test_a_workers_upkeep_is_measured_from_its_process_tree(tmp_path: Path) -> None:
    """The tree uses 105% CPU, 10% of it in the training process: its 2 workers take 0.95
    cores. Their reports account for 300 samples/s x 0.1 s of CPU per batch of 32 = 0.9375
    cores; each worker's upkeep is the rest, halved. The policy's view carries it; a tree far
    above the reports (a window's mismatch) counts at most ``MAX_UPKEEP_CORES``."""

    class Busy(FakeNode):
        cpu = 105.0

        def tree(self, pids: list[int]) -> ProcessTreeStats:
            return replace(super().tree(pids), cpu_percent=self.cpu)

    node = Busy(0.0)
    core = node_core(tmp_path, PolicySettings("adaptive", 8, 2, 1.0), node)
    job = core.register(Registration("a", pids=(100,), num_workers=2, batch_size=32))
    node.now += 2.0
    core.report(job, report(2, 300.0))
    core.reap()
    expected = (0.95 - 300.0 * 0.1 / 32) / 2
    assert job.state.worker_upkeep_cores == pytest.approx(expected)
    assert core.policy.view(job.job_id).worker_upkeep_cores == pytest.approx(expected)
    node.cpu = 400.0
    for _ in range(20):
        core.reap()
    assert job.state.worker_upkeep_cores == pytest.approx(pol.MAX_UPKEEP_CORES, rel=0.01)
