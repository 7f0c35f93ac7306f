"""Who may do what: the daemons' access model, tried with a real second user on the node.

The tests run as root; a client process runs as ``nobody`` (uid 65534) against the same Unix
socket, as another user's training job would on a shared node. TCP roles use tokens.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dloader.v1 import allocator_pb2 as apb
from dloader.v1 import allocator_pb2_grpc as apb_grpc
from dloader.v1 import node_pb2 as pb
from tests._daemon import free_port
from tests.allocator.test_service import Allocator, job
from tests.sidecar.conftest import Sidecar

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user"),
]

ROOT = Path(__file__).resolve().parents[2]

# Started as root, imports what it needs, then becomes nobody before it connects (the
# interpreter lives under /root here, which nobody cannot read); each call of the plan on the
# socket, printing its status code name.
CLIENT = r"""
import json, os, sys, grpc
from dloader.v1 import node_pb2 as pb, node_pb2_grpc as pbg
from dloader.v1 import allocator_pb2 as apb, allocator_pb2_grpc as apbg
os.setgroups([]); os.setgid(65534); os.setuid(65534)
socket, plan = sys.argv[1], json.loads(sys.argv[2])
ch = grpc.insecure_channel(f"unix://{socket}")
out = {}
for name, service, method, fields in plan:
    stub = (pbg.NodeServiceStub if service == "node" else apbg.ClusterAllocatorStub)(ch)
    mod = pb if service == "node" else apb
    me = lambda v: os.getpid() if v == "$PID" else v
    fields = {k: ([me(x) for x in v] if isinstance(v, list) else me(v)) for k, v in fields.items()}
    req = getattr(mod, method + "Request")
    try:
        if method == "SubmitJob":
            r = stub.SubmitJob(apb.SubmitJobRequest(job=apb.JobSpec(**fields)), timeout=10)
            out[name] = ["OK", r.token]
            continue
        if method == "SetPolicy":
            r = stub.SetPolicy(pb.SetPolicyRequest(config=pb.PolicyConfig(**fields)), timeout=10)
        else:
            r = getattr(stub, method)(req(**fields), timeout=10)
        out[name] = ["OK", getattr(r, "token", "")]
    except grpc.RpcError as e:
        out[name] = [e.code().name, e.details()]
print(json.dumps(out))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other users can reach (like /run/dloader on a node)."""
    with tempfile.TemporaryDirectory(prefix="dloader-access-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


def as_nobody(socket: str, plan: list[tuple[str, str, str, dict[str, object]]]) -> dict:
    os.chmod(Path(socket).parent, 0o755)
    os.chmod(socket, 0o666)  # on a node: a group the users share
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/tmp"}
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, socket, json.dumps(plan)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_sidecar_users_claim_only_their_own_processes_and_cannot_steer(
    shared_dir: Path,
) -> None:
    s = Sidecar(shared_dir)
    try:

        def reg(name: str, pid: object) -> dict[str, object]:
            return {"name": name, "pids": [pid], "batch_size": 8}

        got = as_nobody(
            s.socket,
            [
                ("pid1", "node", "RegisterJob", reg("squat", 1)),
                ("root-proc", "node", "RegisterJob", reg("x", os.getpid())),
                ("own", "node", "RegisterJob", reg("mine", "$PID")),
                ("policy", "node", "SetPolicy", {"name": "even"}),
                ("read", "node", "ListJobs", {}),
            ],
        )
        assert got["pid1"][0] == "PERMISSION_DENIED" and "belongs to uid 0" in got["pid1"][1]
        assert got["root-proc"][0] == "PERMISSION_DENIED"
        assert got["own"][0] == "OK"
        assert got["policy"][0] == "PERMISSION_DENIED" and "operator" in got["policy"][1]
        assert got["read"][0] == "OK"
        # the operator (root here) may steer
        s.stub.SetPolicy(pb.SetPolicyRequest(config=pb.PolicyConfig(name="even")), timeout=5)
    finally:
        s.stop()


def test_allocator_jobs_belong_to_their_token_and_nodes_to_node_callers(
    shared_dir: Path,
) -> None:
    a = Allocator(shared_dir)
    try:
        mine = a.stub.SubmitJob(job("operators-job"), timeout=10)
        assert mine.token
        scaling = {"alpha_c": 0.1, "beta_c": 0.01, "gamma": 1.0}
        other = {"job_id": "operators-job"}
        got = as_nobody(
            a.socket,
            [
                ("submit", "allocator", "SubmitJob", {"job_id": "users-job", "batch_size": 32,
                                                      "scaling": scaling}),
                ("complete-other", "allocator", "CompleteJob", other),
                ("complete-other-bad-token", "allocator", "CompleteJob", {**other, "token": "x"}),
                ("reprioritise-other", "allocator", "UpdateJob", {**other, "priority": 9.0}),
                ("node", "allocator", "RegisterNode", {"node_id": "fake", "gpus": 1024}),
                ("report-node", "allocator", "ReportNode", {"node_id": "n0", "free_gpus": 0}),
                ("configure", "allocator", "Configure", {"set_dry_run": True}),
                ("read", "allocator", "GetAllocations", {}),
            ],
        )  # fmt: skip
        assert got["submit"][0] == "OK" and got["submit"][1]
        assert got["complete-other"][0] == "PERMISSION_DENIED"
        assert got["complete-other-bad-token"][0] == "PERMISSION_DENIED"
        assert got["reprioritise-other"][0] == "PERMISSION_DENIED"
        assert got["node"][0] == "PERMISSION_DENIED"
        assert got["report-node"][0] == "PERMISSION_DENIED"
        assert got["configure"][0] == "PERMISSION_DENIED"
        assert got["read"][0] == "OK"
        # the user's own token completes the user's job
        a.stub.CompleteJob(
            apb.CompleteJobRequest(job_id="users-job", token=got["submit"][1]), timeout=5
        )
    finally:
        a.stop()


def test_tcp_roles_follow_their_tokens(tmp_path: Path) -> None:
    port = free_port()
    a = Allocator(
        tmp_path,
        *("--listen", f"127.0.0.1:{port}", "--token", "op"),
        *("--node-token", "nd", "--client-token", "cl"),
    )
    try:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = apb_grpc.ClusterAllocatorStub(ch)

        def code(token: str, fn: str, req: object) -> str:
            try:
                getattr(stub, fn)(req, metadata=[("authorization", f"Bearer {token}")], timeout=5)
            except grpc.RpcError as e:
                return str(e.code().name)
            return "OK"

        node = apb.RegisterNodeRequest(node_id="n1", gpus=4)
        conf = apb.ConfigureRequest(set_dry_run=True, config=apb.AllocatorConfig(dry_run=False))
        assert code("cl", "RegisterNode", node) == "PERMISSION_DENIED"
        assert code("nd", "RegisterNode", node) == "OK"
        assert code("nd", "Configure", conf) == "PERMISSION_DENIED"
        assert code("op", "Configure", conf) == "OK"
        assert code("cl", "SubmitJob", job("via-tcp")) == "OK"
        assert code("wrong", "GetAllocations", apb.GetAllocationsRequest()) == "UNAUTHENTICATED"
        ch.close()
    finally:
        a.stop()


def test_token_files_must_be_private(tmp_path: Path) -> None:
    from dloader._shared.env import secret

    f = tmp_path / "tok"
    f.write_text("s3cret\n")
    os.chmod(f, 0o600)
    assert secret(f"@{f}", "--token") == "s3cret"
    os.chmod(f, 0o644)
    with pytest.raises(ValueError, match="readable by other users"):
        secret(f"@{f}", "--token")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o644


POD = r"""
import os, sys, time, grpc
from dloader.v1 import node_pb2 as pb, node_pb2_grpc as pbg
stub = pbg.NodeServiceStub(grpc.insecure_channel(f"unix://{sys.argv[1]}"))
req = pb.RegisterJobRequest(name="pod", pids=[os.getpid()], batch_size=8)
r = stub.RegisterJob(req, timeout=10)
print(os.getpid(), r.job_id, flush=True)
time.sleep(30)
"""


@pytest.mark.skipif(
    subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True).returncode,
    reason="cannot make a PID namespace here",
)
def test_a_pod_registers_the_pid_it_sees_and_the_sidecar_measures_the_node_pid(
    tmp_path: Path,
) -> None:
    s = Sidecar(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pod = subprocess.Popen(
        ["unshare", "-pf", "--kill-child", "--mount-proc", sys.executable, "-c", POD, s.socket],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert pod.stdout is not None
        inner, job_id = pod.stdout.readline().split()
        jobs = {j.job_id: j for j in s.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs}
        (node_pid,) = jobs[job_id].pids
        assert node_pid != int(inner)  # the pod's own numbering (1 here) was translated
        status = Path(f"/proc/{node_pid}/status").read_text()
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
        assert nspid.split()[1:] == [str(node_pid), inner]
    finally:
        pod.kill()
        pod.wait()
        s.stop()


HOG = r"""
import os, socket, sys, time
os.setgroups([]); os.setgid(65534); os.setuid(65534)
path, count = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
time.sleep(1.0)  # the front has accepted every one by now: refused ones are closed
for s in held:
    s.setblocking(False)
    try:
        refused += s.recv(1) == b""
    except BlockingIOError:
        pass
print(refused, flush=True)
time.sleep(float(sys.argv[3]))
"""


def test_one_user_holding_connections_does_not_shut_the_operator_out(
    shared_dir: Path,
) -> None:
    """S4: 1,100 connections held by one user left the operator and the node's loaders
    UNAVAILABLE. Now a user holds at most MAX_CONNECTIONS_PER_USER and the operator keeps its
    own places."""
    from dloader._daemon.peer import MAX_CONNECTIONS_PER_USER

    s = Sidecar(shared_dir)
    try:
        os.chmod(Path(s.socket).parent, 0o755)
        os.chmod(s.socket, 0o666)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": "/tmp"}
        extra = 40
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, s.socket, str(MAX_CONNECTIONS_PER_USER + extra), "20"],
            env=env,
            cwd="/",
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert hog.stdout is not None
            assert int(hog.stdout.readline()) == extra  # its connections past the cap
            began = time.monotonic()
            s.stub.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=5)  # the operator
            assert time.monotonic() - began < 1.0
            other = as_nobody(s.socket, [("read", "node", "ListJobs", {})])  # same uid: full
            assert other["read"][0] == "UNAVAILABLE"
        finally:
            hog.kill()
            hog.wait()
    finally:
        s.stop()
