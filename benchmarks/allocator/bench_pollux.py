"""goodput-dp and Pollux's own policy side by side, in the same simulator and learning mode.

Pollux workloads 1-4 (160 jobs each) on 16 nodes x 4 GPUs, 60 s interval, 30 s restarts, every
job's model learned online from what it ran, under ``goodput-dp`` and ``pollux``
(:mod:`dloader.allocator.policies.pollux`: the paper's goodput, power-mean fitness, age-weighted
restart penalty, one distributed job per node, genetic search), at load 1.0 (the trace's
arrival times) and at the loads of ``--loads`` (arrival times divided by the load). At load 1.0
also the oracle model and Pollux's published numbers (from its own simulator).

    python -m benchmarks.allocator.bench_pollux                      # ~25 min on 2 cores
    python -m benchmarks.allocator.bench_pollux --workloads 1 --loads 1

Prints the tables (average and p99 JCT, makespan, ratios, decision times), writes
``bench_pollux.json`` and ``bench_pollux.png`` (JCT distributions per workload at load 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from benchmarks.allocator.published import DATA, POLLUX_H
from dloader.allocator import Cluster
from dloader.allocator.policies import make_policy
from dloader.allocator.simulator import SimResult, Simulator
from dloader.allocator.traces import load_apps, read_workload

CLUSTER = Cluster.uniform(16, 4)


Key = tuple[int, str, float, str]
"""(workload, policy, load, learning)"""


def simulate(
    workload: int, policy: str, load: float, learning: str, generations: int
) -> tuple[Key, SimResult, float]:
    apps = load_apps(DATA / "pollux" / "traces")
    jobs = read_workload(DATA / "pollux" / "workloads" / f"workload-{workload}.csv")
    jobs = [replace(j, time=j.time / load) for j in jobs]
    pol = make_policy(policy)
    if policy == "pollux":
        pol.generations = generations  # type: ignore[attr-defined]
    began = time.perf_counter()
    r = Simulator(jobs, apps, pol, CLUSTER, learning=learning).run()  # type: ignore[arg-type]
    return (workload, policy, load, learning), r, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.allocator.bench_pollux", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--workloads", default="1,2,3,4", help="Pollux workloads (default: %(default)s)")
    p.add_argument("--loads", default="0.5,1,1.5,2", help="arrival-rate multipliers")
    p.add_argument("--generations", type=int, default=100, help="pollux's genetic search")
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle-model runs")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    try:
        workloads = [int(x) for x in args.workloads.split(",")]
        loads = sorted({float(x) for x in args.loads.split(",")} | {1.0})
    except ValueError:
        p.error(f"--workloads={args.workloads!r} / --loads={args.loads!r}: expected numbers")
    if any(w not in POLLUX_H for w in workloads) or any(x <= 0 for x in loads):
        p.error("workloads are 1-4 and loads > 0")
    outs = outputs(args.out_dir)
    print(f"machine: {machine()}\n", flush=True)
    policies = ("goodput-dp", "pollux")
    tasks = [(w, pol, load, "online") for w in workloads for load in loads for pol in policies]
    if not args.no_oracle:
        tasks += [(w, pol, 1.0, "oracle") for w in workloads for pol in policies]
    runs: dict[Key, SimResult] = {}
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [pool.submit(simulate, *t, args.generations) for t in tasks]
        for i, f in enumerate(futures):
            key, r, secs = f.result()
            runs[key] = r
            print(f"  [{i + 1}/{len(tasks)}] {key}: {secs:.0f} s", file=sys.stderr, flush=True)
    rows, summary = [], {}
    for w in workloads:
        for load in loads:
            g = runs[w, "goodput-dp", load, "online"].summary()
            x = runs[w, "pollux", load, "online"].summary()
            summary[f"workload-{w}/load-{load:g}"] = {"goodput-dp": g, "pollux": x}
            rows.append(
                [
                    w,
                    f"{load:g}",
                    g["avg_jct_s"] / 3600,
                    x["avg_jct_s"] / 3600,
                    g["avg_jct_s"] / x["avg_jct_s"],
                    g["p99_jct_s"] / x["p99_jct_s"],
                    g["makespan_s"] / x["makespan_s"],
                    g["optimizer_ms_p50"],
                    x["optimizer_ms_p50"],
                ]
            )
    print(
        table(
            [
                "workload",
                "load",
                "goodput-dp avg JCT h",
                "pollux avg JCT h",
                "avg ratio (<= 0.95)",
                "p99 ratio (<= 1)",
                "makespan ratio (<= 1)",
                "goodput-dp decide ms",
                "pollux decide ms",
            ],
            rows,
        )
    )
    print("ratios: goodput-dp / pollux, same simulator, online learning")
    if not args.no_oracle:
        val = []
        for w in workloads:
            row: list[Any] = [w, POLLUX_H[w]]
            for pol in ("pollux", "goodput-dp"):
                for mode in ("online", "oracle"):
                    row.append(runs[w, pol, 1.0, mode].summary()["avg_jct_s"] / 3600)
            val.append(row)
        print()
        print(
            table(
                [
                    "workload",
                    "Pollux published h",
                    "pollux here, online h",
                    "pollux here, oracle h",
                    "goodput-dp online h",
                    "goodput-dp oracle h",
                ],
                val,
            )
        )
    outs("bench_pollux.json").write_text(
        json.dumps({"machine": machine(), "summary": summary}, indent=1, default=float)
    )
    curves = {
        w: {
            (pol if learning == "online" else f"{pol} ({learning})"): (
                [j.jct_s / 3600 for j in r.jobs if j.jct_s is not None],
                sum(j.jct_s is not None for j in r.jobs),
            )
            for (ww, pol, load, learning), r in sorted(runs.items())
            if ww == w and load == 1.0
        }
        for w in workloads
    }
    plots.jct_cdfs(
        curves, POLLUX_H, outs("bench_pollux.png"), "JCT distribution, load 1.0, 64 GPUs"
    )
    print(f"wrote {outs('bench_pollux.json')} and {outs('bench_pollux.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
