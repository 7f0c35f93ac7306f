"""Sidecar overhead: its CPU use with N jobs reporting once a second, and report RPC latency.

A real ``dloader-sidecar`` process (adaptive policy) serves ``--jobs`` clients that behave like
loaders' agents: each registers a real process tree (a shell with 8 sleeping children, which
the process monitor walks), watches its directives and applies them, and streams one report
per second for ``--seconds``. A report carries the directed worker count, its workers' figures
and a throughput from a saturating curve (so the sidecar explores, refits its models and
re-decides as it does for real jobs). Measured: the daemon's CPU time over the run as a share
of one core (targets: < 2% at 10 jobs, < 5% at 50), the number of model updates it made, and
the latency of a one-report ``Report`` call on the Unix socket (p50/p99).

    python -m benchmarks.sidecar.bench_sidecar_overhead            # ~75 s
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.sidecar import plots
from dloader.apps.experiment import sidecar_process
from dloader.sidecar.store import SidecarStore
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

CHILDREN = 8  # sleeping processes under each job's registered PID
PER_WORKER = 95.0  # samples/s one worker delivers (the jobs saturate at 1,500 near 16)
TARGETS = {10: 0.02, 50: 0.05}  # jobs -> the most of one core the sidecar may use


def target(jobs: int) -> float | None:
    """The target for ``jobs`` jobs: that of the smallest job count with one at or above it."""
    return next((TARGETS[n] for n in sorted(TARGETS) if jobs <= n), None)


def report(job: pb.RegisterJobResponse, t: float, workers: int, rng: random.Random) -> pb.JobReport:
    """A loader's report at ``workers`` workers: saturating at 1,500 samples/s near 16."""
    tput = min(1500.0, PER_WORKER * max(workers, 1)) * rng.uniform(0.95, 1.05)
    return pb.JobReport(
        job_id=job.job_id,
        token=job.token,
        timestamp=time.time(),
        num_workers=workers,
        batch_size=32,
        samples_per_second=tput,
        idle_share=max(0.0, 1.0 - tput / 1600.0),
        step_seconds=32 / tput,
        wait_seconds=2.0 * max(0.0, 1.0 - tput / 1600.0),
        window_seconds=2.0,
        samples=int(t * tput),
        workers=[
            # a worker's time per batch agrees with its rate, as a real loader's does
            pb.WorkerReport(
                pid=os.getpid(), fetch_seconds=32 / PER_WORKER, cpu_seconds=0.01, batches=20
            )
            for _ in range(workers)
        ],
    )


def client(
    stub: pb_grpc.NodeServiceStub, seconds: float, stop: threading.Event, pid: int, seed: int
) -> None:
    job = stub.RegisterJob(
        pb.RegisterJobRequest(name=f"load{seed}", pids=[pid], num_workers=4, batch_size=32),
        timeout=5,
    )
    workers = [4]
    watch = stub.WatchDirectives(pb.WatchDirectivesRequest(job_id=job.job_id, token=job.token))

    def follow() -> None:  # apply directives as the agent does
        with contextlib.suppress(grpc.RpcError):
            for d in watch:
                workers[0] = d.num_workers

    threading.Thread(target=follow, daemon=True).start()
    rng = random.Random(seed)
    start = time.monotonic()

    def stream():  # one report per second, like a loader's agent
        while not stop.is_set() and time.monotonic() - start < seconds:
            yield report(job, time.monotonic() - start, workers[0], rng)
            stop.wait(1.0)

    stub.Report(stream(), timeout=seconds + 30)
    watch.cancel()


def process_tree() -> subprocess.Popen[bytes]:
    """A shell with ``CHILDREN`` sleeping children: a stand-in for a loader's process tree."""
    return subprocess.Popen(
        ["bash", "-c", f"for i in $(seq {CHILDREN}); do sleep 3600 & done; wait"],
        start_new_session=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sidecar.bench_sidecar_overhead",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--jobs", type=int, default=10, help="concurrent jobs (default: %(default)s)")
    p.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="how long the jobs report; the first half is their arrival and exploration, the "
        "second half the steady state (default: %(default)s)",
    )
    p.add_argument("--latency-calls", type=int, default=500)
    add_out_dir(p)
    args = p.parse_args(argv)
    if args.jobs < 1 or args.seconds < 10:
        p.error("--jobs must be >= 1 and --seconds >= 10")
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    with sidecar_process(tmp, policy="adaptive", worker_budget=64, log_level="WARNING") as sc:
        channel = grpc.insecure_channel(sc.target)
        grpc.channel_ready_future(channel).result(timeout=20)
        stub = pb_grpc.NodeServiceStub(channel)
        proc = psutil.Process(sc.pid)
        trees = [process_tree() for _ in range(args.jobs)]
        try:
            time.sleep(1.0)
            stop = threading.Event()
            threads = [
                threading.Thread(target=client, args=(stub, args.seconds, stop, tree.pid, i))
                for i, tree in enumerate(trees)
            ]
            t0 = time.monotonic()
            cpu = [(0.0, sum(proc.cpu_times()[:2]))]  # (seconds, the daemon's CPU seconds)
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                time.sleep(1.0)
                cpu.append((time.monotonic() - t0, sum(proc.cpu_times()[:2])))
        finally:
            for tree in trees:
                os.killpg(tree.pid, signal.SIGKILL)
                tree.wait()
        job_ids = [j.job_id for j in stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs]
        job = stub.RegisterJob(
            pb.RegisterJobRequest(name="probe", pids=[os.getpid()], num_workers=8, batch_size=32),
            timeout=5,
        )
        lat, rng = [], random.Random(0)
        for i in range(args.latency_calls):
            s = time.perf_counter()
            stub.Report(iter([report(job, float(i), 8, rng)]), timeout=5)
            lat.append((time.perf_counter() - s) * 1000)
        lat.sort()
        p50 = statistics.median(lat)
        p99 = lat[int(0.99 * (len(lat) - 1))]
    store = SidecarStore(tmp / "state" / "sidecar.db")  # the models the sidecar saved on shutdown
    models = [store.load_model(j) or {} for j in job_ids]
    store.close()
    updates = sum(len(m.get("observations", [])) for m in models)

    def share(a: tuple[float, float], b: tuple[float, float]) -> float:
        """CPU seconds per second between two samples."""
        return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)

    split = args.seconds / 2
    # the halves meet at one sample (the last before the split), so none of the run falls
    # between them however late the sampling loop ran
    mid = max((x for x in cpu if x[0] <= split), key=lambda x: x[0])
    windows = {
        "whole run": share(cpu[0], cpu[-1]),
        "first half (arrivals, exploration)": share(cpu[0], mid),
        "second half (steady)": share(mid, cpu[-1]),
    }
    print(
        table(
            ["jobs", "reports/s", "window", "sidecar CPU (% of one core)"],
            [[args.jobs, args.jobs, name, 100 * v] for name, v in windows.items()],
        )
    )
    print(table(["model updates", "Report RPC p50 ms", "Report RPC p99 ms"], [[updates, p50, p99]]))
    steady = windows["second half (steady)"]
    whole = windows["whole run"]
    goal = target(args.jobs)
    if goal is None:
        print(f"no target stated beyond {max(TARGETS)} jobs")
    else:
        print(
            f"target: < {goal:.0%} of one core at {args.jobs} jobs x 1 report/s -> steady state "
            f"{'met' if steady < goal else 'NOT met'}, whole run "
            f"{'met' if whole < goal else 'NOT met'}"
        )
    rates = [(tb, (cb - ca) / max(tb - ta, 1e-9)) for (ta, ca), (tb, cb) in itertools.pairwise(cpu)]
    outs = outputs(args.out_dir)
    plots.overhead(rates, split, goal, outs("bench_sidecar_overhead.png"))
    outs("bench_sidecar_overhead.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "jobs": args.jobs,
                "cpu_share": windows,
                "model_updates": updates,
                "p50_ms": p50,
                "p99_ms": p99,
                "cpu_trace": cpu,
            },
            indent=1,
        )
    )
    print(f"wrote {outs('bench_sidecar_overhead.json')} and {outs('bench_sidecar_overhead.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
