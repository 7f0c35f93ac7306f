"""The ClusterAllocator service for real: gRPC on a Unix socket (or TCP with a token), SQLite,
the autoscaler loop; bad requests, restarts, dry run, watching, and the sidecar link."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dloader._shared.allocator_messages import JobSpec, Measurement, job_key
from dloader._shared.client import Endpoint
from dloader._shared.node_messages import JobLimits, JobReport, Registration
from dloader.allocator.cli import parser, serve
from dloader.allocator.config import AllocatorDaemonConfig, Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.store import AllocatorStore
from dloader.errors import ConfigError
from dloader.sidecar.allocator_link import AllocatorLink
from dloader.sidecar.config import PolicySettings
from dloader.sidecar.core import NodeCore
from dloader.sidecar.store import SidecarStore
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc
from tests._daemon import ThreadedDaemon, free_port

pytestmark = pytest.mark.integration

SCALING = pb.ScalingParams(
    alpha_c=0.01, beta_c=0.002, alpha_n=0.0005, alpha_r=0.01, beta_r=0.0, gamma=2.0
)


class Allocator(ThreadedDaemon):
    def __init__(self, tmp: Path, *extra: str) -> None:
        socket = str(tmp / "run" / "allocator.sock")
        self.state_dir = tmp / "state"
        args = parser().parse_args(
            ["--socket", socket, "--state-dir", str(self.state_dir), "--interval", "0.5", *extra]
        )
        super().__init__(serve, args, socket)
        self.stub = pb_grpc.ClusterAllocatorStub(self.channel)


@pytest.fixture
def alloc(tmp_path: Path) -> Iterator[Allocator]:
    a = Allocator(tmp_path)
    yield a
    a.stop()


def job(job_id: str, **kw: object) -> pb.SubmitJobRequest:
    spec = pb.JobSpec(job_id=job_id, batch_size=int(kw.pop("batch_size", 32)), **kw)  # type: ignore[arg-type]
    if not spec.HasField("scaling") and not spec.measurements:
        spec.scaling.CopyFrom(SCALING)
    return pb.SubmitJobRequest(job=spec)


def until(stub: pb_grpc.ClusterAllocatorStub, check, timeout: float = 10.0) -> pb.AllocationSet:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        snap = stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
        if check(snap):
            return snap
        time.sleep(0.05)
    raise AssertionError(f"condition not met; last allocations: {snap}")


def by_job(snap: pb.AllocationSet) -> dict[str, pb.Allocation]:
    return {a.job_id: a for a in snap.allocations}


def test_jobs_share_the_cluster_and_wait_in_order(alloc: Allocator) -> None:
    s = alloc.stub
    s.RegisterNode(pb.RegisterNodeRequest(node_id="n1", gpus=4))
    s.RegisterNode(pb.RegisterNodeRequest(node_id="n0", gpus=4))
    assert s.SubmitJob(job("a", max_gpus=8)).queue_position == 0
    snap = until(s, lambda x: by_job(x).get("a") and by_job(x)["a"].gpus == 8)
    assert {n.node_id: n.gpus for n in by_job(snap)["a"].nodes} == {"n0": 4, "n1": 4}
    s.SubmitJob(job("b", min_gpus=4, max_gpus=8))
    s.SubmitJob(job("c", min_gpus=4))  # a (>= 1) + b (>= 4) + c (>= 4) > 8: c waits ...
    s.SubmitJob(job("d"))  # ... and so does d, behind it
    snap = until(s, lambda x: by_job(x).get("b") and by_job(x)["b"].gpus >= 4)
    jobs = by_job(snap)
    assert jobs["a"].gpus + jobs["b"].gpus == 8
    assert (jobs["c"].gpus, jobs["c"].queue_position) == (0, 0)
    assert (jobs["d"].gpus, jobs["d"].queue_position) == (0, 1)
    assert jobs["c"].reason.startswith("waiting, 1 in line: needs >= 4 GPU(s)")
    assert "shrink 8->" in jobs["a"].reason
    s.CompleteJob(pb.CompleteJobRequest(job_id="a"))
    snap = until(s, lambda x: "a" not in by_job(x) and by_job(x)["c"].gpus == 4)
    assert by_job(snap)["b"].gpus == 4 and by_job(snap)["d"].gpus == 0
    decisions = AllocatorStore(alloc.state_dir / "allocator.db").decisions("a")
    assert decisions[0][2] == 8 and decisions[-1][2] == 0
    assert all(d[4] for d in decisions)  # every change logged with its reason


def test_bad_requests_name_the_field(alloc: Allocator) -> None:
    s = alloc.stub

    def code_of(call, request) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=5)
        return err.value.code(), err.value.details()

    bad = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(s.SubmitJob, job("", batch_size=8)) == (
        bad,
        "job.job_id: '' must be 1-200 printable characters",
    )
    code, msg = code_of(s.SubmitJob, job("x", batch_size=0))
    assert code == bad and msg.startswith("job.batch_size")
    code, msg = code_of(s.SubmitJob, job("x", min_gpus=5, max_gpus=2))
    assert code == bad and msg.startswith("job.min_gpus: 5 is above max_gpus=2")
    code, msg = code_of(s.SubmitJob, job("x", batch_size=64, max_batch_size=32))
    assert code == bad and "max_batch_size=32" in msg
    req = job("x")
    req.job.ClearField("scaling")
    code, msg = code_of(s.SubmitJob, req)
    assert code == bad and msg.startswith("job.scaling: need scaling parameters")
    req.job.measurements.add(nodes=2, replicas=1, local_batch_size=8, step_seconds=0.1)
    code, msg = code_of(s.SubmitJob, req)
    assert code == bad and msg.startswith("measurements: nodes=2, replicas=1")
    req = job("x", priority=float("nan"))
    assert code_of(s.SubmitJob, req)[0] == bad
    req = job("x")
    req.job.gradient.CopyFrom(pb.GradientStats(base_batch_size=32, grad_sqr=0, grad_var=1))
    code, msg = code_of(s.SubmitJob, req)
    assert code == bad and msg.startswith("job.gradient")

    s.SubmitJob(job("x"))
    assert code_of(s.SubmitJob, job("x"))[0] == grpc.StatusCode.ALREADY_EXISTS
    code, msg = code_of(s.UpdateJob, pb.UpdateJobRequest(job_id="x", done=1.5))
    assert code == bad and msg == "done: 1.5 must be a finite number within [0.0, 1.0]"
    nf = grpc.StatusCode.NOT_FOUND
    assert code_of(s.CompleteJob, pb.CompleteJobRequest(job_id="nope"))[0] == nf
    assert code_of(s.UpdateJob, pb.UpdateJobRequest(job_id="nope"))[0] == nf
    assert code_of(s.ReportNode, pb.ReportNodeRequest(node_id="ghost"))[0] == nf
    assert code_of(s.RegisterNode, pb.RegisterNodeRequest(node_id="n", gpus=0))[0] == bad
    s.RegisterNode(pb.RegisterNodeRequest(node_id="n", gpus=2))
    code, msg = code_of(s.ReportNode, pb.ReportNodeRequest(node_id="n", free_gpus=3))
    assert code == bad and msg == "free_gpus: 3 must be within [0, 2]"
    code, msg = code_of(s.Configure, pb.ConfigureRequest(config=pb.AllocatorConfig(policy="lifo")))
    assert code == bad and msg.startswith("config.policy: 'lifo'")
    with pytest.raises(grpc.RpcError) as err:
        next(iter(s.WatchAllocations(pb.WatchAllocationsRequest(job_id="nope"), timeout=5)))
    assert err.value.code() == nf
    # the daemon is still healthy after all that
    assert s.GetAllocations(pb.GetAllocationsRequest(), timeout=5).policy == "goodput-dp-lend"
    assert stat.S_IMODE(os.stat(alloc.socket).st_mode) == 0o660


def test_measurements_refit_and_restart_keeps_jobs_and_allocations(tmp_path: Path) -> None:
    a = Allocator(tmp_path)
    try:
        a.stub.RegisterNode(pb.RegisterNodeRequest(node_id="n0", gpus=4))
        req = job("m", max_gpus=4)
        req.job.ClearField("scaling")
        for k, t in ((1, 0.10), (2, 0.11), (4, 0.12)):
            req.job.measurements.add(nodes=1, replicas=k, local_batch_size=8, step_seconds=t)
        a.stub.SubmitJob(req)
        a.stub.SubmitJob(job("w", min_gpus=4))  # waits behind m
        a.stub.UpdateJob(
            pb.UpdateJobRequest(
                job_id="m",
                measurements=[
                    pb.Measurement(nodes=1, replicas=3, local_batch_size=8, step_seconds=0.115)
                ],
                gradient=pb.GradientStats(base_batch_size=32, grad_sqr=1.0, grad_var=20.0),
            )
        )
        before = by_job(until(a.stub, lambda x: by_job(x).get("m") and by_job(x)["m"].gpus))
    finally:
        a.stop()
    again = Allocator(tmp_path)
    try:
        snap = again.stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
        after = by_job(snap)
        assert set(after) == {"m", "w"}
        assert (
            after["m"].gpus == before["m"].gpus and after["m"].batch_size == before["m"].batch_size
        )
        assert after["w"].gpus == 0
        again.stub.CompleteJob(pb.CompleteJobRequest(job_id="m"))
        until(again.stub, lambda x: by_job(x).get("w") and by_job(x)["w"].gpus == 4)
    finally:
        again.stop()


def test_dry_run_only_recommends(alloc: Allocator) -> None:
    s = alloc.stub
    s.RegisterNode(pb.RegisterNodeRequest(node_id="n0", gpus=4))
    s.SubmitJob(job("a", max_gpus=4))
    until(s, lambda x: by_job(x).get("a") and by_job(x)["a"].gpus == 4)
    cfg = s.Configure(
        pb.ConfigureRequest(config=pb.AllocatorConfig(dry_run=True), set_dry_run=True)
    )
    assert cfg.dry_run and cfg.policy == "goodput-dp-lend"
    s.SubmitJob(job("b", max_gpus=4))
    snap = until(s, lambda x: x.dry_run and by_job(x).get("b") and by_job(x)["b"].gpus > 0)
    assert by_job(snap)["a"].gpus < 4  # the recommendation ...
    decisions = AllocatorStore(alloc.state_dir / "allocator.db").decisions("a")
    assert decisions[-1][5]  # ... logged as a dry-run decision
    s.Configure(pb.ConfigureRequest(config=pb.AllocatorConfig(dry_run=False), set_dry_run=True))
    # leaving dry run applies the decision
    until(s, lambda x: not x.dry_run and by_job(x)["b"].gpus > 0 and by_job(x)["a"].gpus < 4)


def test_watch_streams_each_decision_for_a_job(alloc: Allocator) -> None:
    s = alloc.stub
    s.RegisterNode(pb.RegisterNodeRequest(node_id="n0", gpus=2))
    s.SubmitJob(job("a", max_gpus=2))
    stream = s.WatchAllocations(pb.WatchAllocationsRequest(job_id="a"), timeout=20)
    seen = []
    for snap in stream:
        seen.append([(x.job_id, x.gpus) for x in snap.allocations])
        if seen[-1] == [("a", 2)]:
            s.SubmitJob(job("b"))
        if seen[-1] == [("a", 1)]:
            break
    stream.cancel()
    assert all(len(x) <= 1 for x in seen)  # only job a's allocation


def test_tcp_needs_the_token(tmp_path: Path) -> None:
    port = free_port()
    a = Allocator(tmp_path, "--listen", f"127.0.0.1:{port}", "--token", "t0ken")
    try:
        stub = pb_grpc.ClusterAllocatorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        with pytest.raises(grpc.RpcError) as err:
            stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.GetAllocations(
            pb.GetAllocationsRequest(), metadata=(("authorization", "Bearer t0ken"),), timeout=5
        )
        assert ok.policy == "goodput-dp-lend"
    finally:
        a.stop()


def test_sidecar_link_registers_reports_and_directs_batch_sizes(
    alloc: Allocator, tmp_path: Path
) -> None:
    """The link ties a local job to the allocator's by its key (DLOADER_JOB_KEY, derived from
    the job's token), never by name (#49 §1, high: another user's 15 jobs named like root's cut
    root's loader to 1 worker, took its batch-size directives and their rates went into its
    report). It directs the allocation's local batch size as given."""

    async def scenario() -> None:
        core = NodeCore(SidecarStore(tmp_path / "node.db"), PolicySettings("even", 8, 2, 60.0))
        limits = JobLimits(1, 1, 1, 64, may_change_batch_size=True)
        stub = pb_grpc.ClusterAllocatorStub(grpc.aio.insecure_channel(f"unix://{alloc.socket}"))
        spec = job(
            "train-x",
            batch_size=8,
            min_batch_size=8,
            max_batch_size=64,
            max_gpus=2,
            max_local_batch_size=32,
        ).job
        x = (await stub.SubmitJob(pb.SubmitJobRequest(job=spec))).token
        y = (await stub.SubmitJob(job("train-y", batch_size=8, max_gpus=2))).token
        pid = (os.getpid(),)
        rank0 = core.register(Registration("train-x", pid, 1, 4, limits, job_key=job_key(x)))
        fixed = core.register(
            Registration("train-y", pid, 1, 8, JobLimits(max_workers=1), job_key=job_key(y))
        )
        # another user's jobs named like train-x: with no key, and with a made-up one
        namesakes = [
            core.register(Registration("train-x", pid, 1, 4, limits, job_key=k))
            for k in ("", "0" * 64)
        ]
        for j in namesakes:
            j.last_report = rank0.last_report = _report(j.job_id, 123.0)
        link = AllocatorLink(
            core, Endpoint.of(f"unix://{alloc.socket}"), node_id="n0", gpus=4, period_s=0.2
        )
        stop = asyncio.Event()
        task = asyncio.create_task(link.run(stop))
        await asyncio.wait_for(link.connected.wait(), 10)
        end = time.monotonic() + 10
        while rank0.directive.batch_size != 32 and time.monotonic() < end:
            await asyncio.sleep(0.05)
        # global batch 64 on 2 GPUs, at most 32 per process: 32 per loader, as allocated;
        # train-y may not change its batch
        assert rank0.directive.batch_size == 32
        assert "allocator" in rank0.directive.reason and "32 per process" in rank0.directive.reason
        assert fixed.directive.batch_size == 8
        assert sorted(job_id for job_id, _ in link.managed.values()) == ["train-x", "train-y"]
        for j in namesakes:  # nothing of the allocator's job reaches them
            assert j.directive.batch_size == 4 and "allocator" not in j.directive.reason
        reported = {r.job_id: r.samples_per_second for r in link.report().jobs}
        assert reported == {"train-x": 123.0}  # rank0's rate alone, not the namesakes'
        stop.set()
        await task

    asyncio.run(scenario())


def _report(job_id: str, rate: float) -> JobReport:
    """A loader's report of ``rate`` samples/s (``job_id``: whose; the report names none)."""
    return JobReport(time.time(), 1, 4, rate, 0.0, 0.1, 0.0, 1.0, 100)


def test_a_silent_node_leaves_the_pool_until_it_reports(tmp_path: Path, caplog) -> None:
    now = [1000.0]
    core = AllocatorCore(
        AllocatorStore(tmp_path / "a.db"), Settings(), clock=lambda: now[0], node_timeout_s=60
    )
    core.register_node("n0", 2)
    core.register_node("n1", 2)
    core.submit(JobSpec.from_pb(job("a", max_gpus=4).job))
    assert core.decide().allocations[0].gpus == 4
    now[0] += 30
    core.report_node("n1", 2, [])
    now[0] += 45  # n0 silent for 75 s, n1 for 45 s
    with caplog.at_level("WARNING"):
        snap = core.decide()
    assert snap.allocations[0].nodes == {"n1": 2}
    assert "node n0 silent for 75 s" in caplog.text
    # back, once the job is old enough that its restart cost (which weighs age) is worth it
    now[0] += 600
    core.report_node("n0", 2, [])
    core.report_node("n1", 2, [])
    assert core.decide().allocations[0].gpus == 4
    with pytest.raises(ValueError, match="node_timeout_s=-1"):
        AllocatorCore(AllocatorStore(tmp_path / "b.db"), Settings(), node_timeout_s=-1)


def test_jobs_across_nodes_get_a_rendezvous_per_placement(tmp_path: Path) -> None:
    """A placement over several nodes gets ``host:port`` on its first node, a new port and a
    new generation whenever the placement changes; one node: no rendezvous. Kept by a
    restart."""
    a = Allocator(tmp_path, "--rendezvous-ports", "31000-31001")
    try:
        s = a.stub
        s.RegisterNode(pb.RegisterNodeRequest(node_id="n1", gpus=2, host="10.0.0.1"))
        s.RegisterNode(pb.RegisterNodeRequest(node_id="n2", gpus=2))  # no host: its id
        s.SubmitJob(job("x", max_gpus=4))
        first = by_job(until(s, lambda x: by_job(x).get("x") and by_job(x)["x"].gpus == 4))["x"]
        assert (first.rendezvous, first.generation) == ("10.0.0.1:31000", 1)
        s.ReportNode(pb.ReportNodeRequest(node_id="n1", free_gpus=0))
        alone = by_job(until(s, lambda x: by_job(x)["x"].generation == 2))["x"]
        assert {n.node_id: n.gpus for n in alone.nodes} == {"n2": 2}
        assert alone.rendezvous == ""
        s.ReportNode(pb.ReportNodeRequest(node_id="n1", free_gpus=1))
        s.ReportNode(pb.ReportNodeRequest(node_id="n2", free_gpus=1))
        spread = by_job(until(s, lambda x: by_job(x)["x"].generation == 3))["x"]
        assert spread.rendezvous == "10.0.0.1:31001"  # the next port: never the old store's
        with pytest.raises(grpc.RpcError) as bad:
            s.RegisterNode(pb.RegisterNodeRequest(node_id="n3", gpus=1, host="a b;c"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "host" in (bad.value.details() or "")
    finally:
        a.stop()
    again = Allocator(tmp_path, "--rendezvous-ports", "31000-31001")
    try:
        kept = by_job(again.stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5))["x"]
        assert (kept.rendezvous, kept.generation) == (spread.rendezvous, spread.generation)
    finally:
        again.stop()


def test_rendezvous_ports_flag_is_checked(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--rendezvous-ports", "abc"])
    a_args = parser().parse_args(["--rendezvous-ports", "80-90", "--state-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="--rendezvous-ports 80-90"):
        AllocatorDaemonConfig.resolve(a_args, None)


def test_a_job_measured_on_one_gpu_grows_as_its_measurements_come_in(tmp_path: Path) -> None:
    """The live service learns as the simulator's online mode does: a model from
    measurements is trusted up to twice the GPUs measured."""
    now = [1000.0]
    core = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(), clock=lambda: now[0])
    core.register_node("n0", 8)
    one = (Measurement(1, 1, 32, 0.2),)
    core.submit(JobSpec(job_id="a", batch_size=256, max_gpus=8, measurements=one))
    assert core.decide().allocations[0].gpus == 2  # 2x the one GPU measured
    now[0] += 3600  # old enough that a restart is cheap
    core.update("a", [Measurement(1, 2, 32, 0.21, 0.01)])
    assert core.decide().allocations[0].gpus == 4
    core.update("a", [Measurement(1, 4, 32, 0.22, 0.02)])
    assert core.decide().allocations[0].gpus == 8


def test_no_request_waits_for_a_decision(tmp_path: Path) -> None:
    """The policy runs in a worker thread: while a decision takes a second, the server still
    answers at once (with the policy on the event loop it would answer after the decision)."""
    from dloader._daemon.server import ListenConfig
    from dloader.allocator.server import build_server

    class SlowPolicy:
        def __init__(self, inner: object) -> None:
            self.inner, self.name = inner, "slow"
            self.started, self.ended = threading.Event(), threading.Event()

        def decide(self, jobs: object, cluster: object) -> object:
            self.started.set()
            time.sleep(1.0)
            self.ended.set()
            return self.inner.decide(jobs, cluster)  # type: ignore[attr-defined]

    async def scenario() -> None:
        core = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
        core.register_node("n0", 4)
        core.submit(JobSpec.from_pb(job("a", max_gpus=4).job))
        slow = SlowPolicy(core._policy)
        core._policy = slow  # type: ignore[assignment]
        serving = await build_server(core, ListenConfig(socket=str(tmp_path / "a.sock")))
        stop = asyncio.Event()
        loop_task = asyncio.create_task(core.run(stop))
        try:
            async with grpc.aio.insecure_channel(f"unix://{tmp_path / 'a.sock'}") as channel:
                stub = pb_grpc.ClusterAllocatorStub(channel)
                await stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
                core._wake.set()
                await asyncio.to_thread(slow.started.wait, 5)
                began = time.monotonic()
                during = await stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
                waited = time.monotonic() - began
                assert not slow.ended.is_set(), "the request was answered after the decision"
                assert waited < 0.3, f"GetAllocations waited {waited:.2f} s for the decision"
                assert during.version == 0  # the decision in progress is not yet applied
                while core.snapshot().version == 0:
                    await asyncio.sleep(0.05)
                assert core.snapshot().allocations[0].gpus == 4  # and then it is
        finally:
            stop.set()
            core._wake.set()
            await loop_task
            await serving.stop()

    asyncio.run(scenario())
