"""dloader vs torch's DataLoader, side by side: throughput and peak memory.

For each profile (io-bound, cpu-bound) and worker count, both loaders iterate the same emulated
dataset as fast as they can (no accelerator step: this measures the loaders; with ``--step-ms``,
the training process sleeps that long per batch, an emulated accelerator step, so that batches
arrive while it is busy, as in training), alternating
dloader / torch in fresh processes, ``--repeats`` times. Reported: median samples/s of each, the
median of the per-pair ratios (target >= 0.98), peak RSS of main process + workers, and the
main process's CPU time per batch (where a loader's own overhead would show). Also the cost of
``loader.stats()`` per call.

    python -m benchmarks.loader.bench_loader            # full run (~4 min on 2 cores)
    python -m benchmarks.loader.bench_loader --quick    # smoke run
    python -m benchmarks.loader.bench_loader --workers 2,3,4 --step-ms 45   # a training step
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import RssSampler, add_out_dir, machine, outputs, table
from benchmarks.loader import plots

PROFILES = {
    # name: (io_ms, cpu_ms) per sample; batch 32 as in docs/architecture.md
    "io_bound": (8.0, 0.3),
    "cpu_bound": (0.0, 3.0),
}


def child(
    loader_kind: str, profile: str, workers: int, seconds: float, step_s: float = 0.0
) -> dict[str, Any]:
    """One measurement, in its own process (clean RSS)."""
    import warnings

    import torch

    import dloader
    from dloader.apps.testbed import EmulatedDataset

    warnings.filterwarnings("ignore")
    io_ms, cpu_ms = PROFILES[profile]
    ds = EmulatedDataset(100_000, io_ms=io_ms, cpu_ms=cpu_ms, payload_bytes=4096)
    cls = dloader.DataLoader if loader_kind == "dloader" else torch.utils.data.DataLoader
    torch.manual_seed(0)
    loader = cls(ds, batch_size=32, shuffle=True, num_workers=workers)
    with RssSampler() as rss:
        it = iter(loader)
        for _ in range(max(2 * workers, 3)):  # warm-up: worker start-up is not throughput
            next(it)
        start, cpu0 = time.perf_counter(), time.process_time()
        samples = batches = 0
        while time.perf_counter() - start < seconds:
            samples += len(next(it)[0])
            batches += 1
            if step_s:
                time.sleep(step_s)  # the accelerator's step: the batches come meanwhile
        elapsed = time.perf_counter() - start
        main_cpu = time.process_time() - cpu0  # this process: the main thread and its helpers
        del it
    return {
        "samples_per_s": samples / elapsed,
        "peak_rss_mb": rss.peak / 2**20,
        "main_cpu_us_per_batch": 1e6 * main_cpu / max(batches, 1),
    }


def stats_cost(workers: int = 16, calls: int = 20000) -> float:
    """Mean cost of loader.stats() in microseconds, with ``workers`` workers running."""
    import warnings

    import dloader
    from dloader.apps.testbed import EmulatedDataset

    warnings.filterwarnings("ignore")
    loader = dloader.DataLoader(EmulatedDataset(10**6, io_ms=1), batch_size=8, num_workers=workers)
    it = iter(loader)
    for _ in range(3 * workers):
        next(it)
    start = time.perf_counter()
    for _ in range(calls):
        loader.stats()
    cost = (time.perf_counter() - start) / calls * 1e6
    del it
    return cost


def run_child(
    kind: str, profile: str, workers: int, seconds: float, step_s: float
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.loader.bench_loader",
            "--child",
            kind,
            profile,
            str(workers),
            str(seconds),
            str(step_s),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_loader",
        description="dloader vs torch DataLoader throughput and peak RSS, side by side.",
    )
    parser.add_argument(
        "--workers", default="0,2,8,16", help="comma-separated worker counts (default: %(default)s)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="pairs per cell (default: 3)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="measured seconds per run, after warm-up (default: 3)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="the training process sleeps this long per batch (an emulated accelerator step; "
        "default: 0, the loaders as fast as they go)",
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 1 s, workers 0,2")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    add_out_dir(parser)
    args = parser.parse_args(argv)
    if args.child:
        kind, profile, workers, seconds, step_s = args.child
        print(json.dumps(child(kind, profile, int(workers), float(seconds), float(step_s))))
        return 0
    if args.quick:
        args.workers, args.repeats, args.seconds = "0,2", 1, 1.0
    try:
        worker_counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers={args.workers!r} must be comma-separated integers")
    if args.repeats < 1 or args.seconds <= 0 or not 0 <= args.step_ms < 10_000:
        parser.error(
            f"--repeats={args.repeats}, --seconds={args.seconds}, --step-ms={args.step_ms}: "
            "expected --repeats >= 1, --seconds > 0 and 0 <= --step-ms < 10000"
        )
    step_s = args.step_ms / 1000

    print(f"machine: {machine()}", flush=True)
    if step_s:
        print(f"training step: {args.step_ms:g} ms per batch (emulated)", flush=True)
    rows, results = [], []
    total = len(PROFILES) * len(worker_counts) * args.repeats
    done = 0
    for profile in PROFILES:
        for workers in worker_counts:
            ours, theirs, ratios, rss_ours, rss_theirs = [], [], [], [], []
            cpu_ours, cpu_theirs = [], []
            for r in range(args.repeats):
                # Alternate which runs first, so drift on a shared machine hits both alike.
                order = ["dloader", "torch"] if r % 2 == 0 else ["torch", "dloader"]
                got = {k: run_child(k, profile, workers, args.seconds, step_s) for k in order}
                ours.append(got["dloader"]["samples_per_s"])
                theirs.append(got["torch"]["samples_per_s"])
                ratios.append(ours[-1] / theirs[-1])
                rss_ours.append(got["dloader"]["peak_rss_mb"])
                rss_theirs.append(got["torch"]["peak_rss_mb"])
                cpu_ours.append(got["dloader"]["main_cpu_us_per_batch"])
                cpu_theirs.append(got["torch"]["main_cpu_us_per_batch"])
                done += 1
                print(
                    f"  [{done}/{total}] {profile} workers={workers}: dloader {ours[-1]:.0f} "
                    f"torch {theirs[-1]:.0f} samples/s",
                    file=sys.stderr,
                    flush=True,
                )
            row = dict(
                profile=profile,
                workers=workers,
                dloader=statistics.median(ours),
                torch=statistics.median(theirs),
                ratio=statistics.median(ratios),
                rss_dloader=statistics.median(rss_ours),
                rss_torch=statistics.median(rss_theirs),
                cpu_dloader=statistics.median(cpu_ours),
                cpu_torch=statistics.median(cpu_theirs),
            )
            results.append(row)
            rows.append(
                [
                    profile,
                    workers,
                    row["dloader"],
                    row["torch"],
                    row["ratio"],
                    row["rss_dloader"],
                    row["rss_torch"],
                    row["cpu_dloader"],
                    row["cpu_torch"],
                ]
            )
    print(
        table(
            [
                "profile",
                "workers",
                "dloader samples/s",
                "torch samples/s",
                "ratio (median of pairs)",
                "dloader peak RSS MB",
                "torch peak RSS MB",
                "dloader main CPU us/batch",
                "torch main CPU us/batch",
            ],
            rows,
        )
    )
    overall = statistics.median(r["ratio"] for r in results)
    print(f"\nmedian throughput ratio over all cells: {overall:.3f} (target >= 0.98)")
    cost = stats_cost()
    print(f"loader.stats() cost with 16 workers: {cost:.1f} us per call")

    outs = outputs(args.out_dir)
    path = outs("bench_loader.json")
    path.write_text(
        json.dumps(
            {
                "machine": machine(),
                "step_ms": args.step_ms,
                "rows": results,
                "median_ratio": overall,
                "stats_cost_us": cost,
            },
            indent=2,
        )
    )
    plots.loader_throughput(results, outs("bench_loader.png"))
    print(f"wrote {path} and {outs('bench_loader.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
