"""The live allocator with CPUs: nodes register their cores, reports carry each job's input
curve, allocations carry each job's cores per node; the typed messages bound and check the new
fields; the sidecar takes the cores as a prior and reports its loaders' curves."""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from dloader._shared.allocator_messages import (
    MAX_INPUT_POINTS,
    Allocation,
    JobSpec,
    NodeJobReport,
    check_input_curve,
    job_key,
    key_digest,
)
from dloader._shared.node_messages import JobLimits, JobReport, Registration
from dloader.allocator.config import Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.store import AllocatorStore
from dloader.errors import InvalidArgument
from dloader.predictor import MAX_INPUT_POINTS as MODEL_POINTS
from dloader.predictor import LoaderModel, LoaderObservation
from dloader.sidecar.allocator_link import input_curve
from dloader.sidecar.config import PolicySettings
from dloader.sidecar.core import NodeCore
from dloader.sidecar.store import SidecarStore
from tests.allocator.test_service import job

#: 432 samples/s on one GPU at batch 32 (tests.allocator.test_service.SCALING)
HUNGRY = ((1.0, 100.0),)  # 4.3 cores to feed one GPU
LIGHT = ((1.0, 1e6),)


def _spec(job_id: str, curve: tuple[tuple[float, float], ...]) -> JobSpec:
    return replace(JobSpec.from_pb(job(job_id, max_gpus=1).job), input_curve=curve)


def _core(tmp_path: Path, policy: str = "goodput-dp", name: str = "a.db") -> AllocatorCore:
    return AllocatorCore(AllocatorStore(tmp_path / name), Settings(policy=policy))


def test_the_cluster_has_cores_only_where_every_node_gave_them(tmp_path: Path) -> None:
    core = _core(tmp_path)
    core.register_node("n0", 2, cpus=4.0)
    assert core.nodes.cluster()[1].cpus == (4.0,)
    core.register_node("n1", 2)  # says nothing of its cores: not limited anywhere
    assert core.nodes.cluster()[1].cpus is None
    for bad in (-1.0, math.nan, math.inf, 1e6):
        with pytest.raises(InvalidArgument, match="cpus"):
            core.register_node("n2", 2, cpus=bad)
    core.register_node("n1", 2, cpus=2.0)
    again = AllocatorCore(core.store, Settings())  # a restart keeps them
    assert again.nodes.cluster()[1].cpus == (4.0, 2.0)


@pytest.mark.parametrize(
    ("policy", "apart"), [("goodput-dp", True), ("goodput-dp-cpu-blind", False)]
)
def test_hungry_jobs_go_beside_light_ones_and_allocations_carry_cores(
    tmp_path: Path, policy: str, apart: bool
) -> None:
    core = _core(tmp_path, policy)
    core.register_node("n0", 2, cpus=2.0)
    core.register_node("n1", 2, cpus=2.0)
    for job_id, curve in (("a-hungry", HUNGRY), ("b-hungry", HUNGRY), ("c-light", LIGHT)):
        core.submit(_spec(job_id, curve))
    core.submit(_spec("d-light", LIGHT))
    snap = {a.job_id: a for a in core.decide().allocations}
    assert all(a.gpus == 1 for a in snap.values())
    assert (snap["a-hungry"].nodes != snap["b-hungry"].nodes) is apart
    for node in ("n0", "n1"):
        assert sum(a.cpus.get(node, 0.0) for a in snap.values()) <= 2.0 + 1e-9
    for a in snap.values():
        assert set(a.cpus) == set(a.nodes)  # cores where it has GPUs, nowhere else
    if apart:  # each hungry job has its node's cores but what its light neighbour needs
        assert all(sum(snap[j].cpus.values()) > 1.9 for j in ("a-hungry", "b-hungry"))
    else:  # GPU-proportional: one core per GPU
        assert all(sum(a.cpus.values()) == pytest.approx(1.0) for a in snap.values())
    # the same through the proto
    again = Allocation.from_pb(snap["a-hungry"].to_pb())
    assert again.cpus == pytest.approx(snap["a-hungry"].cpus)


def test_a_node_report_brings_a_jobs_input_curve(tmp_path: Path) -> None:
    core = _core(tmp_path)
    core.register_node("n0", 2, cpus=2.0)
    core.submit(_spec("x", ()))
    assert core.jobs["x"].state(["n0"], 0.0).input is None
    core.report_node("n0", 2, [NodeJobReport("x", 50.0, input_curve=((0.5, 40.0), (2.0, 150.0)))])
    model = core.jobs["x"].state(["n0"], 0.0).input
    assert model is not None and model.rate(2.0) == pytest.approx(150.0)
    # a curve that came with the submission is used until a node reports one
    core.submit(_spec("y", HUNGRY))
    assert core.jobs["y"].state(["n0"], 0.0).input.rate(1.0) == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("curve", "says"),
    [
        (tuple((float(i), float(i)) for i in range(1, MAX_INPUT_POINTS + 2)), "at most 16"),
        (((1.0, 10.0), (1.0, 20.0)), "must exceed"),
        (((0.0, 10.0),), r"cores: 0.0 must be a finite number within \[0.001"),
        # a vanishing rate once made every decision fail (#49 §1)
        (((4096.0, 5e-324),), r"samples_per_second: 5e-324 must be a finite number within"),
        (((1.0, math.nan),), "samples_per_second"),
        (((1e9, 1.0),), "cores"),
    ],
)
def test_bad_input_curves_are_refused_naming_the_field(curve, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        check_input_curve("jobs.input_curve", curve)
    with pytest.raises(InvalidArgument, match=says):
        NodeJobReport.from_pb(NodeJobReport("x", 1.0, input_curve=curve).to_pb())
    with pytest.raises(InvalidArgument, match=says):
        _spec("x", curve).normalised(30.0)


def test_the_curve_limit_is_the_models() -> None:
    assert MAX_INPUT_POINTS == MODEL_POINTS
    spec = _spec("x", ((0.5, 10.0), (2.0, 30.0)))
    assert JobSpec.from_json(spec.to_json()) == spec
    assert JobSpec.from_pb(spec.to_pb()) == spec


def _observed(cpu_s: float, io_s: float) -> LoaderModel:
    m = LoaderModel()
    batch, k = 32, 2
    rate = k / (io_s + cpu_s)  # samples/s of k workers, no CPU limit
    m.update(
        LoaderObservation(
            num_workers=k,
            cores=8.0,
            batch_size=batch,
            samples_per_s=rate,
            idle_share=0.5,
            step_s=batch / rate,
            fetch_s=(io_s + cpu_s) * batch,
            cpu_s=cpu_s * batch,
        )
    )
    return m


def test_the_sidecar_reports_what_its_loaders_deliver_on_c_cores() -> None:
    cpu_bound = _observed(cpu_s=0.01, io_s=0.0)  # 100 samples/s per core
    curve = input_curve([cpu_bound], cores=4.0, workers=16)
    assert len(curve) == MAX_INPUT_POINTS and curve[-1][0] == pytest.approx(4.0)
    assert curve[0][0] == pytest.approx(0.125)
    assert all(b[1] >= a[1] for a, b in itertools.pairwise(curve))
    assert curve[-1][1] == pytest.approx(400.0, rel=0.35)
    slow = _observed(cpu_s=0.02, io_s=0.0)  # 50 samples/s per core
    # one rank's pipeline (the allocator counts per GPU): the mean of the ranks here
    two_ranks = input_curve([cpu_bound, slow], cores=4.0, workers=16)
    alone = input_curve([slow], cores=4.0, workers=16)
    assert two_ranks[-1][1] == pytest.approx((curve[-1][1] + alone[-1][1]) / 2, rel=0.1)
    assert input_curve([LoaderModel()], cores=4.0, workers=16) == ()  # no model yet
    check_input_curve("jobs.input_curve", curve)


def test_the_allocators_cores_are_a_prior_for_jobs_not_placed_yet(tmp_path: Path) -> None:
    """Targets are keyed by the digest of each job's key, never by its name."""
    core = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("adaptive", 16, 4, 60.0))
    pid = (os.getpid(),)
    train, other_key = job_key("train's token"), job_key("other's token")
    core.set_cpu_targets({key_digest(train): 3.0})
    # a namesake without the key registers first: it gets nothing of the target
    namesake = core.register(Registration("train", pid, 8, 32, JobLimits()))
    assert namesake.directive.num_workers == 8
    job = core.register(Registration("train", pid, 8, 32, JobLimits(), job_key=train))
    assert job.directive.num_workers == 3 and job.state.initial_workers == 3  # asked for 8 workers
    assert "allocator's target" in job.directive.reason
    other = core.register(Registration("other", pid, 2, 32, JobLimits(), job_key=other_key))
    assert other.directive.num_workers == 2  # no target: its own count
    core.set_cpu_targets({key_digest(other_key): 1.0})
    assert other.directive.num_workers == 1
    core._direct(other, "exploring", num_workers=2)  # its exploration moves on from there
    core.set_cpu_targets({key_digest(other_key): 1.0})  # the same target again: left to explore
    assert other.directive.num_workers == 2
    other.state.placed = True  # once its model places it, the node's policy decides
    core.set_cpu_targets({key_digest(other_key): 4.0})
    assert other.directive.num_workers == 2
    assert core.cpu_targets == {key_digest(other_key): 4.0}


def test_goodput_dp_lend_names_the_nodes_that_lend_a_starved_job_cores(tmp_path: Path) -> None:
    """Live, goodput-dp-lend: a job its node cannot feed gets the spare cores of the node of a
    job that needs almost none, named by that node (``lent_cpus``, through the proto too), as
    much as that node lends; only a node registered as lending (its Ray node hosts the
    workers) lends, across a restart too."""
    core = _core(tmp_path, "goodput-dp-lend")
    core.register_node("gpu-a", 1, cpus=2.0, lends=True)
    core.register_node("gpu-b", 1, cpus=2.0, lends=True)
    with pytest.raises(InvalidArgument, match="only a GPU node that gives its cores"):
        core.register_node("pool", 0, cpus=8.0, lends=True)
    core.submit(_spec("hungry", HUNGRY))
    core.submit(_spec("light", LIGHT))
    first = {a.job_id: a for a in core.decide().allocations}
    for job_id, curve, remote in (("hungry", HUNGRY, 8.0), ("light", LIGHT, 0.0)):
        (node,) = first[job_id].nodes
        report = NodeJobReport(job_id, 100.0, input_curve=curve, remote_cores_max=remote)
        core.report_node(node, 1, [report])
    decided = core.decide()
    snap = {a.job_id: a for a in decided.allocations}
    hungry, light = snap["hungry"], snap["light"]
    (lender,) = light.nodes
    # the lender's sidecar watches its own jobs and those it lends cores to
    assert {a.job_id for a in decided.to_pb(node_id=lender).allocations} == {"hungry", "light"}
    assert list(hungry.lent_cpus) == [lender] and lender not in hungry.nodes
    assert 1.5 < hungry.lent_cpus[lender] == pytest.approx(hungry.remote_cpus)  # no pool
    assert hungry.lent_cpus[lender] + light.cpus[lender] == pytest.approx(2.0)
    assert Allocation.from_pb(hungry.to_pb()).lent_cpus == hungry.lent_cpus
    assert light.lent_cpus == {}
    again = _core(tmp_path, "goodput-dp-lend")  # restarted: the nodes as registered
    assert again.nodes.cluster()[1].lends == (True, True)
    core.register_node(lender, 1, cpus=2.0)  # its Ray node no longer hosts them
    after = {a.job_id: a for a in core.decide().allocations}
    assert after["hungry"].lent_cpus == {} and after["hungry"].remote_cpus == 0.0


def test_a_cpu_only_node_joins_the_pool_and_a_starved_job_gets_it(tmp_path: Path) -> None:
    """#47: a node registered with no GPUs and its cores is the CPU pool; a job whose loaders
    report remote workers (``remote_cores_max``) and whose pipeline its node cannot feed gets
    pool cores in its allocation (through the proto too); one that reports none gets none."""
    core = _core(tmp_path)
    core.register_node("gpu", 2, cpus=1.0)
    core.register_node("pool", 0, cpus=8.0)
    with pytest.raises(InvalidArgument, match="or 0 with cpus > 0"):
        core.register_node("nothing", 0)
    cluster = core.nodes.cluster()[1]
    assert cluster.nodes == (2,) and cluster.pool == 8.0  # the pool node offers no GPUs
    core.submit(_spec("remote-ok", HUNGRY))
    core.submit(_spec("local-only", HUNGRY))
    core.decide()  # placed first: its loaders report from its node
    core.report_node(
        "gpu",
        2,
        [
            NodeJobReport("remote-ok", 100.0, input_curve=HUNGRY, remote_cores_max=4.0),
            NodeJobReport("local-only", 100.0, input_curve=HUNGRY),
        ],
    )
    snap = {a.job_id: a for a in core.decide().allocations}
    assert 0 < snap["remote-ok"].remote_cpus <= 4.0
    assert snap["local-only"].remote_cpus == 0.0
    assert (
        Allocation.from_pb(snap["remote-ok"].to_pb()).remote_cpus == snap["remote-ok"].remote_cpus
    )
    with pytest.raises(InvalidArgument, match="remote_cores_max"):
        NodeJobReport.from_pb(NodeJobReport("x", 1.0, remote_cores_max=math.inf).to_pb())


def test_the_sidecar_directs_its_share_of_the_pool_as_remote_workers(tmp_path: Path) -> None:
    """The link turns a job's pool cores into remote workers of its loaders on this node (its
    share of the job's GPUs, split among its ranks here), within each loader's bound; a loader
    the pool never served keeps its own remote workers."""
    from dloader._shared.allocator_messages import AllocationSet
    from dloader._shared.client import Endpoint
    from dloader.sidecar.allocator_link import AllocatorLink

    node = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("even", 8, 2, 60.0))
    pid = (os.getpid(),)
    key = job_key("the job's token")
    ranks = [
        node.register(
            Registration("train", pid, 1, 32, JobLimits(max_remote_workers=3), job_key=key)
        )
        for _ in range(2)
    ]
    own = node.register(
        Registration("mine", pid, 1, 32, JobLimits(max_remote_workers=3), job_key=job_key("x"))
    )
    link = AllocatorLink(node, Endpoint.of("unix:///nowhere.sock"), node_id="n0", gpus=4)

    def allocate(remote: float, version: int) -> None:
        a = Allocation(
            "train", 4, {"n0": 2, "n1": 2}, 64, "ok", key_digest=key_digest(key),
            remote_cpus=remote, local_batch_size=16,
        )  # fmt: skip
        other = Allocation("mine", 1, {"n0": 1}, 32, "ok", key_digest=key_digest(job_key("x")))
        link.apply(AllocationSet(version, False, "goodput-dp", (a, other)))

    allocate(10.0, 1)  # half the job's GPUs here: 5 pool cores for 2 ranks: 3 and 2
    assert sorted(r.directive.remote_workers for r in ranks) == [2, 3]
    allocate(16.0, 2)  # 8 for 2 ranks: 4 each, but each loader allows 3
    assert [r.directive.remote_workers for r in ranks] == [3, 3]
    allocate(0.0, 3)  # the pool taken away: none
    assert [r.directive.remote_workers for r in ranks] == [0, 0]
    assert own.directive.remote_workers is None  # never served by the pool: left alone
    for r in (*ranks, own):
        r.last_report = JobReport(0.0, 1, 32, 100.0, 0.0, 0.1, 0.0, 1.0, 100)
    report = {r.job_id: r for r in link.report().jobs}
    assert report["train"].remote_cores_max == 6.0  # both ranks' bounds: the ask


def test_the_sidecar_places_lent_cores_on_their_lending_nodes(tmp_path: Path) -> None:
    """goodput-dp-lend: of a job's remote cores, those other nodes lend go to remote workers
    placed there (this node's share, split among its ranks here), the rest to the pool; taken
    back, none are left there."""
    from dloader._shared.allocator_messages import AllocationSet
    from dloader._shared.client import Endpoint
    from dloader.sidecar.allocator_link import AllocatorLink

    node = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("even", 8, 2, 60.0))
    key = job_key("the job's token")
    limits = JobLimits(max_remote_workers=8)
    rank = Registration("train", (os.getpid(),), 1, 32, limits, job_key=key)
    ranks = sorted((node.register(rank) for _ in range(2)), key=lambda j: j.job_id)
    link = AllocatorLink(node, Endpoint.of("unix:///nowhere.sock"), node_id="n0", gpus=2)

    def allocate(remote: float, lent: dict[str, float], version: int) -> None:
        a = Allocation(
            "train", 2, {"n0": 2}, 64, "ok", key_digest=key_digest(key), remote_cpus=remote,
            local_batch_size=32, lent_cpus=lent,
        )  # fmt: skip
        link.apply(AllocationSet(version, False, "goodput-dp-lend", (a,)))

    allocate(7.0, {"n1": 4.0, "n2": 1.0}, 1)  # 2 of the pool, 4 lent by n1, 1 by n2
    placed = [(r.directive.remote_workers, r.directive.remote_lent) for r in ranks]
    assert placed == [(1, (("n1", 2), ("n2", 1))), (1, (("n1", 2),))]
    assert "2.0 of the CPU pool, 4.0 lent by n1, 1.0 lent by n2" in ranks[0].directive.reason
    allocate(0.0, {}, 2)
    assert [(r.directive.remote_workers, r.directive.remote_lent) for r in ranks] == [(0, ())] * 2


def test_a_lending_node_divides_what_it_keeps_among_its_own_jobs(tmp_path: Path) -> None:
    """The cores this node lends to other nodes' jobs leave its policy's budget while lent."""
    from dloader._shared.allocator_messages import AllocationSet
    from dloader._shared.client import Endpoint
    from dloader.sidecar.allocator_link import AllocatorLink

    node = NodeCore(SidecarStore(tmp_path / "n.db"), PolicySettings("even", 8, 6, 60.0))
    link = AllocatorLink(node, Endpoint.of("unix:///nowhere.sock"), node_id="n1", gpus=2)

    def borrowing(lent: dict[str, float], version: int) -> None:
        a = Allocation(
            "elsewhere", 4, {"n0": 4}, 64, "ok", key_digest=key_digest(job_key("t")),
            remote_cpus=sum(lent.values()), local_batch_size=16, lent_cpus=lent,
        )  # fmt: skip
        link.apply(AllocationSet(version, False, "goodput-dp-lend", (a,)))

    borrowing({"n1": 2.5, "n2": 1.0}, 1)
    assert (node.lent_cores, node.policy.budget.cores) == (2.5, 3.5)
    borrowing({"n1": 9.0}, 2)  # more than it has: it keeps a sliver
    assert node.lent_cores == 6.0 and 0 < node.policy.budget.cores < 0.5
    borrowing({}, 3)
    assert (node.lent_cores, node.policy.budget.cores) == (0.0, 6.0)
