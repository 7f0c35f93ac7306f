"""The two deciders together, for real: one allocator, two sidecars standing for two nodes of
two GPUs and one core each (each sidecar and the jobs placed on its node pinned to a core of
their own), four emulated jobs (two CPU-hungry, two CPU-light) run where the allocator puts
them, with their loaders in the node's sidecar.

The CPU-aware ``goodput-dp`` places each hungry job beside a light one; the sidecars take the
allocator's cores as their prior; the jobs' aggregate throughput beats the CPU-blind placement
(the two hungry jobs side by side on one core) in the same test."""

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
from dloader.apps.experiment import score, sidecar_process
from dloader.v1 import allocator_pb2 as pb
from tests.allocator.test_service import Allocator, by_job, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]  # 53 s in CI

CPUS = sorted(os.sched_getaffinity(0))[:2]
#: (profile, scaling: its emulated step, input curve: samples/s on one core)
JOBS = {
    "a-hungry": ("cpu_heavy", pb.ScalingParams(alpha_c=0.008, beta_c=0.001, gamma=1.0), 333.0),
    "b-hungry": ("cpu_heavy", pb.ScalingParams(alpha_c=0.008, beta_c=0.001, gamma=1.0), 333.0),
    "c-light": ("gpu_bound", pb.ScalingParams(alpha_c=0.04, beta_c=0.005, gamma=1.0), 2000.0),
    "d-light": ("gpu_bound", pb.ScalingParams(alpha_c=0.04, beta_c=0.005, gamma=1.0), 2000.0),
}
RUN_S = 14.0
WINDOW = (5.0, 13.0)  # scored: after the sidecars' first decisions


def _start(cmd: list[str], cpu: int, **kw: object) -> subprocess.Popen[bytes]:
    """``cmd`` started and pinned to ``cpu`` (its children inherit it): a node of one core.
    (Pinned from here, not in a ``preexec_fn``: that is unsafe in a process with threads.)"""
    proc = subprocess.Popen(cmd, **kw)  # type: ignore[call-overload]
    os.sched_setaffinity(proc.pid, {cpu})
    return proc


def _run(tmp: Path, policy: str) -> tuple[dict[str, str], dict[str, float], str]:
    """Places the four jobs under ``policy`` and runs them: their nodes, samples/s, the logs."""
    alloc = Allocator(tmp / "allocator", "--policy", policy)
    with ExitStack() as stack:
        stack.callback(alloc.stop)
        target = f"unix://{alloc.socket}"
        socks = {
            node: stack.enter_context(
                sidecar_process(
                    tmp / node,
                    policy="adaptive",
                    worker_budget=4,
                    period_s=1.0,
                    extra=[
                        "--cpu-budget",
                        "1",
                        "--allocator",
                        target,
                        "--node-id",
                        node,
                        "--gpus",
                        "2",
                    ],
                    cpus={cpu},
                )
            ).target
            for node, cpu in zip(("A", "B"), CPUS, strict=True)
        }
        end = time.monotonic() + 30  # both nodes registered before any job is placed
        while not all("registered node" in (tmp / n / "sidecar.log").read_text() for n in socks):
            assert time.monotonic() < end, "the sidecars did not register with the allocator"
            time.sleep(0.1)
        keys = {}  # what dloader-launch would export: ties each job's loader to its allocation
        for job_id, (_, scaling, per_core) in JOBS.items():
            spec = pb.JobSpec(job_id=job_id, batch_size=32, max_gpus=1, scaling=scaling)
            spec.input_curve.add(cores=1.0, samples_per_second=per_core)
            token = alloc.stub.SubmitJob(pb.SubmitJobRequest(job=spec), timeout=5).token
            keys[job_id] = job_key(token)
        snap = until(
            alloc.stub,
            lambda s: len(s.allocations) == 4 and all(a.gpus == 1 for a in s.allocations),
            timeout=20,
        )
        nodes = {j: a.nodes[0].node_id for j, a in by_job(snap).items()}
        procs, outs = [], {}
        for job_id, (profile, _, _) in JOBS.items():
            node = nodes[job_id]
            outs[job_id] = tmp / f"{job_id}.json"
            cmd = [
                sys.executable, "-m", "dloader.apps.testbed", "--profile", profile,
                "--workers", "2", "--seconds", str(RUN_S), "--sidecar", socks[node],
                "--job-name", job_id, "--out", str(outs[job_id]), "--parent", str(os.getpid()),
            ]  # fmt: skip
            cpu = CPUS[0] if node == "A" else CPUS[1]
            procs.append(
                _start(
                    cmd,
                    cpu,
                    env={**os.environ, "DLOADER_JOB_KEY": keys[job_id]},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for p in procs:
            assert p.wait(timeout=120) == 0, p.args
        results = {j: json.loads(path.read_text()) for j, path in outs.items()}
    logs = "".join((tmp / n / "sidecar.log").read_text() for n in ("A", "B"))
    _, per = score(results, *WINDOW)
    return nodes, {j: p["samples_per_s"] for j, p in per.items()}, logs


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs: one for each emulated node")
def test_the_allocator_places_cpu_hungry_jobs_beside_light_ones_and_throughput_rises(
    tmp_path: Path,
) -> None:
    aware_nodes, aware, logs = _run(tmp_path / "aware", "goodput-dp")
    blind_nodes, blind, _ = _run(tmp_path / "blind", "goodput-dp-cpu-blind")
    assert aware_nodes["a-hungry"] != aware_nodes["b-hungry"]  # each beside a light one
    assert blind_nodes["a-hungry"] == blind_nodes["b-hungry"]  # by GPUs alone: together
    assert "the allocator's target" in logs  # the sidecars took the cores as their prior
    total_aware, total_blind = sum(aware.values()), sum(blind.values())
    print(f"samples/s: CPU-aware {aware} = {total_aware:.0f}; blind {blind} = {total_blind:.0f}")
    assert total_aware > 1.15 * total_blind
