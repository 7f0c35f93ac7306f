"""Declared lengths (#48): a job that says how much of its work is done is weighed by the
GPU-seconds it still needs (``goodput-dp``), in the policy, the simulator and the service."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from dloader._shared.allocator_messages import JobSpec
from dloader.allocator import AllocatorError, Cluster
from dloader.allocator.config import Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.policies import ClusterDecision, DpPolicy, JobState, Policy, make_policy
from dloader.allocator.policies.dp import LENGTH_WEIGHT_MAX, SHORT_LEFT_GPU_S
from dloader.allocator.simulator import Simulator
from dloader.allocator.store import AllocatorStore
from dloader.allocator.traces import load_apps, read_workload
from dloader.errors import InvalidArgument
from tests.allocator.test_admission import one_job_service
from tests.allocator.test_hostile import GOOD as SCALING

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"


@pytest.fixture(scope="module")
def apps():
    return load_apps(DATA, ["cifar10", "ncf"])


def _job(apps, name: str, done: float | None, served: float = 3_600.0) -> JobState:
    app = apps["cifar10"]
    return JobState(
        name, 0.0, app.model, 1, 128, (128, 4096), app.local_bsz_range, max_gpus=16,
        age_s=36_000.0, attained_gpu_s=served, done=done,
    )  # fmt: skip


def _dp(name: str = "goodput-dp") -> DpPolicy:
    policy = make_policy(name)
    assert isinstance(policy, DpPolicy)
    return policy


def test_remaining_gpu_seconds_extrapolate_the_share_done(apps) -> None:
    assert _job(apps, "a", 0.25, served=1_000.0).remaining_gpu_s == pytest.approx(3_000.0)
    assert _job(apps, "a", 1.0).remaining_gpu_s == 0.0
    # no length declared, nothing done yet, or nothing run yet: unknown
    assert _job(apps, "a", None).remaining_gpu_s is None
    assert _job(apps, "a", 0.0).remaining_gpu_s is None
    assert _job(apps, "a", 0.5, served=0.0).remaining_gpu_s is None
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(AllocatorError, match="done="):
            _job(apps, "a", bad)
    # from where its share was first known: 1,000 GPU-s for 0.5 -> 0.75, so 1,000 more
    resumed = replace(_job(apps, "a", 0.75, served=1_500.0), done_origin=(500.0, 0.5))
    assert resumed.remaining_gpu_s == pytest.approx(1_000.0)
    assert replace(resumed, done=0.5).remaining_gpu_s is None  # nothing done since


def test_the_job_nearer_done_gets_more_gpus_and_undeclared_jobs_are_as_before(apps) -> None:
    """Two identical jobs on 8 GPUs split them evenly; when one has 9x less left to do, it
    gets more, whichever it is; ``goodput-dp-no-lengths`` ignores what they declared."""
    cluster = Cluster.uniform(1, 8)

    def gpus(policy: DpPolicy, a: float | None, b: float | None) -> tuple[int, int]:
        d = policy.decide([_job(apps, "a", a), _job(apps, "b", b)], cluster)
        return sum(d.placements["a"]), sum(d.placements["b"])

    even = gpus(_dp(), None, None)
    assert even == (4, 4)
    assert gpus(_dp(), 0.5, 0.5) == even
    ahead, behind = gpus(_dp(), 0.9, 0.1)
    assert ahead > behind and ahead + behind == 8
    assert gpus(_dp(), 0.1, 0.9) == (behind, ahead)
    assert gpus(_dp("goodput-dp-no-lengths"), 0.9, 0.1) == even


def test_the_weights_are_bounded_and_relative_to_the_lines_typical_job(apps) -> None:
    policy = _dp()
    jobs = [_job(apps, "near", 0.999), _job(apps, "far", 0.001), _job(apps, "new", None)]
    weighed = {j.job_id: j.priority for j in policy.weigh_lengths(jobs)}
    assert weighed == {"near": LENGTH_WEIGHT_MAX, "far": 1 / LENGTH_WEIGHT_MAX, "new": 1.0}
    # a job's own priority is scaled, not replaced
    scaled = policy.weigh_lengths([replace(jobs[0], priority=3.0), jobs[1]])
    assert scaled[0].priority == pytest.approx(3.0 * LENGTH_WEIGHT_MAX)
    # equal remaining work: everyone keeps their priority
    same = [_job(apps, "a", 0.5), _job(apps, "b", 0.5, served=3_600.0)]
    assert [j.priority for j in policy.weigh_lengths(same)] == pytest.approx([1.0, 1.0])
    with pytest.raises(AllocatorError, match="length_power=-1"):
        DpPolicy("x", objective="goodput", fixed_batch=False, length_power=-1)


def test_a_job_its_length_says_is_nearly_done_goes_before_the_other_served_jobs(apps) -> None:
    """The LAS line: new jobs first, then the running served jobs (past the threshold), then a
    waiting served job whose declared length leaves it at most ``SHORT_LEFT_GPU_S``, then the
    other waiting ones; ignoring lengths, it waits with them in arrival order. It preempts no
    running job."""
    near = replace(_job(apps, "near", 0.9), arrival=2.0)  # 400 GPU-s left
    far = replace(_job(apps, "far", 0.1), arrival=1.0)  # 32,400 left
    mute = _job(apps, "mute", None)  # served, declared nothing
    new = replace(_job(apps, "new", None, served=0.0), arrival=3.0)
    jobs = [mute, far, near, new]
    assert near.remaining_gpu_s is not None and near.remaining_gpu_s <= SHORT_LEFT_GPU_S
    assert [j.job_id for j in _dp().line(jobs)] == ["new", "near", "mute", "far"]
    blind = _dp("goodput-dp-no-lengths").line(jobs)
    assert [j.job_id for j in blind] == ["new", "mute", "far", "near"]
    # on a full cluster the nearly done job runs and the long one waits
    d = _dp().decide([far, near, new], Cluster.uniform(1, 2))
    assert set(d.placements) == {"near", "new"} and d.waiting == ("far",)
    # but a running long job keeps its GPU
    running = replace(far, placement=(1,))
    assert [j.job_id for j in _dp().line([near, running, new])] == ["new", "far", "near"]
    d = _dp().decide([near, running, new], Cluster.uniform(1, 2))
    assert set(d.placements) == {"far", "new"} and d.waiting == ("near",)
    with pytest.raises(AllocatorError, match="short_left_gpu_s=-1"):
        DpPolicy("x", objective="goodput", fixed_batch=False, short_left_gpu_s=-1)


class _Recording:
    """Wraps a policy and keeps the ``done`` every job reported at each decision."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.name = policy, policy.name
        self.seen: dict[str, list[float | None]] = {}

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        for j in jobs:
            self.seen.setdefault(j.job_id, []).append(j.done)
        return self.policy.decide(jobs, cluster)


def test_the_simulator_reports_each_jobs_share_done_only_when_lengths_are_declared(apps) -> None:
    workload = read_workload(DATA / "workload.csv")
    cluster = Cluster.uniform(3, 4)
    for declared in (None, 0.0, 0.5):
        rec = _Recording(make_policy("goodput-dp"))
        Simulator(workload, apps, rec, cluster, declared_lengths=declared).run()
        shares = [d for seen in rec.seen.values() for d in seen]
        if declared is None:
            assert set(shares) == {None}
            continue
        assert all(d is not None and 0.0 <= d <= 1.0 for d in shares)
        for seen in rec.seen.values():  # never backwards
            assert seen == sorted(seen)  # type: ignore[type-var]
        if declared == 0.0:  # the true length: a job is never done before it completes
            assert 0.5 < max(shares) < 1.0  # type: ignore[type-var,operator]
    with pytest.raises(AllocatorError, match="--declared-lengths"):
        Simulator(workload, apps, make_policy("goodput-dp"), cluster, declared_lengths=-1.0)


def test_the_simulators_declared_errors_are_drawn_per_job_and_repeat(apps) -> None:
    workload = read_workload(DATA / "workload.csv")
    cluster = Cluster.uniform(3, 4)

    def factors(sigma: float) -> list[float]:
        sim = Simulator(workload, apps, make_policy("goodput-dp"), cluster, declared_lengths=sigma)
        return [j.declared for j in sim._jobs]

    assert factors(0.0) == [1.0] * len(workload)
    once = factors(0.5)
    assert once == factors(0.5) and len(set(once)) == len(once)
    assert any(f > 1 for f in once) and any(f < 1 for f in once)


def test_the_service_takes_a_jobs_share_done_from_its_update(tmp_path: Path) -> None:
    c, _ = one_job_service(tmp_path, 2)
    assert c._inputs().states[0].done is None
    c.update("a", [], done=0.25)
    assert c._inputs().states[0].done == 0.25
    c.update("a", [], priority=2.0)  # 0: unchanged
    assert c._inputs().states[0].done == 0.25
    for bad in (1.5, -0.5, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match=r"^done: "):
            c.update("a", [], done=bad)
    assert c.jobs["a"].done == 0.25


def test_the_service_extrapolates_from_a_jobs_first_reported_share(tmp_path: Path) -> None:
    """A job that resumed from a checkpoint (or a service that restarted, counting GPU-seconds
    from 0 again) first reports a share already done: what it still needs is extrapolated from
    the GPU-seconds and the share since then, not from all of it."""
    c, now = one_job_service(tmp_path, 1)
    c.decide()
    now[0] += 100.0
    c.decide()  # 100 GPU-seconds
    c.update("a", [], done=0.5)  # resumed at half way
    assert c._inputs().states[0].remaining_gpu_s is None
    now[0] += 200.0
    c.decide()
    c.update("a", [], done=0.6)  # 200 GPU-s for 0.1: 800 more for the last 0.4
    state = c._inputs().states[0]
    assert state.done_origin == (100.0, 0.5)
    assert state.remaining_gpu_s == pytest.approx(800.0)


def test_a_loaders_declared_epochs_reach_the_allocator_through_its_sidecar(
    tmp_path: Path,
) -> None:
    """``DataLoader(epochs=N)`` -> its report (``done``) -> the node's report of the job (the
    mean over its ranks there) -> the allocator's view of the job; each hop checks the share."""
    import os

    from dloader._shared.allocator_messages import (
        Allocation,
        AllocationSet,
        NodeJobReport,
        job_key,
        key_digest,
    )
    from dloader._shared.client import Endpoint
    from dloader._shared.node_messages import JobReport, Registration
    from dloader.sidecar.allocator_link import AllocatorLink
    from dloader.sidecar.config import PolicySettings
    from dloader.sidecar.core import NodeCore
    from dloader.sidecar.store import SidecarStore

    node = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("even", 8, 2, 60.0))
    key = job_key("the job's token")
    ranks = [
        node.register(Registration("train", (os.getpid(),), 1, 32, job_key=key)) for _ in range(2)
    ]
    link = AllocatorLink(node, Endpoint.of("unix:///nowhere.sock"), node_id="n0", gpus=4)
    a = Allocation("a", 2, {"n0": 2}, 64, "ok", key_digest=key_digest(key))
    link.apply(AllocationSet(1, False, "goodput-dp", (a,)))
    for rank, done in zip(ranks, (0.25, 0.35), strict=True):
        node.report(rank, JobReport(0.0, 1, 32, 100.0, 0.0, 0.1, 0.0, 1.0, 100, done=done))
    with pytest.raises(InvalidArgument, match=r"^done: "):
        node.report(ranks[0], JobReport(0.0, 1, 32, 100.0, 0.0, 0.1, 0.0, 1.0, 100, done=1.5))
    (sent,) = link.report().jobs
    assert sent.done == pytest.approx(0.3)

    c = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    c.register_node("n0", 4)
    c.submit(JobSpec(job_id="a", batch_size=64, max_batch_size=64, max_gpus=2, scaling=SCALING))
    c.report_node("n0", 4, [NodeJobReport.from_pb(sent)])
    assert c._inputs().states[0].done == pytest.approx(0.3)
    c.report_node("n0", 4, [NodeJobReport("a", 1.0)])  # 0: nothing new
    assert c.jobs["a"].done == pytest.approx(0.3)
    (shown,) = c.decide().allocations  # what GetAllocations serves
    assert Allocation.from_pb(shown.to_pb()).done == pytest.approx(0.3)
    with pytest.raises(InvalidArgument, match=r"^jobs\.done: "):
        NodeJobReport.from_pb(NodeJobReport("a", 1.0, done=math.nan).to_pb())


def test_the_decision_says_how_a_declared_length_weighed(apps) -> None:
    d = _dp().decide([_job(apps, "a", 0.9), _job(apps, "b", 0.1)], Cluster.uniform(1, 8))
    assert d.reasons["a"].endswith("; x1.50 for its declared length (90% done)")
    assert d.reasons["b"].endswith("; x0.67 for its declared length (10% done)")
    plain = _dp().decide([_job(apps, "a", None), _job(apps, "b", None)], Cluster.uniform(1, 8))
    assert not any("declared" in r for r in plain.reasons.values())


def test_an_update_staged_before_a_nodes_report_does_not_undo_its_share(tmp_path: Path) -> None:
    """UpdateJob is staged off the event loop and applied after: a node's report of a newer
    share in between stands (the staged copy's older share is not written back)."""
    from dloader._shared.allocator_messages import NodeJobReport

    c, _ = one_job_service(tmp_path, 2)
    c.update("a", [], done=0.25)
    staged = c.stage_update("a", [], priority=2.0)
    c.report_node("n0", 2, [NodeJobReport("a", 1.0, done=0.5)])
    c.apply_update(staged)
    assert c.jobs["a"].done == 0.5 and c.jobs["a"].spec.priority == 2.0
