"""The CPU pool, live: one allocator, two sidecars (a GPU node of one core, and a CPU-only node
whose cores join the pool), and a real Ray cluster whose pool node is pinned to the other core.

A CPU-starved emulated job (3 ms of CPU a sample, an accelerator step that takes 800 samples/s)
on the one-core GPU node: the allocator gives it the pool's cores, its node's sidecar directs its
loader to that many remote workers, and its throughput rises. A second such job arrives: the
allocator shares the pool between them, and the sidecar moves the first job's remote workers
down to its share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

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
SECOND_AT = 40.0  # the second job arrives


def _submit(alloc: Allocator, job_id: str) -> str:
    spec = pb.JobSpec(job_id=job_id, batch_size=32, max_gpus=1, scaling=SCALING)
    spec.input_curve.add(cores=1.0, samples_per_second=333.0)  # 3 ms of CPU a sample
    return job_key(alloc.stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=5).token)


def _start(job_id: str, key: str, sidecar: str, ray: str, out: Path, seconds: float):  # type: ignore[no-untyped-def]
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
    os.sched_setaffinity(proc.pid, {CPUS[0]})  # the GPU node's one core
    return proc


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
        stack.enter_context(
            sidecar_process(
                tmp_path / "P", policy="adaptive", worker_budget=4, period_s=1.0,
                extra=["--cpu-budget", "2", "--allocator", target, "--node-id", "P",
                       "--cpu-pool"],
                cpus={CPUS[1]},
            )
        )  # fmt: skip
        end = time.monotonic() + 60
        while not all(
            "registered node" in (tmp_path / n / "sidecar.log").read_text() for n in "AP"
        ):
            assert time.monotonic() < end, "the sidecars did not register with the allocator"
            time.sleep(0.2)
        started = time.monotonic()
        first = _start(
            "first", _submit(alloc, "first"), gpu_node.target, ray.address,
            tmp_path / "first.json", RUN_S,
        )  # fmt: skip
        stack.callback(first.kill)
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

    def rate(a: float, b: float) -> float:
        rows = [(t, n) for t, n, *_ in timeline if a <= t < b]
        return sum(n for _, n in rows) / (b - a)

    before = rate(3.0, t_two)  # the node's one core (its remote workers not yet asked for)
    with_pool = rate(t_two + 12.0, min(SECOND_AT, RUN_S))  # two remote workers up
    print(f"first job: {before:.0f} samples/s on its node's core, {with_pool:.0f} with 2 remote")
    assert with_pool > 1.3 * before, (before, with_pool)
    second_run = json.loads((tmp_path / "second.json").read_text())
    assert 1 in second_run["remote_workers"]
