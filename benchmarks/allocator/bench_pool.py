"""A CPU pool for input pipelines: remote loader workers decided with the GPUs, in the simulator.

Every scenario runs in the same simulator (60 s decisions, 30 s restarts, online learning) on
16 nodes x 4 GPUs at ``c`` cores per GPU (default 3), each application's pipeline at its
Synergy profile on GPUs ``--gpu-speed`` times a V100. The arms:

* ``dp``: ``goodput-dp`` with the nodes' cores alone;
* ``dp+pool``: the same plus a CPU pool of ``--pool-per-gpu`` cores per GPU on CPU-only nodes
  (16-core nodes), whose cores feed a job at the measured remote efficiency
  (:data:`dloader.allocator.optimizer.POOL_EFFICIENCY`, from ``bench_remote``);
* ``dp@c+1``: ``goodput-dp`` with the pool's cores on the GPU nodes instead (``c + pool`` cores
  per GPU, no transfer cost): the bound a pool of the same cores could reach;
* peers without a pool: ``goodput-dp-cpu-blind``, ``synergy``, ``pollux`` (``--peers``).

Workloads: Pollux workloads 1-4 and ``--philly N`` 160-job draws from the Philly trace (a new
base seed per run unless ``--seed``, printed). Per scenario the share of the average-JCT gain the
pool reaches, ``(dp - dp+pool) / (dp - dp@c+1)``, and ``dp+pool / dp`` for p99 JCT and makespan;
the median over the workloads per GPU speed, with the worst.

    python -m benchmarks.allocator.bench_pool                   # ~40 min on 2 cores
    python -m benchmarks.allocator.bench_pool --workloads 1 --philly 0 --speeds 1 --peers ''

Prints the tables, writes ``bench_pool.json`` and ``bench_pool.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from dloader.allocator import Cluster
from dloader.allocator.optimizer import POOL_EFFICIENCY
from dloader.allocator.policies import make_policy
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    POLLUX_NUMBERS,
    POLLUX_WORKLOADS,
    AppTrace,
    WorkloadJob,
    load_apps,
    packaged_workload,
    read_philly,
    read_workload,
)

PEERS = ("goodput-dp-cpu-blind", "synergy", "pollux")
POOL_NODE_CORES = 16.0


def pollux_workloads(p: argparse.ArgumentParser, text: str) -> list[int]:
    """``--workloads``: the comma-separated numbers of shipped Pollux workloads (empty: none),
    or a usage error naming the value."""
    try:
        numbers = [int(x) for x in text.split(",") if x]
    except ValueError:
        p.error(f"--workloads={text!r}: expected numbers {POLLUX_NUMBERS}")
    if any(w not in POLLUX_WORKLOADS for w in numbers):
        p.error(f"--workloads={text!r}: the Pollux workloads are {POLLUX_NUMBERS}")
    return numbers


def workload(label: str, num_jobs: int = 160) -> tuple[list[WorkloadJob], dict[str, AppTrace]]:
    """``pollux-N`` (the shipped workload N) or ``philly-SEED`` (``num_jobs`` Philly arrivals)."""
    apps = load_apps(PACKAGED_TRACES)
    kind, _, arg = label.partition("-")
    if kind == "pollux":
        return read_workload(packaged_workload(int(arg))), apps
    return read_philly(PACKAGED_PHILLY, apps, num_jobs=num_jobs, seed=int(arg), max_gpus=64), apps


def simulate(
    label: str, speed: float, arm: str, cores: float, pool_per_gpu: float
) -> tuple[str, float, str, dict[str, Any], float]:
    """One arm of one scenario: (label, speed, arm, summary, seconds)."""
    per_node, nodes = 4, 16
    local = cores + pool_per_gpu if arm == "dp@c+1" else cores
    cluster = Cluster.uniform(nodes, per_node, local * per_node)
    if arm == "dp+pool":
        pool_nodes = math.ceil(pool_per_gpu * nodes * per_node / POOL_NODE_CORES)
        cluster = replace(
            cluster, pool=pool_nodes * POOL_NODE_CORES, pool_efficiency=POOL_EFFICIENCY
        )
    policy = make_policy("goodput-dp" if arm.startswith("dp") else arm)
    jobs, apps = workload(label)
    began = time.perf_counter()
    summary = Simulator(jobs, apps, policy, cluster, gpu_speed=speed).run().summary()
    return label, speed, arm, summary, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.allocator.bench_pool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", default="1,2,3,4", help="Pollux workloads (default 1,2,3,4)")
    p.add_argument("--philly", type=int, default=8, help="160-job Philly draws (default 8)")
    p.add_argument("--seed", type=int, help="first Philly seed (default: a new one, printed)")
    p.add_argument("--speeds", default="1,3", help="GPU speeds over a V100 (default 1,3)")
    p.add_argument("--cores-per-gpu", type=float, default=3.0, help="on the GPU nodes (3)")
    p.add_argument("--pool-per-gpu", type=float, default=1.0, help="pool cores per GPU (1)")
    p.add_argument("--peers", default=",".join(PEERS), help="(default: %(default)s)")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    pollux = pollux_workloads(p, args.workloads)
    try:
        speeds = [float(x) for x in args.speeds.split(",") if x]
    except ValueError:
        p.error(f"--speeds={args.speeds!r}: expected comma-separated numbers")
    peers = [x for x in args.peers.split(",") if x]
    if any(x not in PEERS for x in peers):
        p.error(f"--peers={args.peers!r}: expected some of {PEERS}")
    if args.philly < 0 or args.processes < 1 or not speeds or min(speeds) <= 0:
        p.error("expected --philly >= 0, --processes >= 1, --speeds > 0")
    if not (args.cores_per_gpu > 0 and args.pool_per_gpu > 0):
        p.error("expected --cores-per-gpu and --pool-per-gpu > 0")
    seed = random.randrange(1, 1 << 30) if args.seed is None else args.seed
    labels = [f"pollux-{w}" for w in pollux] + [f"philly-{seed + i}" for i in range(args.philly)]
    arms = ["dp", "dp+pool", "dp@c+1", *peers]
    out = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(
        f"16 x 4 GPUs, {args.cores_per_gpu:g} cores/GPU; pool {args.pool_per_gpu:g} core/GPU at "
        f"efficiency {POOL_EFFICIENCY}; Philly seeds {seed}..{seed + args.philly - 1} "
        f"(--seed {seed} to repeat)",
        flush=True,
    )
    tasks = [(lab, sp, arm) for sp in speeds for lab in labels for arm in arms]
    runs: dict[tuple[str, float, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [
            pool.submit(simulate, lab, sp, arm, args.cores_per_gpu, args.pool_per_gpu)
            for lab, sp, arm in tasks
        ]
        for i, f in enumerate(futures):
            lab, sp, arm, summary, secs = f.result()
            runs[lab, sp, arm] = summary
            print(f"  [{i + 1}/{len(tasks)}] {lab} x{sp:g} {arm}: {secs:.0f} s", file=sys.stderr)
    result: dict[str, Any] = {"machine": machine(), "seed": seed, "speeds": {}}
    for sp in speeds:
        rows, shares, p99s, spans = [], [], [], []
        for lab in labels:
            a, b, c = (runs[lab, sp, x] for x in ("dp", "dp+pool", "dp@c+1"))
            gain = a["avg_jct_s"] - c["avg_jct_s"]
            share = (a["avg_jct_s"] - b["avg_jct_s"]) / gain if gain > 0 else math.nan
            shares.append(share)
            p99s.append(b["p99_jct_s"] / a["p99_jct_s"])
            spans.append(b["makespan_s"] / a["makespan_s"])
            peer_cells = [b["avg_jct_s"] / runs[lab, sp, x]["avg_jct_s"] for x in peers]
            rows.append(
                [
                    lab,
                    a["avg_jct_s"] / 3600,
                    b["avg_jct_s"] / 3600,
                    c["avg_jct_s"] / 3600,
                    "-" if math.isnan(share) else f"{share:.0%}",
                    p99s[-1],
                    spans[-1],
                    b["pool_utilisation"],
                    *peer_cells,
                ]
            )
        finite = [x for x in shares if not math.isnan(x)]
        med = statistics.median(finite) if finite else math.nan
        print(f"\n## GPU speed {sp:g}x a V100")
        bound = f"dp@{args.cores_per_gpu + args.pool_per_gpu:g}"
        print(
            table(
                [
                    "workload", "dp avg JCT h", "dp+pool", bound,
                    "share of gain", "p99 pool/dp", "makespan pool/dp", "pool util",
                    *(f"pool / {x}" for x in peers),
                ],
                rows,
            )
        )  # fmt: skip
        print(
            f"share of the gain: median {med:.0%} (worst {min(finite):.0%}) of {len(finite)} "
            f"workloads; p99 pool/dp median {statistics.median(p99s):.3f} (worst "
            f"{max(p99s):.3f}); makespan median {statistics.median(spans):.3f} (worst "
            f"{max(spans):.3f})"
            if finite
            else "no workload where more cores help"
        )
        result["speeds"][f"{sp:g}"] = {
            "labels": labels,
            "shares": shares,
            "p99": p99s,
            "makespan": spans,
            "median_share": med,
        }
    result["runs"] = [
        {"workload": lab, "speed": sp, "arm": arm, **s} for (lab, sp, arm), s in runs.items()
    ]
    out("bench_pool.json").write_text(json.dumps(result, indent=1, default=float))
    plots.pool_shares(result["speeds"], out("bench_pool.png"))
    print(f"\nwrote {out('bench_pool.json')} and {out('bench_pool.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
