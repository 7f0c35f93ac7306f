"""The job side: a real DataLoader with its sidecar agent, against a real sidecar."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import dloader
from dloader._shared.client import parse_target
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from tests.loader import datasets as D
from tests.sidecar.conftest import Sidecar

pytestmark = pytest.mark.integration

# These tests host a gRPC server in this process (a real sidecar in a thread); forking loader
# workers from a process with gRPC threads can abort them (gRPC does not survive fork()). A real
# training process holds no gRPC state (the agent's network half is its own process), so there
# fork is safe; here the workers start from a clean forkserver.
FORK_SAFE = "forkserver"


def wait_for(cond: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_parse_target() -> None:
    assert parse_target("unix:///tmp/s.sock") == "unix:///tmp/s.sock"
    assert parse_target("/tmp/s.sock") == "unix:///tmp/s.sock"
    assert parse_target("localhost:7000") == "localhost:7000"
    for bad in ("", "unix://", "nohost", "host:port", "host:99999"):
        with pytest.raises(ValueError, match="target"):
            parse_target(bad)
    with pytest.raises(ValueError, match="sidecar target 'nohost'"):
        dloader.DataLoader(D.Range(4), sidecar="nohost")


def test_loader_registers_reports_and_follows_directives(sidecar: Sidecar) -> None:
    loader = dloader.DataLoader(
        D.Range(10**6, sleep_s=0.0005),
        batch_size=8,
        num_workers=1,
        sidecar=f"unix://{sidecar.socket}",
        job_name="agent-test",
        multiprocessing_context=FORK_SAFE,
    )
    it = iter(loader)
    agent = loader.sidecar_agent
    assert agent is not None
    got = 0
    assert wait_for(lambda: agent.job_id is not None)
    sidecar.stub.SetPolicy(
        pb.SetPolicyRequest(config=pb.PolicyConfig(name="even", worker_budget=3)), timeout=5
    )
    deadline = time.monotonic() + 15
    while loader.num_workers != 3 and time.monotonic() < deadline:
        next(it)  # training goes on while the directive arrives
        got += 1
    assert loader.num_workers == 3
    jobs = sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
    assert [j.name for j in jobs] == ["agent-test"]
    assert wait_for(
        lambda: (
            sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs[0].samples_per_second > 0
            or next(it) is None
        )
    )
    it.close()
    agent.stop()
    assert wait_for(lambda: not sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs)


def test_a_loader_registers_when_created_before_its_first_batch(sidecar: Sidecar) -> None:
    """The agent's helper process starts with the loader, not at its first ``iter()``: on a
    busy node it took a second or two, and the job's first placement waited for it."""
    loader = dloader.DataLoader(
        D.Range(64),
        batch_size=8,
        num_workers=1,
        sidecar=f"unix://{sidecar.socket}",
        job_name="early",
        multiprocessing_context=FORK_SAFE,
    )
    agent = loader.sidecar_agent
    assert agent is not None
    assert wait_for(lambda: agent.job_id is not None)
    jobs = sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs
    assert [j.name for j in jobs] == ["early"]
    assert [int(i) for b in loader for i in b] == list(range(64))  # iterating starts nothing new
    assert agent.job_id == jobs[0].job_id
    agent.stop()
    assert wait_for(lambda: not sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs)


def test_a_loader_created_before_a_fork_iterates_in_the_child(sidecar: Sidecar) -> None:
    """The agent starts with the loader; a process forked after that (``ddp_fork``, a
    notebook launcher) and iterating the loader runs its own agent, a job of its own."""
    code = f"""
import os, sys, time
import dloader
loader = dloader.DataLoader(range(40), batch_size=8, sidecar="unix://{sidecar.socket}",
                            job_name="parent")
pid = os.fork()
if pid == 0:
    loader.sidecar_agent.name = "child"
    got = [int(i) for b in loader for i in b]
    deadline = time.monotonic() + 30
    while loader.sidecar_agent.job_id is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ok = got == list(range(40)) and loader.sidecar_agent.job_id is not None
    loader.sidecar_agent.stop()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
loader.sidecar_agent.stop()
sys.exit(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_training_is_unaffected_without_a_sidecar(tmp_path: Path) -> None:
    loader = dloader.DataLoader(
        D.Range(200), batch_size=10, num_workers=1, sidecar=f"unix://{tmp_path}/nobody-here.sock"
    )
    start = time.monotonic()
    assert [int(i) for b in loader for i in b] == list(range(200))
    assert time.monotonic() - start < 5
    assert loader.sidecar_agent is not None and not loader.sidecar_agent.connected.is_set()
    loader.sidecar_agent.stop()


def test_env_variable_selects_the_sidecar(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DLOADER_SIDECAR", f"unix://{tmp_path}/x.sock")
    loader = dloader.DataLoader(D.Range(4))
    assert loader.sidecar_agent is not None
    assert loader.sidecar_agent.target == f"unix:///{str(tmp_path).lstrip('/')}/x.sock"
    monkeypatch.setenv("DLOADER_SIDECAR", "not a target")
    with pytest.raises(ValueError, match="sidecar target 'not a target'"):
        dloader.DataLoader(D.Range(4))


def test_sidecar_killed_and_restarted(tmp_path: Path) -> None:
    sock, state = str(tmp_path / "s.sock"), str(tmp_path / "state")
    cmd = [
        sys.executable,
        "-m",
        "dloader.sidecar.cli",
        "--socket",
        sock,
        "--state-dir",
        state,
        "--period",
        "0.2",
        "--policy",
        "even",
        "--worker-budget",
        "2",
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    daemon = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        loader = dloader.DataLoader(
            D.Range(10**6), batch_size=4, num_workers=1, sidecar=f"unix://{sock}"
        )
        it = iter(loader)
        agent = loader.sidecar_agent
        assert agent is not None
        assert wait_for(lambda: next(it) is not None and agent.connected.is_set(), 20)
        job_id = agent.job_id
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        # Training keeps going while the sidecar is dead.
        for _ in range(200):
            next(it)
        assert wait_for(lambda: next(it) is not None and not agent.connected.is_set(), 10)
        daemon = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: next(it) is not None and agent.connected.is_set(), 30)
        assert agent.job_id == job_id  # restored from SQLite: the same job
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            jobs = pb_grpc.NodeServiceStub(ch).ListJobs(pb.ListJobsRequest(), timeout=5).jobs
        assert [j.job_id for j in jobs] == [job_id]
        it.close()
        agent.stop()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_pinned_cpu_sets_reach_the_loader_workers(tmp_path: Path) -> None:
    s = Sidecar(tmp_path, "--pin-cpus", "--cpu-budget", "2")
    try:
        loaders = [
            dloader.DataLoader(
                D.Range(10**6, sleep_s=0.0005),
                batch_size=8,
                num_workers=1,
                min_workers=1,
                max_workers=1,
                sidecar=f"unix://{s.socket}",
                job_name=f"pinned-{i}",
                multiprocessing_context=FORK_SAFE,
            )
            for i in range(2)
        ]
        its = [iter(x) for x in loaders]

        def pinned() -> list[set[int]]:
            for it in its:
                next(it)
            return [
                os.sched_getaffinity(w.pid) for x in loaders for w in x.stats().workers if w.pid
            ]

        assert wait_for(lambda: len(sets := pinned()) == 2 and all(len(c) == 1 for c in sets))
        a, b = pinned()
        assert not a & b  # each job's workers on their own CPU
        status = s.stub.GetNodeStatus(pb.GetNodeStatusRequest(), timeout=5)
        assert status.cpu_enforcement.startswith("CPU sets: on")
        for it in its:
            it.close()
        for x in loaders:
            assert x.sidecar_agent is not None
            x.sidecar_agent.stop()
    finally:
        s.stop()


@contextlib.contextmanager
def training_beside(s: Sidecar, num_workers: int) -> Iterator[tuple[Any, Iterator[Any]]]:
    """A real loader of ``num_workers`` on sidecar ``s``, iterating; closed and its agent
    stopped after."""
    loader = dloader.DataLoader(
        D.Range(10**6, sleep_s=0.0005),
        batch_size=8,
        num_workers=num_workers,
        sidecar=f"unix://{s.socket}",
        multiprocessing_context=FORK_SAFE,
    )
    it = iter(loader)
    yield loader, it
    it.close()  # type: ignore[attr-defined]
    assert loader.sidecar_agent is not None
    loader.sidecar_agent.stop()


def test_the_sidecar_nices_the_workers_and_never_the_trainer(tmp_path: Path) -> None:
    """A real sidecar (``--worker-nice 7``) and a real loader: its worker processes end at
    nice 7 (every thread), its training process where it was."""
    s = Sidecar(tmp_path, "--worker-nice", "7", "--policy", "even", "--worker-budget", "2")
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        with training_beside(s, 2) as (loader, it):

            def niced() -> bool:
                next(it)  # training goes on while the directive arrives
                pids = [w.pid for w in loader.stats().workers if w.pid]
                return len(pids) == 2 and all(
                    os.getpriority(os.PRIO_PROCESS, int(t)) == max(base, 7)
                    for p in pids
                    for t in os.listdir(f"/proc/{p}/task")
                )

            assert wait_for(niced, 30)
            assert os.getpriority(os.PRIO_PROCESS, 0) == base
    finally:
        s.stop()


def test_guided_the_loader_tunes_itself_under_the_sidecars_ceiling_until_the_policy_changes(
    tmp_path: Path,
) -> None:
    """A real sidecar with the guided policy: a loader that asked for a fixed count starts its
    own tuner, searching within the sidecar's ceiling (the even split of the worker budget);
    switched to another policy, the sidecar sets the count again and the tuner is gone."""
    s = Sidecar(tmp_path, "--policy", "guided", "--worker-budget", "3")
    try:
        with training_beside(s, 1) as (loader, it):

            def tuning() -> bool:
                next(it)  # training goes on while the directive arrives
                t = loader.autotuner
                return t is not None and t.tuner.maximum == 3

            assert wait_for(tuning, 30)
            assert loader.stats().tuner.startswith("auto:")
            s.stub.SetPolicy(
                pb.SetPolicyRequest(config=pb.PolicyConfig(name="even", worker_budget=2)),
                timeout=5,
            )
            assert wait_for(lambda: next(it) is not None and loader.autotuner is None, 30)
            assert wait_for(lambda: next(it) is not None and loader.num_workers == 2, 30)
    finally:
        s.stop()


def test_cpu_sets_stay_within_the_jobs_own_allocation(tmp_path: Path) -> None:
    import subprocess
    from types import SimpleNamespace

    from dloader._agent.agent import SidecarAgent

    loader = dloader.DataLoader(D.Range(8), batch_size=2)
    agent = SidecarAgent(loader, f"unix://{tmp_path}/none.sock")
    child = subprocess.Popen(["sleep", "30"])
    try:
        mine = sorted(os.sched_getaffinity(0))
        agent._cpus = [10_000]  # outside the job's allocation (e.g. another Slurm job's CPUs)
        agent._enforce_cpus([SimpleNamespace(pid=child.pid, remote=False)])
        assert sorted(os.sched_getaffinity(child.pid)) == mine  # left alone
        agent._cpus = [mine[0], 10_000]
        # a remote worker's pid numbers a process of another machine: never this one's
        agent._enforce_cpus([SimpleNamespace(pid=child.pid, remote=True)])
        assert sorted(os.sched_getaffinity(child.pid)) == mine
        agent._enforce_cpus([SimpleNamespace(pid=child.pid, remote=False)])
        assert sorted(os.sched_getaffinity(child.pid)) == [mine[0]]  # only the allowed part
    finally:
        child.kill()
        child.wait()


def test_directed_nice_reaches_every_thread_of_local_workers_and_only_goes_up(
    tmp_path: Path,
) -> None:
    import subprocess
    from types import SimpleNamespace

    from dloader._agent.agent import SidecarAgent
    from dloader._shared.node_messages import Directive

    # the loader's side of a directive, as the agent sees it (it resizes, always in time)
    controls = SimpleNamespace(resize=lambda n: True, tune=lambda up_to: False)
    agent = SidecarAgent(controls, f"unix://{tmp_path}/none.sock")
    # a worker stand-in with a second thread (a worker's own threads are niced too)
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start()"
    child = subprocess.Popen([sys.executable, "-c", code + "; time.sleep(30)"])
    remote = subprocess.Popen(["sleep", "30"])
    tasks = f"/proc/{child.pid}/task"

    def nices(pid: int) -> set[int]:
        return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}

    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(tasks)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(os.listdir(tasks)) == 2
        base = os.getpriority(os.PRIO_PROCESS, 0)
        workers = [
            SimpleNamespace(pid=child.pid, remote=False),
            SimpleNamespace(pid=remote.pid, remote=True),
        ]
        agent._enforce_nice(workers)
        assert nices(child.pid) == {base}  # no directive yet: left alone
        agent._apply(Directive(0, worker_nice=min(base + 5, 19)))
        agent._enforce_nice(workers)
        assert nices(child.pid) == {min(base + 5, 19)}
        assert nices(remote.pid) == {base}  # a remote worker's pid is another machine's
        agent._apply(Directive(0, worker_nice=min(base + 2, 19)))
        agent._enforce_nice(workers)  # lowering is not asked of the kernel
        assert nices(child.pid) == {min(base + 5, 19)}
    finally:
        for p in (child, remote):
            p.kill()
            p.wait()


@pytest.mark.parametrize("nice", [0, 20, -3])
def test_a_directive_with_a_nice_value_out_of_range_is_refused(nice: int) -> None:
    from dloader._shared.node_messages import Directive

    with pytest.raises(ValueError, match=f"worker_nice={nice}: expected 1..19"):
        Directive(2, worker_nice=nice)
