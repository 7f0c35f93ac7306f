"""The CPU pool and lent cores, live: one allocator, two sidecars, and a real Ray cluster whose
second node is pinned to the other core.

The pool: a GPU node of one core, and a CPU-only node whose cores join the pool. A CPU-starved
emulated job (3 ms of CPU a sample, an accelerator step that takes 800 samples/s) on the
one-core GPU node: the allocator gives it the pool's cores, its node's sidecar directs its
loader to that many remote workers, and its throughput rises. A second such job arrives: the
allocator shares the pool between them, and the sidecar moves the first job's remote workers
down to its share.

Lent cores (``goodput-dp-lend``): two GPU nodes of one core each, the starved job on one and a
job that needs almost no cores on the other: the allocator lends the other node's spare core,
the starved job's sidecar starts a remote worker there (on the Ray node that advertises
``dloader_node:<id>``), and the lending node's sidecar divides what it keeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from dloader._engine.remote import node_resource
from dloader._shared.allocator_messages import job_key
from dloader.apps.experiment import sidecar_process
from dloader.apps.raycluster import LocalRayCluster
from dloader.v1 import allocator_pb2 as pb
from tests.allocator.test_service import Allocator, by_job, until

pytest.importorskip("ray", reason="remote workers need Ray (dloader-elastic[ray])")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

CPUS = sorted(os.sched_getaffinity(0))[:2]
SCALING = pb.ScalingParams(alpha_c=0.008, beta_c=0.001, gamma=1.0)  # 32 / 40 ms: 800/s
RUN_S = 75.0
POOL_AT = 12.0  # the pool's node joins
SECOND_AT = 45.0  # the second job arrives


def _submit(alloc: Allocator, job_id: str, per_core: float = 333.0) -> str:
    spec = pb.JobSpec(job_id=job_id, batch_size=32, max_gpus=1, scaling=SCALING)
    spec.input_curve.add(cores=1.0, samples_per_second=per_core)  # 333: 3 ms of CPU a sample
    return job_key(alloc.stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=5).token)


def _start(job_id: str, key: str, sidecar: str, ray: str, out: Path, seconds: float, cpu: int = 0):  # type: ignore[no-untyped-def]
    cmd = [
        sys.executable, "-m", "dloader.apps.testbed", "--profile", "cpu_heavy",
        "--workers", "1", "--seconds", str(seconds), "--sidecar", sidecar,
        "--job-name", job_id, "--out", str(out), "--parent", str(os.getpid()),
        "--ray-address", ray, "--remote-max", "2", "--remote-resource", "pool",
    ]  # fmt: skip
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(
            cmd, env={**os.environ, "DLOADER_JOB_KEY": key}, stdout=subprocess.DEVNULL, stderr=log
        )
    os.sched_setaffinity(proc.pid, {CPUS[cpu]})  # its GPU node's one core
    return proc


def _registered(folder: Path, *nodes: str) -> None:
    """Waits until the sidecars of ``nodes`` (their folders under ``folder``) registered."""
    end = time.monotonic() + 60
    while not all("registered node" in (folder / n / "sidecar.log").read_text() for n in nodes):
        assert time.monotonic() < end, f"the sidecars of {nodes} did not register"
        time.sleep(0.2)


def _rate(timeline: list[list[float]], a: float, b: float) -> float:
    """Samples/s a job's timeline (rows of time, samples, ...) delivered over ``[a, b)``."""
    return sum(n for t, n, *_ in timeline if a <= t < b) / (b - a)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs: the GPU node's and the pool's")
def test_a_starved_job_gets_the_pool_and_the_allocator_shares_it(tmp_path: Path) -> None:
    with ExitStack() as stack:
        ray = stack.enter_context(LocalRayCluster([CPUS[0]], log=tmp_path / "ray.log"))
        ray.add_node("pool", 2, [CPUS[1]], {"pool": 2.0})
        alloc = Allocator(tmp_path / "allocator")
        stack.callback(alloc.stop)
        target = f"unix://{alloc.socket}"
        gpu_node = stack.enter_context(
            sidecar_process(
                tmp_path / "A", policy="adaptive", worker_budget=4, period_s=1.0,
                extra=["--cpu-budget", "1", "--allocator", target, "--node-id", "A",
                       "--gpus", "2"],
                cpus={CPUS[0]},
            )
        )  # fmt: skip
        _registered(tmp_path, "A")
        started = time.monotonic()
        first = _start(
            "first", _submit(alloc, "first"), gpu_node.target, ray.address,
            tmp_path / "first.json", RUN_S,
        )  # fmt: skip
        stack.callback(first.kill)
        time.sleep(POOL_AT)  # its node's core alone first: what the pool adds is measured
        stack.enter_context(
            sidecar_process(
                tmp_path / "P", policy="adaptive", worker_budget=4, period_s=1.0,
                extra=["--cpu-budget", "2", "--allocator", target, "--node-id", "P",
                       "--cpu-pool"],
                cpus={CPUS[1]},
            )
        )  # fmt: skip
        _registered(tmp_path, "P")
        alone = until(
            alloc.stub,
            lambda s: by_job(s).get("first", pb.Allocation()).remote_cpus > 1.5,
            timeout=60,
        )
        assert by_job(alone)["first"].nodes[0].node_id == "A"
        time.sleep(max(started + SECOND_AT - time.monotonic(), 0.0))
        second = _start(
            "second", _submit(alloc, "second"), gpu_node.target, ray.address,
            tmp_path / "second.json", RUN_S - SECOND_AT,
        )  # fmt: skip
        stack.callback(second.kill)
        shared = until(
            alloc.stub,
            lambda s: all(
                0 < by_job(s).get(j, pb.Allocation()).remote_cpus < 1.5 for j in ("first", "second")
            ),
            timeout=60,
        )
        assert sum(a.remote_cpus for a in shared.allocations) <= 2.0 + 1e-6
        assert first.wait(timeout=RUN_S + 120) == 0
        assert second.wait(timeout=RUN_S + 120) == 0
    run = json.loads((tmp_path / "first.json").read_text())
    timeline, remote = run["timeline"], run["remote_workers"]
    assert 2 in remote and remote[-1] == 1, sorted(set(remote))  # 0 -> 2 (the pool) -> 1 (shared)
    t_two = next(t for (t, *_), r in zip(timeline, remote, strict=True) if r == 2)

    before = _rate(timeline, 3.0, POOL_AT)  # its node's one core, before the pool joined
    with_pool = _rate(timeline, t_two + 12.0, min(SECOND_AT, RUN_S))  # two remote workers up
    print(f"first job: {before:.0f} samples/s on its node's core, {with_pool:.0f} with 2 remote")
    assert with_pool > 1.3 * before, (before, with_pool)
    second_run = json.loads((tmp_path / "second.json").read_text())
    assert 1 in second_run["remote_workers"]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs: one for each GPU node")
def test_a_starved_job_gets_a_light_nodes_spare_core_as_a_remote_worker_there(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        ray = stack.enter_context(LocalRayCluster([CPUS[0]], log=tmp_path / "ray.log"))
        alloc = Allocator(tmp_path / "allocator", "--policy", "goodput-dp-lend")
        stack.callback(alloc.stop)
        target = f"unix://{alloc.socket}"
        sidecars = {}
        for i, node in enumerate("AB"):
            sidecars[node] = stack.enter_context(
                sidecar_process(
                    tmp_path / node, policy="adaptive", worker_budget=4, period_s=1.0,
                    extra=["--cpu-budget", "1", "--allocator", target, "--node-id", node,
                           "--gpus", "1", "--lend-cores"],
                    cpus={CPUS[i]},
                )
            )  # fmt: skip
        _registered(tmp_path, "A", "B")
        key = _submit(alloc, "starved")
        placed = until(alloc.stub, lambda s: by_job(s).get("starved", pb.Allocation()).gpus > 0)
        home = by_job(placed)["starved"].nodes[0].node_id
        lender = "B" if home == "A" else "A"
        _submit(alloc, "light", per_core=1e6)  # holds the other GPU, needs almost no cores
        ray.add_node(lender, 1, [CPUS["AB".index(lender)]], {node_resource(lender): 1.0})
        job = _start(
            "starved", key, sidecars[home].target, ray.address, tmp_path / "starved.json",
            RUN_S, cpu="AB".index(home),
        )  # fmt: skip
        stack.callback(job.kill)
        lent = until(
            alloc.stub,
            lambda s: by_job(s).get("starved", pb.Allocation()).lent_cpus.get(lender, 0) > 0.5,
            timeout=60,
        )
        assert by_job(lent)["light"].nodes[0].node_id == lender
        assert job.wait(timeout=RUN_S + 120) == 0
        lending_log = (tmp_path / lender / "sidecar.log").read_text()
    assert "cores lent to other nodes' jobs" in lending_log
    run = json.loads((tmp_path / "starved.json").read_text())
    timeline, remote = run["timeline"], run["remote_workers"]
    assert remote[-1] == 1, sorted(set(remote))  # its lent core, as one remote worker
    t_one = next(t for (t, *_), r in zip(timeline, remote, strict=True) if r == 1)
    before = _rate(timeline, 3.0, t_one)
    lent_rate = _rate(timeline, t_one + 12.0, RUN_S)
    print(f"starved job: {before:.0f} samples/s on its node's core, {lent_rate:.0f} with one lent")
    assert lent_rate > 1.3 * before, (before, lent_rate)
