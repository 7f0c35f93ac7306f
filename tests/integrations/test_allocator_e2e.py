"""End to end on this machine: the allocator daemon, a node sidecar joined to it, and two jobs
under dloader-launch (torchrun, gloo; each "GPU" is a process). The first job starts on all
4 GPUs; when the second arrives the allocator shrinks the first to 2 (the launcher restarts it
under torchrun with 2 processes and it resumes from its elastic checkpoint: every sample exactly
once) and picks a larger batch for the second (the sidecar directs its running loaders, which
change batch size without a restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc

# torchrun restarts: 61 s in CI
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("train_alloc.py")
BIN = Path(sys.executable).parent
# a job that scales almost linearly: the optimizer gives it every GPU it can
SCALING = json.dumps(
    {
        "alpha_c": 0.01,
        "beta_c": 0.002,
        "alpha_n": 0.0005,
        "beta_n": 0.0,
        "alpha_r": 0.01,
        "beta_r": 0.0,
        "gamma": 2.0,
    }
)


def events(prefix: Path) -> list[dict]:
    """A job's events from every process it ran (one file per pid), steps in step order (pids
    do not sort by time: 9999 sorts after 10001)."""
    out = []
    for f in sorted(prefix.parent.glob(prefix.name + ".*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda e: e.get("step", 0))


def wait_for(what: str, check, timeout: float = 90.0, procs=()) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        for p in procs:
            assert p.poll() is None or p.returncode == 0, exit_report(p)
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def exit_report(p: subprocess.Popen) -> str:
    """What a process that should still run said before it exited (its log's tail)."""
    path = getattr(p, "log_path", None)
    tail = path.read_text()[-4000:] if path is not None and path.exists() else "(no log)"
    return f"{p.args[:3]} exited {p.returncode}; its log ends:\n{tail}"


def allocator_cmd(socket: Path, state: Path) -> list[str]:
    """``dloader-allocator`` on ``socket``, deciding every second."""
    return [
        str(BIN / "dloader-allocator"),
        "--socket",
        str(socket),
        "--state-dir",
        str(state),
        "--interval",
        "1",
    ]


class Processes:
    """Daemons and jobs of a test, each logging to ``<name>.log``; SIGTERM-ed at the end."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []

    def start(self, name: str, *cmd: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 (closed in __exit__)
        self.logs.append(log)
        p = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        p.log_path = Path(log.name)  # type: ignore[attr-defined]  (for exit_report)
        self.procs.append(p)
        return p

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


def test_gpu_and_batch_size_changes_reach_running_jobs(tmp_path: Path) -> None:
    asock, nsock = tmp_path / "alloc.sock", tmp_path / "node.sock"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "DLOADER_SIDECAR": f"unix://{nsock}",
    }
    ps = Processes(tmp_path, env)
    start, procs = ps.start, ps.procs

    def launch(name: str, job: str, limits: list[str], script: list[str]) -> subprocess.Popen:
        return start(
            name,
            str(BIN / "dloader-launch"),
            "--allocator",
            f"unix://{asock}",
            "--job-id",
            job,
            "--node-id",
            "n0",
            "--max-gpus",
            "4",
            "--scaling",
            SCALING,
            "--grace",
            "20",
            *limits,
            str(SCRIPT),
            "--ckpt-dir",
            str(tmp_path / f"ckpt-{name}"),
            "--events",
            str(tmp_path / f"ev-{name}"),
            "--step-s",
            "0.15",
            *script,
        )

    with ps:
        start("alloc", *allocator_cmd(asock, tmp_path / "astate"), "--restart-cost", "1")
        start(
            "side",
            str(BIN / "dloader-sidecar"),
            "--socket",
            str(nsock),
            "--state-dir",
            str(tmp_path / "sstate"),
            "--allocator",
            f"unix://{asock}",
            "--gpus",
            "4",
            "--node-id",
            "n0",
            "--period",
            "0.5",
        )
        channel = grpc.insecure_channel(f"unix://{asock}")
        stub = pb_grpc.ClusterAllocatorStub(channel)

        def nodes_registered() -> bool:
            try:
                stub.GetAllocations(pb.GetAllocationsRequest(), timeout=2)
            except grpc.RpcError:
                return False
            return (tmp_path / "side.log").read_text().count("registered node n0") > 0

        wait_for("the sidecar to join the allocator", nodes_registered, procs=procs)

        a = launch(
            "a",
            "train-a",
            ["--batch-size", "8", "--max-local-batch-size", "8"],
            ["--samples", "240", "--batch", "2", "--max-batch", "8"],
        )
        ev_a = tmp_path / "ev-a"
        wait_for(
            "job a on 4 GPUs",
            lambda: sum(1 for e in events(ev_a) if e["event"] == "step" and e["world"] == 4) >= 8,
            procs=procs,
        )

        b = launch(
            "b",
            "train-b",
            [
                "--batch-size",
                "8",
                "--min-batch-size",
                "8",
                "--max-batch-size",
                "64",
                "--max-local-batch-size",
                "32",
            ],
            ["--samples", "600", "--batch", "4", "--max-batch", "64"],
        )
        ev_b = tmp_path / "ev-b"
        wait_for(
            "job b's loaders to take the allocator's batch size",
            lambda: any(e["event"] == "step" and e["batch"] == 32 for e in events(ev_b)),
            procs=procs,
        )
        assert a.wait(timeout=120) == 0, (tmp_path / "a.log").read_text()[-3000:]
        assert b.wait(timeout=120) == 0, (tmp_path / "b.log").read_text()[-3000:]

        # job a: 4 processes, then restarted with 2, and every index committed exactly once
        steps_a = [e for e in events(ev_a) if e["event"] == "step"]
        worlds = [w for w in dict.fromkeys(e["world"] for e in steps_a)]
        assert worlds[:2] == [4, 2], worlds  # (and back to 4 if b finished first)
        consumed = Counter(i for e in steps_a for i in e["indices"])
        assert sorted(consumed) == list(range(240)) and set(consumed.values()) == {1}
        # job b: its running loaders switched batch size (no restart: one world size)
        steps_b = [e for e in events(ev_b) if e["event"] == "step"]
        assert {e["world"] for e in steps_b} == {2}
        sizes = [e["batch"] for e in steps_b]
        assert sizes[0] == 4 and 32 in sizes
        consumed = Counter(i for e in steps_b for i in e["indices"])
        assert sorted(consumed) == list(range(600)) and set(consumed.values()) == {1}
        # both completed at the allocator; its decisions were logged with reasons
        wait_for(
            "the allocator to drop both jobs",
            lambda: not stub.GetAllocations(pb.GetAllocationsRequest()).allocations,
            timeout=10,
        )
        alloc_log = (tmp_path / "alloc.log").read_text()
        assert "job train-a: 2 GPU(s)" in alloc_log and "shrink 4->2" in alloc_log
        assert "job train-b completed" in alloc_log


def test_training_outlives_an_allocator_crash(tmp_path: Path) -> None:
    """SIGKILL the allocator under a running job: the job trains on; the restarted allocator
    restores it from SQLite without moving it, and hears of its completion."""
    asock = tmp_path / "alloc.sock"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    ps = Processes(tmp_path, env)
    start = ps.start

    def allocator(name: str) -> subprocess.Popen:
        return start(name, *allocator_cmd(asock, tmp_path / "astate"))

    with ps:
        first = allocator("alloc1")
        stub = pb_grpc.ClusterAllocatorStub(grpc.insecure_channel(f"unix://{asock}"))
        wait_for("the allocator", lambda: asock.exists())
        grpc.channel_ready_future(grpc.insecure_channel(f"unix://{asock}")).result(timeout=20)
        stub.RegisterNode(pb.RegisterNodeRequest(node_id="n0", gpus=2), timeout=10)
        ev = tmp_path / "ev"
        job = start(
            "job",
            str(BIN / "dloader-launch"),
            "--allocator",
            f"unix://{asock}",
            "--job-id",
            "steady",
            "--node-id",
            "n0",
            "--max-gpus",
            "2",
            "--scaling",
            SCALING,
            "--batch-size",
            "4",
            str(SCRIPT),
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--events",
            str(ev),
            "--step-s",
            "0.1",
            "--samples",
            "360",
            "--batch",
            "2",
            "--max-batch",
            "2",
        )

        def steps() -> int:
            return sum(1 for e in events(ev) if e["event"] == "step")

        wait_for("the job to train", lambda: steps() >= 6, procs=[job])
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        before = steps()
        wait_for("training to go on without the allocator", lambda: steps() >= before + 10)
        assert job.poll() is None
        allocator("alloc2")
        assert job.wait(timeout=120) == 0, (tmp_path / "job.log").read_text()[-3000:]
        steps_ = [e for e in events(ev) if e["event"] == "step"]
        assert {e["world"] for e in steps_} == {2}  # never restarted
        consumed = Counter(i for e in steps_ for i in e["indices"])
        assert sorted(consumed) == list(range(360)) and set(consumed.values()) == {1}
        wait_for(
            "the allocator to hear of the completion",
            lambda: not stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5).allocations,
            timeout=20,
        )
        assert "allocator unreachable" in (tmp_path / "job.log").read_text()
