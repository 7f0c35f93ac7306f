"""Cluster policies side by side in the trace-driven simulator (the #6 and #15 headline).

Pollux workloads 1-4 (160 jobs each over 8 hours) on 16 nodes x 4 GPUs, 60 s interval, 30 s
restart delay, under ``static``, ``elastic-gpu``, ``elastic-dp`` and ``goodput-dp``, every job's
throughput model learned online from what it has run (the default, honest mode). Then the
ablations of ``goodput-dp``: the offline oracle model, placement-blind, the horizon restart cost
instead of Pollux's age/restart weighting, the plain sum of speedups instead of the sum of logs.
Per application, where ``goodput-dp``'s time went (queue, restarts, spread placements, running).
Then 1,000 Philly arrivals (time compressed 30x) on 512 nodes x 4 GPUs = 2,048 GPUs, for
decision time at scale. Targets: ``goodput-dp`` average JCT <= 0.95x Pollux's published numbers;
``elastic-dp`` >= 3x lower average JCT than ``elastic-gpu``; decisions < 10 ms at 64 GPUs and
< 1 s at 2,048.

    python -m benchmarks.allocator.bench_cluster_sim               # ~12 min on 2 cores
    python -m benchmarks.allocator.bench_cluster_sim --workloads 3 --no-ablations --philly-jobs 0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from benchmarks.allocator.published import DATA, POLLUX_H, TIRESIAS_H
from dloader.allocator import Cluster
from dloader.allocator.policies import POLICIES, DpPolicy, Policy, make_policy
from dloader.allocator.simulator import SimResult, Simulator
from dloader.allocator.traces import load_apps, read_philly, read_workload

#: goodput-dp ablations: label -> (DpPolicy overrides, learning)
ABLATIONS: dict[str, tuple[dict[str, Any], str]] = {
    "goodput-dp": ({}, "online"),
    "oracle model": ({}, "oracle"),
    "placement-blind": ({"placement_aware": False}, "online"),
    "horizon restart cost": ({"restart_model": "horizon"}, "online"),
    "sum of speedups": ({"fairness": 1.0}, "online"),
    "oracle, blind, horizon": ({"placement_aware": False, "restart_model": "horizon"}, "oracle"),
}


HOURS = ("jct", "queue", "restart", "placement", "run")


def policy(label: str) -> tuple[Policy, str]:
    """The policy and learning mode a row label names."""
    if label in POLICIES:
        return make_policy(label), "online"
    overrides, learning = ABLATIONS[label]
    kw: dict[str, Any] = {"fairness": 0.0, **overrides}
    return (
        DpPolicy(label, objective="goodput", fixed_batch=False, accumulate=True, **kw),
        learning,
    )


def simulate(data: Path, workload: int, label: str) -> tuple[int, str, SimResult, float]:
    apps = load_apps(data / "pollux" / "traces")
    jobs = read_workload(data / "pollux" / "workloads" / f"workload-{workload}.csv")
    pol, learning = policy(label)
    began = time.perf_counter()
    r = Simulator(jobs, apps, pol, Cluster.uniform(16, 4), learning=learning).run()  # type: ignore[arg-type]
    return workload, label, r, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data",
        type=Path,
        default=DATA,
        help="a data folder with pollux/traces, pollux/workloads and philly/philly.csv[.gz] "
        "(default: the one shipped with the package)",
    )
    p.add_argument("--workloads", default="1,2,3,4")
    p.add_argument("--philly-jobs", type=int, default=1000, help="0: skip the Philly run")
    p.add_argument("--no-ablations", action="store_true", help="only the four policies")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    print(f"machine: {machine()}\n")
    workloads = [int(x) for x in args.workloads.split(",")]
    labels = [*POLICIES, *([] if args.no_ablations else list(ABLATIONS)[1:])]
    tasks = [(w, label) for w in workloads for label in labels]
    runs: dict[tuple[int, str], SimResult] = {}
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [pool.submit(simulate, args.data, w, label) for w, label in tasks]
        for i, f in enumerate(futures):
            w, label, r, secs = f.result()
            runs[w, label] = r
            print(f"  [{i + 1}/{len(tasks)}] workload {w} {label}: {secs:.0f} s", flush=True)
    summary: dict[str, Any] = {}
    rows = []
    for (w, label), r in runs.items():
        s = r.summary(4.0)
        summary[f"workload-{w}/{label}"] = {**s, "losses": r.losses()}
        rows.append(
            [
                w,
                label,
                s["jobs_completed_4h"],
                s["avg_jct_s"] / 3600,
                s["p99_jct_s"] / 3600,
                s["makespan_s"] / 3600,
                s["gpu_utilisation"],
                s["restarts"],
                s["batch_changes"],
                s["optimizer_ms_p50"],
                s["optimizer_ms_max"],
            ]
        )
    print()
    print(
        table(
            [
                "workload",
                "policy",
                "done in 4 h",
                "avg JCT h",
                "p99 JCT h",
                "makespan h",
                "GPU util",
                "restarts",
                "batch changes",
                "decide ms p50",
                "decide ms max",
            ],
            rows,
        )
    )
    ratios = []
    for w in workloads:
        gpu = summary[f"workload-{w}/elastic-gpu"]
        dp = summary[f"workload-{w}/elastic-dp"]
        good = summary[f"workload-{w}/goodput-dp"]
        ratios.append(
            [
                w,
                gpu["avg_jct_s"] / dp["avg_jct_s"],
                good["avg_jct_s"] / 3600,
                POLLUX_H[w],
                good["avg_jct_s"] / 3600 / POLLUX_H[w],
                TIRESIAS_H[w],
            ]
        )
    print()
    print(
        table(
            [
                "workload",
                "elastic-gpu / elastic-dp avg JCT (>= 3)",
                "goodput-dp avg JCT h",
                "Pollux published h",
                "goodput-dp / Pollux (<= 0.95)",
                "Tiresias published h",
            ],
            ratios,
        )
    )
    if not args.no_ablations:
        print()
        print(
            table(
                ["ablation (avg JCT h)", *(f"workload {w}" for w in workloads)],
                [
                    [
                        label,
                        *(summary[f"workload-{w}/{label}"]["avg_jct_s"] / 3600 for w in workloads),
                    ]
                    for label in ABLATIONS
                ],
            )
        )
    loss_rows = [
        [w, app, m["jobs"], *(m[k] / 3600 for k in HOURS), m["restarts"]]
        for w in workloads
        for app, m in runs[w, "goodput-dp"].losses().items()
    ]
    print()
    print(
        table(
            ["workload", "goodput-dp: application", "jobs", *(f"{k} h" for k in HOURS), "restarts"],
            loss_rows,
        )
    )
    if args.philly_jobs:
        philly_table(args, summary)
    outs = outputs(args.out_dir)
    outs("bench_cluster_sim.json").write_text(
        json.dumps({"machine": machine(), "summary": summary}, indent=1)
    )
    curves = {
        w: {
            name: (
                [j.jct_s / 3600 for j in r.jobs if j.jct_s is not None],
                len(r.jobs),
            )
            for (ww, name), r in runs.items()
            if ww == w and name in POLICIES
        }
        for w in workloads
    }
    plots.jct_cdfs(curves, POLLUX_H, outs("bench_cluster_sim.png"), "JCT per policy, 64 GPUs")
    print(f"wrote {outs('bench_cluster_sim.json')} and {outs('bench_cluster_sim.png')}")
    return 0


def philly_table(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    apps = load_apps(args.data / "pollux" / "traces")
    philly = read_philly(
        next(args.data.glob("philly/philly.csv*")),
        apps,
        num_jobs=args.philly_jobs,
        seed=0,
        time_scale=30.0,
        max_gpus=2048,
    )
    big = Cluster.uniform(512, 4)
    prow = []
    for name in ("goodput-dp", "elastic-dp"):
        r = Simulator(philly, apps, make_policy(name), big).run()
        s = r.summary()
        summary[f"philly-{args.philly_jobs}/{name}"] = s
        busy = max(sum(1 for g in col if g) for col in zip(*r.gpus.values(), strict=True))
        prow.append(
            [
                name,
                s["jobs_completed"],
                busy,
                s["avg_jct_s"] / 3600,
                s["gpu_utilisation"],
                s["optimizer_ms_p50"],
                s["optimizer_ms_p99"],
                s["optimizer_ms_max"],
            ]
        )
    print()
    print(
        table(
            [
                "Philly 2,048 GPUs",
                "completed",
                "max concurrent jobs",
                "avg JCT h",
                "GPU util",
                "decide ms p50",
                "decide ms p99",
                "decide ms max",
            ],
            prow,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
