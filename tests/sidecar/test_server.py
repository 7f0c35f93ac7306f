"""The sidecar's gRPC API on a real server: behaviour, bad input, faults."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rich.console import Console

from dloader._daemon import MAX_MESSAGE_BYTES, ListenConfig
from dloader.sidecar.ctl import jobs_table
from dloader.sidecar.monitors import GpuInfo, GpuMonitor
from dloader.v1 import node_pb2 as pb
from tests._daemon import free_port
from tests.sidecar.conftest import Sidecar, register

pytestmark = pytest.mark.integration


def code_of(fn: object, *args: object, **kwargs: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args, **kwargs)  # type: ignore[operator]
    return err.value.code(), err.value.details()


def report(job: pb.RegisterJobResponse, **kw: object) -> pb.JobReport:
    fields = dict(
        job_id=job.job_id,
        token=job.token,
        num_workers=2,
        batch_size=32,
        samples_per_second=200.0,
        idle_share=0.5,
        step_seconds=0.16,
        window_seconds=5.0,
    )
    fields.update(kw)
    return pb.JobReport(**fields)  # type: ignore[arg-type]


def test_register_report_list_explain(sidecar: Sidecar) -> None:
    job = register(sidecar.stub, os.getpid(), name="trainer")
    assert job.job_id and job.token and job.directive.num_workers >= 1
    summary = sidecar.stub.Report(
        iter([report(job), report(job, samples_per_second=300.0, done=0.25)]), timeout=5
    )
    assert summary.accepted == 2
    jobs = sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
    assert [j.name for j in jobs] == ["trainer"] and jobs[0].samples_per_second == 300.0
    assert jobs[0].done == 0.25  # its declared epochs (DataLoader(epochs=N))
    shown = Console(width=400, record=True)
    shown.print(jobs_table(list(jobs)))
    assert " 25% " in shown.export_text()
    explain = sidecar.stub.Explain(pb.ExplainRequest(job_id=job.job_id), timeout=5)
    assert explain.policy == "adaptive" and explain.reason
    status = sidecar.stub.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=5)
    assert status.jobs == 1 and status.cpu_count >= 1
    assert not status.nvml_available and "NVML unavailable" in status.nvml_message


def test_directives_stream_follows_policy_changes(sidecar: Sidecar) -> None:
    job = register(sidecar.stub, os.getpid(), num_workers=2)
    stream = sidecar.stub.WatchDirectives(
        pb.WatchDirectivesRequest(job_id=job.job_id, token=job.token)
    )
    first = next(stream)
    assert first.job_id == job.job_id
    sidecar.stub.SetPolicy(
        pb.SetPolicyRequest(config=pb.PolicyConfig(name="even", worker_budget=5)), timeout=5
    )
    change = next(stream)
    assert change.num_workers == 5 and "even split" in change.reason
    assert change.revision > first.revision
    stream.cancel()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(name=""), "name"),
        (dict(limits=pb.JobLimits(min_workers=5, max_workers=2)), "limits.min_workers"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_registration_names_the_field(
    sidecar: Sidecar, kwargs: dict[str, object], field: str
) -> None:
    code, details = code_of(register, sidecar.stub, os.getpid(), **kwargs)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field)


def test_registration_of_a_dead_pid_is_refused(sidecar: Sidecar) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    code, details = code_of(register, sidecar.stub, proc.pid)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"process {proc.pid} is not running on this node" in details


def test_reports_are_authenticated_and_validated(sidecar: Sidecar) -> None:
    a = register(sidecar.stub, os.getpid(), name="a")
    b = register(sidecar.stub, os.getpid(), name="b")
    code, details = code_of(sidecar.stub.Report, iter([report(a), report(b)]), timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED and a.job_id in details
    code, _ = code_of(sidecar.stub.Report, iter([report(a, token=b.token)]), timeout=5)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, _ = code_of(sidecar.stub.Report, iter([report(a, job_id="nope")]), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND
    for bad, field in (
        (dict(idle_share=2.0), "idle_share"),
        (dict(samples_per_second=float("nan")), "samples_per_second"),
        (dict(batch_size=0), "batch_size"),
    ):
        code, details = code_of(sidecar.stub.Report, iter([report(a, **bad)]), timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field)
    code, _ = code_of(sidecar.stub.Explain, pb.ExplainRequest(job_id="nope"), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = code_of(
        sidecar.stub.DeregisterJob, pb.DeregisterJobRequest(job_id=a.job_id, token="x"), timeout=5
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, details = code_of(
        sidecar.stub.SetPolicy,
        pb.SetPolicyRequest(config=pb.PolicyConfig(name="greedy")),
        timeout=5,
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "config.name" in details
    # The daemon is still fine.
    assert len(sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == 2


def test_oversized_message_is_refused(sidecar: Sidecar) -> None:
    code, _ = code_of(
        sidecar.stub.RegisterJob,
        pb.RegisterJobRequest(
            name="x" * (MAX_MESSAGE_BYTES + 10), pids=[os.getpid()], batch_size=1
        ),
        timeout=5,
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_dead_job_is_noticed_and_freed(sidecar: Sidecar) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        job = register(sidecar.stub, proc.pid)
        assert len(sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == 1
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs:
            break
        time.sleep(0.1)
    assert not sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
    code, _ = code_of(sidecar.stub.Explain, pb.ExplainRequest(job_id=job.job_id), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND


def test_health_reflection_and_socket_mode(sidecar: Sidecar) -> None:
    health = health_pb2_grpc.HealthStub(sidecar.channel)
    resp = health.Check(health_pb2.HealthCheckRequest(service="dloader.v1.NodeService"), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(sidecar.channel)
    answer = next(
        refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
    )
    names = {s.name for s in answer.list_services_response.service}
    assert "dloader.v1.NodeService" in names
    assert stat.S_IMODE(os.stat(sidecar.socket).st_mode) == 0o660


def test_tcp_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TCP needs --token"):
        ListenConfig(tcp="127.0.0.1:0")
    port = free_port()
    s = Sidecar(tmp_path, "--listen", f"127.0.0.1:{port}", "--token", "s3cret")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            from dloader.v1 import node_pb2_grpc as pb_grpc

            stub = pb_grpc.NodeServiceStub(ch)
            code, _ = code_of(stub.ListJobs, pb.ListJobsRequest(), timeout=5)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            ok = stub.ListJobs(
                pb.ListJobsRequest(), timeout=5, metadata=[("authorization", "Bearer s3cret")]
            )
            assert list(ok.jobs) == []
            # reflection (a stream-stream method) is behind the token too
            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                list(
                    refl.ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                    )
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # the token is for TCP: the local operator on the Unix socket is not locked out
        assert list(s.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs) == []
    finally:
        s.stop()


def test_hostile_ids_tokens_and_names_get_clear_short_errors(sidecar: Sidecar) -> None:
    job = register(sidecar.stub, os.getpid())
    # a non-ASCII token is refused as a wrong token, not an internal error
    code, _ = code_of(
        sidecar.stub.DeregisterJob,
        pb.DeregisterJobRequest(job_id=job.job_id, token="t\u00f6ken\u2603"),
        timeout=5,
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    # a 16 KB id is not echoed back whole (the trailer would not fit)
    code, details = code_of(sidecar.stub.Explain, pb.ExplainRequest(job_id="x" * 16384), timeout=5)
    assert (
        code == grpc.StatusCode.NOT_FOUND and len(details) < 300 and "16384 characters" in details
    )
    # a name with a newline would forge log lines
    code, details = code_of(register, sidecar.stub, os.getpid(), name="ok\nFAKE log line")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("name:")


def test_restart_restores_jobs_and_models(tmp_path: Path) -> None:
    s = Sidecar(tmp_path)
    job = register(s.stub, os.getpid(), name="survivor")
    s.stub.Report(iter([report(job, num_workers=job.directive.num_workers)]), timeout=5)
    s.stop()
    again = Sidecar(tmp_path)
    try:
        jobs = again.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
        assert [j.job_id for j in jobs] == [job.job_id]
        # The job's token still works after the restart: it reconnects without re-registering.
        assert again.stub.Report(iter([report(job)]), timeout=5).accepted == 1
    finally:
        again.stop()


class FakeNvml:
    """The NVML boundary, faked (no GPU here)."""

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(0, "Fake H100", 0.75, 10 * 2**30, 80 * 2**30, (1234,))]


class BrokenNvml:
    def gpus(self) -> list[GpuInfo]:
        raise RuntimeError("driver went away")


def test_gpu_monitor_adapter() -> None:
    gpus = GpuMonitor(FakeNvml()).read()
    assert gpus[0].name == "Fake H100" and gpus[0].utilization == 0.75
    broken = GpuMonitor(BrokenNvml())
    assert broken.read() == [] and "driver went away" in broken.message
    real = GpuMonitor()  # no driver on CI machines: says so instead of failing
    assert real.available or "NVML unavailable" in real.message


def test_dloaderctl_health_checks_either_daemon(
    sidecar: Sidecar, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dloader.sidecar.ctl import main as ctl
    from tests.allocator.test_service import Allocator

    assert ctl(["--socket", sidecar.socket, "health"]) == 0
    a = Allocator(tmp_path / "alloc")
    try:
        assert ctl(["--socket", a.socket, "health"]) == 0
    finally:
        a.stop()
    assert capsys.readouterr().out.split() == ["SERVING", "SERVING"]
    assert ctl(["--socket", str(tmp_path / "nobody.sock"), "--timeout", "1", "health"]) == 1
