"""Cluster policies side by side in the trace-driven simulator (the #6 headline).

Pollux workloads 1-4 (160 jobs each over 8 hours) on 16 nodes x 4 GPUs, 60 s interval, 30 s
restart delay, under ``static``, ``elastic-gpu``, ``elastic-dp`` and ``goodput-dp`` (plus an
ablation: ``goodput-dp`` maximising the plain sum of speedups instead of the sum of logs). Then
1,000 Philly arrivals (time compressed 30x) on 512 nodes x 4 GPUs = 2,048 GPUs, for decision time
at scale. Targets: ``elastic-dp`` vs ``elastic-gpu`` >= 2x jobs completed in the first 4 h and
>= 3x lower average JCT; ``goodput-dp`` average JCT at or below Pollux's published numbers.

    python -m benchmarks.bench_cluster_sim          # ~1.5 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks._common import machine, out_path, table
from dloader.allocator import Cluster
from dloader.allocator.policies import POLICIES, DpPolicy, make_policy
from dloader.allocator.simulator import SimResult, Simulator
from dloader.allocator.traces import load_apps, read_philly, read_workload

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
POLLUX_H = {1: 0.58, 2: 0.92, 3: 0.61, 4: 0.76}  # Pollux's own policy, OSDI 2021 (avg JCT, h)
TIRESIAS_H = {1: 0.69, 2: 1.43, 3: 1.08, 4: 0.91}


def ablation() -> DpPolicy:
    return DpPolicy(
        "goodput-dp (sum)", objective="goodput", fixed_batch=False, accumulate=True, fairness=1.0
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA, help="the shared data/ folder")
    p.add_argument("--workloads", default="1,2,3,4")
    p.add_argument("--philly-jobs", type=int, default=1000)
    args = p.parse_args()
    print(f"machine: {machine()}\n")
    apps = load_apps(args.data / "pollux" / "traces")
    cluster = Cluster.uniform(16, 4)
    rows, summary, runs = [], {}, {}
    for w in [int(x) for x in args.workloads.split(",")]:
        jobs = read_workload(args.data / "pollux" / "workloads" / f"workload-{w}.csv")
        for policy in [*(make_policy(n) for n in POLICIES), ablation()]:
            began = time.perf_counter()
            r = Simulator(jobs, apps, policy, cluster).run()
            s = r.summary(4.0)
            runs[w, policy.name] = r
            summary[f"workload-{w}/{policy.name}"] = s
            rows.append(
                [
                    w,
                    policy.name,
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
            print(f"  workload {w} {policy.name}: {time.perf_counter() - began:.1f} s")
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
    for w in sorted({w for w, _ in runs}):
        gpu = summary[f"workload-{w}/elastic-gpu"]
        dp = summary[f"workload-{w}/elastic-dp"]
        good = summary[f"workload-{w}/goodput-dp"]
        ratios.append(
            [
                w,
                dp["jobs_completed_4h"] / max(gpu["jobs_completed_4h"], 1),
                gpu["avg_jct_s"] / dp["avg_jct_s"],
                good["avg_jct_s"] / 3600,
                POLLUX_H[w],
                TIRESIAS_H[w],
            ]
        )
    print()
    print(
        table(
            [
                "workload",
                "elastic-dp / elastic-gpu jobs in 4 h (>= 2)",
                "elastic-gpu / elastic-dp avg JCT (>= 3)",
                "goodput-dp avg JCT h",
                "Pollux published h",
                "Tiresias published h",
            ],
            ratios,
        )
    )

    philly = read_philly(
        args.data / "philly" / "philly.csv",
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
    out_path("bench_cluster_sim.json").write_text(
        json.dumps({"machine": machine(), "summary": summary}, indent=1)
    )
    plot(runs)
    return 0


def plot(runs: dict[tuple[int, str], SimResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({w for w, _ in runs})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.8), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for (ww, name), r in runs.items():
            if ww != w:
                continue
            jct = np.sort([j.jct_s / 3600 for j in r.jobs if j.jct_s is not None])
            ls = ":" if "sum" in name else "-"
            ax.step(jct, np.arange(1, len(jct) + 1) / len(r.jobs), where="post", ls=ls, label=name)
        ax.axvline(POLLUX_H[w], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_title(f"workload {w} (dashed: Pollux avg JCT)")
        ax.set_xlabel("JCT (h)")
    axes[0][0].set_ylabel("fraction of jobs")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path("bench_cluster_sim.png"), dpi=110)
    print(f"plot: {out_path('bench_cluster_sim.png')}")


if __name__ == "__main__":
    sys.exit(main())
