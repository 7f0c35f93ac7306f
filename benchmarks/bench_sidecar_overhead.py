"""Sidecar overhead: its CPU use with N jobs reporting once a second, and report RPC latency.

A real ``dloader-sidecar`` process (adaptive policy) serves ``--jobs`` clients; each registers
and streams one report per second (with 8 workers' figures, like a real loader) for
``--seconds``. Measured: the daemon's CPU time over the run as a share of one core (target
< 2% at 10 jobs), and the latency of a one-report ``Report`` call on the Unix socket (p50/p99).

    python -m benchmarks.bench_sidecar_overhead            # ~40 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil

from benchmarks._common import machine, out_path, table
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from sidecar.experiment import sidecar_process


def report(job: pb.RegisterJobResponse, t: float) -> pb.JobReport:
    return pb.JobReport(
        job_id=job.job_id,
        token=job.token,
        timestamp=time.time(),
        num_workers=8,
        batch_size=32,
        samples_per_second=900 + 50 * (t % 3),
        idle_share=0.3,
        step_seconds=0.035,
        wait_seconds=1.5,
        window_seconds=5.0,
        samples=int(t * 900),
        workers=[
            pb.WorkerReport(pid=os.getpid(), fetch_seconds=0.27, cpu_seconds=0.01, batches=100)
            for _ in range(8)
        ],
    )


def client(stub: pb_grpc.NodeServiceStub, seconds: float, stop: threading.Event) -> None:
    job = stub.RegisterJob(
        pb.RegisterJobRequest(name="load", pids=[os.getpid()], num_workers=8, batch_size=32),
        timeout=5,
    )
    start = time.monotonic()

    def stream():  # one report per second, like a loader's agent
        while not stop.is_set() and time.monotonic() - start < seconds:
            yield report(job, time.monotonic() - start)
            stop.wait(1.0)

    stub.Report(stream(), timeout=seconds + 30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_sidecar_overhead", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--latency-calls", type=int, default=500)
    args = p.parse_args(argv)
    if args.jobs < 1 or args.seconds < 5:
        p.error("--jobs must be >= 1 and --seconds >= 5")
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    with sidecar_process(tmp, policy="adaptive", worker_budget=64, log_level="WARNING") as sc:
        channel = grpc.insecure_channel(sc.target)
        grpc.channel_ready_future(channel).result(timeout=20)
        stub = pb_grpc.NodeServiceStub(channel)
        proc = psutil.Process(sc.pid)
        time.sleep(1.0)
        cpu0, t0 = proc.cpu_times(), time.monotonic()
        stop = threading.Event()
        threads = [
            threading.Thread(target=client, args=(stub, args.seconds, stop))
            for _ in range(args.jobs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu1, t1 = proc.cpu_times(), time.monotonic()
        share = ((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)) / (t1 - t0)
        job = stub.RegisterJob(
            pb.RegisterJobRequest(name="probe", pids=[os.getpid()], num_workers=8, batch_size=32),
            timeout=5,
        )
        lat = []
        for i in range(args.latency_calls):
            s = time.perf_counter()
            stub.Report(iter([report(job, float(i))]), timeout=5)
            lat.append((time.perf_counter() - s) * 1000)
        lat.sort()
        p50 = statistics.median(lat)
        p99 = lat[int(0.99 * (len(lat) - 1))]
    print(
        table(
            [
                "jobs",
                "reports/s",
                "sidecar CPU (% of one core)",
                "Report RPC p50 ms",
                "Report RPC p99 ms",
            ],
            [[args.jobs, args.jobs, 100 * share, p50, p99]],
        )
    )
    print(
        f"target: < 2% of one core at 10 jobs x 1 report/s -> "
        f"{'met' if share < 0.02 else 'NOT met'}"
    )
    out_path("bench_sidecar_overhead.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "jobs": args.jobs,
                "cpu_share": share,
                "p50_ms": p50,
                "p99_ms": p99,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
