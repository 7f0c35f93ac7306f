"""Crash safety: SIGKILL each daemon at random moments under load, restart it, and check that
every acknowledged operation is there and nothing that ended comes back."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dloader._daemon.store import MAX_ENDED_JOBS_PER_OWNER
from dloader.v1 import allocator_pb2 as apb
from dloader.v1 import allocator_pb2_grpc as apb_grpc
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from tests.allocator.test_service import SCALING

pytestmark = pytest.mark.integration

KILLS = int(os.environ.get("DLOADER_CRASH_KILLS", "3"))


class Daemon:
    """A daemon process on a Unix socket, killed and restarted at will."""

    def __init__(self, module: str, folder: Path, *extra: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.socket = folder / "run" / "d.sock"
        self.cmd = [
            sys.executable,
            "-m",
            module,
            *("--socket", str(self.socket), "--state-dir", str(folder / "state")),
            *("--log-level", "WARNING", *extra),
        ]
        self.log = open(folder / "daemon.log", "a")  # noqa: SIM115 - kept open across restarts
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> grpc.Channel:
        self.proc = subprocess.Popen(self.cmd, stderr=self.log, stdout=self.log)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        return self.channel

    def kill(self) -> None:
        assert self.proc is not None and self.channel is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.channel.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.channel is not None:
            self.channel.close()
        self.log.close()


def under_load(
    daemon: Daemon, kills: int, step: Callable[[grpc.Channel, int], None], seed: int
) -> int:
    """Runs ``step`` (one operation, recording what was acknowledged) in a loop while the
    daemon is SIGKILLed ``kills`` times at random moments; returns the operations tried."""
    rng = random.Random(seed)
    channel = daemon.start()
    done = threading.Event()
    tried = 0

    def load() -> None:
        nonlocal tried
        while not done.is_set():
            try:
                step(channel, tried)
            except grpc.RpcError:
                time.sleep(0.02)  # the daemon is down: the operation was not acknowledged
            tried += 1

    for _ in range(kills):
        worker = threading.Thread(target=load, daemon=True)
        worker.start()
        time.sleep(rng.uniform(0.2, 1.5))
        daemon.kill()
        done.set()
        worker.join(30)
        done.clear()
        channel = daemon.start()
    return tried


def test_allocator_keeps_every_acknowledged_operation(tmp_path: Path) -> None:
    d = Daemon("dloader.allocator.cli", tmp_path, "--interval", "0.2")
    submitted: dict[str, str] = {}
    completed: dict[str, None] = {}  # in the order acknowledged
    maybe_completed: set[str] = set()  # a completion sent, its answer lost to a kill
    nodes: set[str] = set()

    def step(channel: grpc.Channel, i: int) -> None:
        stub = apb_grpc.ClusterAllocatorStub(channel)
        if i % 7 == 0:
            stub.RegisterNode(apb.RegisterNodeRequest(node_id=f"n{i}", gpus=4), timeout=5)
            nodes.add(f"n{i}")
        elif i % 3 == 2 and set(submitted) - completed.keys():
            job_id = sorted(set(submitted) - completed.keys())[0]
            maybe_completed.add(job_id)
            try:
                stub.CompleteJob(apb.CompleteJobRequest(job_id=job_id), timeout=5)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: done before the kill
                    raise
            completed[job_id] = None
        else:
            spec = apb.JobSpec(job_id=f"j{i}", batch_size=32, scaling=SCALING)
            r = stub.SubmitJob(apb.SubmitJobRequest(job=spec), timeout=5)
            submitted[r.job_id] = r.token

    try:
        tried = under_load(d, KILLS, step, seed=1)
        assert d.channel is not None
        stub = apb_grpc.ClusterAllocatorStub(d.channel)
        active = {a.job_id for a in stub.GetAllocations(apb.GetAllocationsRequest()).allocations}
        assert set(submitted) - maybe_completed <= active, "an acknowledged submission was lost"
        assert not (completed.keys() & active), "a completed job came back"
        print(
            f"allocator: {tried} operations, {KILLS} kills, {len(submitted)} submissions and "
            f"{len(completed)} completions acknowledged, 0 lost"
        )
        # Ended for good: its id stays taken while the store keeps it, i.e. for the newest
        # MAX_ENDED_JOBS_PER_OWNER of an owner (a fast machine completes more than that here).
        for job_id in list(completed)[-MAX_ENDED_JOBS_PER_OWNER // 2 :]:
            with pytest.raises(grpc.RpcError) as err:
                spec = apb.JobSpec(job_id=job_id, batch_size=32, scaling=SCALING)
                stub.SubmitJob(apb.SubmitJobRequest(job=spec), timeout=5)
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    finally:
        d.stop()


def test_sidecar_keeps_every_acknowledged_operation(tmp_path: Path) -> None:
    d = Daemon("dloader.sidecar.cli", tmp_path, "--period", "0.2")
    registered: dict[str, str] = {}
    ended: set[str] = set()
    maybe_ended: set[str] = set()
    policies: list[str] = []
    last_tried: list[str] = []

    def step(channel: grpc.Channel, i: int) -> None:
        stub = pb_grpc.NodeServiceStub(channel)
        if i % 5 == 4:
            name = "even" if len(policies) % 2 == 0 else "adaptive"
            last_tried[:] = [name]
            stub.SetPolicy(pb.SetPolicyRequest(config=pb.PolicyConfig(name=name)), timeout=5)
            policies.append(name)
        elif i % 3 == 2 and set(registered) - ended:
            job_id = sorted(set(registered) - ended)[0]
            maybe_ended.add(job_id)
            try:
                stub.DeregisterJob(
                    pb.DeregisterJobRequest(job_id=job_id, token=registered[job_id]), timeout=5
                )
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: done before the kill
                    raise
            ended.add(job_id)
        else:
            r = stub.RegisterJob(
                pb.RegisterJobRequest(name=f"j{i}", pids=[os.getpid()], batch_size=8), timeout=5
            )
            registered[r.job_id] = r.token

    try:
        tried = under_load(d, KILLS, step, seed=2)
        assert d.channel is not None
        stub = pb_grpc.NodeServiceStub(d.channel)
        jobs = {j.job_id for j in stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
        assert set(registered) - maybe_ended <= jobs, "an acknowledged registration was lost"
        assert not (ended & jobs), "a deregistered job came back"
        if policies:  # the last acknowledged policy, or one sent after it whose answer was lost
            now = stub.GetPolicy(pb.GetPolicyRequest(), timeout=5).name
            assert now in {policies[-1], *last_tried}
        print(
            f"sidecar: {tried} operations, {KILLS} kills, {len(registered)} registrations, "
            f"{len(ended)} deregistrations, {len(policies)} policy changes acknowledged, 0 lost"
        )
    finally:
        d.stop()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_many_kills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "KILLS", 15)
    test_allocator_keeps_every_acknowledged_operation(tmp_path / "a")
    test_sidecar_keeps_every_acknowledged_operation(tmp_path / "s")
