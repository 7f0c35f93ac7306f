"""GPUs and CPUs decided together: goodput-dp against the CPU-blind and CPU-aware peers in one
simulator, where the nodes' cores limit the jobs' input pipelines.

Every scenario runs each policy in the same simulator (60 s decisions, 30 s restarts, online
learning: each job's throughput and input models are what it has measured so far), on
16 nodes x 4 GPUs with ``c`` cores per GPU (``inf``: unlimited, the simulator without CPUs).
Each application's input pipeline follows Synergy's measured profile of the closest model
(:mod:`dloader.allocator.cpu_profiles`), on V100-speed GPUs (``--gpu-speed``).

* ``goodput-dp``: GPUs, batch sizes and cores together (:mod:`dloader.allocator.policies.cores`);
* ``goodput-dp-cpu-blind``: today's decisions, cores in proportion to GPUs on each node;
* ``synergy``: Synergy-TUNE (fixed GPUs as requested, LAS order, cores by profiled need);
* ``pollux``: Pollux's policy, cores in proportion to GPUs.

Scenarios: Pollux workloads 1-4 at 2, 3 and 6 cores per GPU and unlimited (where the policy was
tuned); ``--philly N`` workloads of 160 jobs drawn from the Philly trace with new seeds (a new
base seed per run unless ``--seed``, printed) at 3 cores per GPU and unlimited; one CPU-hungry
mix (workload 1 with each CPU-light ncf job made a cifar10 job of the same size).
``--validate``: ``synergy`` against the same scheduler with GPU-proportional cores (Synergy's own
comparison) on Synergy's cluster shape (16 servers of 8 GPUs and 24 cores), Philly draws.

    python -m benchmarks.allocator.bench_cpu                   # ~1.5 h on 2 cores
    python -m benchmarks.allocator.bench_cpu --workloads 2 --cores-per-gpu 3 --philly 2 \\
        --policies goodput-dp,goodput-dp-cpu-blind --no-mix    # a few minutes

Prints one table per group (average and p99 JCT, makespan, GPU and CPU utilisation per policy)
and the ratios of goodput-dp's average JCT to each peer's with their median and worst, writes
``bench_cpu.json`` and ``bench_cpu.png`` (the ratios per scenario).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from dloader.allocator import Cluster
from dloader.allocator.policies import Policy, SynergyPolicy, make_policy
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    AppTrace,
    WorkloadJob,
    load_apps,
    packaged_workload,
    read_philly,
    read_workload,
)

POLICIES = ("goodput-dp", "goodput-dp-cpu-blind", "synergy", "pollux")

Scenario = tuple[str, float]
"""(workload label, cores per GPU; inf: unlimited)"""


def hungry(jobs: list[WorkloadJob], apps: dict[str, AppTrace]) -> list[WorkloadJob]:
    """``jobs`` with every ncf job (CPU-light) a cifar10 job (CPU-hungry, also small) on the
    same GPUs, its batch size as ``read_philly`` picks one."""
    app = apps["cifar10"]
    lo, hi = app.local_bsz_range
    out = []
    for j in jobs:
        if j.application == "ncf":
            want = j.num_replicas * math.sqrt(lo * hi)
            batch = int(min(app.validated_batches, key=lambda b: abs(math.log(b / want))))
            j = replace(j, name=f"cifar10-{j.name}", application="cifar10", batch_size=batch)
        out.append(j)
    return out


def workload(label: str, max_gpus: int) -> tuple[list[WorkloadJob], dict[str, AppTrace]]:
    """The jobs of a scenario label: ``pollux-N``, ``philly-SEED``, ``mix`` or ``synergy``."""
    apps = load_apps(PACKAGED_TRACES)
    kind, _, arg = label.partition("-")
    if kind == "pollux":
        return read_workload(packaged_workload(int(arg))), apps
    if kind == "philly":
        return read_philly(
            PACKAGED_PHILLY, apps, num_jobs=160, seed=int(arg), max_gpus=max_gpus
        ), apps
    if kind == "mix":
        return hungry(read_workload(packaged_workload(1)), apps), apps
    if kind == "synergy":
        return read_philly(PACKAGED_PHILLY, apps, num_jobs=160, seed=int(arg), max_gpus=8), apps
    raise ValueError(label)


def policy(name: str, generations: int) -> Policy:
    if name == "synergy-proportional":
        return SynergyPolicy("las", tune=False)
    pol = make_policy(name)
    if name == "pollux":
        pol.generations = generations  # type: ignore[attr-defined]
    return pol


def simulate(
    label: str, cores_per_gpu: float, name: str, generations: int, gpu_speed: float
) -> tuple[Scenario, str, dict[str, Any], float]:
    nodes, per_node = (16, 8) if label.startswith("synergy") else (16, 4)
    cpus = None if math.isinf(cores_per_gpu) else cores_per_gpu * per_node
    cluster = Cluster.uniform(nodes, per_node, cpus)
    jobs, apps = workload(label, nodes * per_node)
    began = time.perf_counter()
    sim = Simulator(jobs, apps, policy(name, generations), cluster, gpu_speed=gpu_speed)
    summary = sim.run().summary()
    return (label, cores_per_gpu), name, summary, time.perf_counter() - began


def _numbers(text: str, what: str, p: argparse.ArgumentParser) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x]
    except ValueError:
        p.error(f"{what}={text!r}: expected comma-separated numbers")
    if not values or any(not v > 0 for v in values):
        p.error(f"{what}={text!r}: expected numbers > 0 (inf: unlimited)")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.allocator.bench_cpu", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--workloads", default="1,2,3,4", help="Pollux workloads (default: %(default)s)")
    p.add_argument("--cores-per-gpu", default="2,3,6,inf", help="for the Pollux workloads")
    p.add_argument("--philly", type=int, default=8, help="160-job Philly draws (0: none)")
    p.add_argument("--philly-cores-per-gpu", default="3,inf", help="for the Philly draws")
    p.add_argument("--seed", type=int, help="first Philly seed (default: a new one, printed)")
    p.add_argument("--no-mix", action="store_true", help="skip the CPU-hungry mix")
    p.add_argument("--validate", action="store_true", help="also validate synergy (see above)")
    p.add_argument("--policies", default=",".join(POLICIES), help="(default: %(default)s)")
    p.add_argument("--gpu-speed", type=float, default=1.0, help="GPU speed over the V100")
    p.add_argument("--generations", type=int, default=100, help="pollux's genetic search")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    try:
        workloads = [int(x) for x in args.workloads.split(",") if x]
    except ValueError:
        p.error(f"--workloads={args.workloads!r}: expected numbers 1-4")
    if any(w not in (1, 2, 3, 4) for w in workloads):
        p.error(f"--workloads={args.workloads!r}: the Pollux workloads are 1-4")
    cores = _numbers(args.cores_per_gpu, "--cores-per-gpu", p)
    philly_cores = _numbers(args.philly_cores_per_gpu, "--philly-cores-per-gpu", p)
    names = [n for n in args.policies.split(",") if n]
    if not names or any(n not in POLICIES for n in names) or names[0] != "goodput-dp":
        p.error(f"--policies={args.policies!r}: goodput-dp first, then any of {POLICIES[1:]}")
    if args.philly < 0 or args.processes < 1:
        p.error(f"--philly={args.philly} must be >= 0 and --processes={args.processes} >= 1")
    seed = random.randrange(1, 1 << 30) if args.seed is None else args.seed
    outs = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(f"Philly draws: seeds {seed}..{seed + args.philly - 1} (--seed {seed} to repeat)\n")
    groups: dict[str, list[Scenario]] = {}
    for c in cores:
        groups[f"Pollux workloads, {c:g} cores/GPU"] = [(f"pollux-{w}", c) for w in workloads]
    for c in philly_cores if args.philly else ():
        groups[f"Philly draws, {c:g} cores/GPU"] = [
            (f"philly-{seed + i}", c) for i in range(args.philly)
        ]
    if not args.no_mix:
        groups["CPU-hungry mix, 3 cores/GPU"] = [("mix", 3.0)]
    tasks = [(s, n) for g in groups.values() for s in g for n in names]
    if args.validate:
        validation = [(f"synergy-{seed}", 3.0), (f"synergy-{seed + 1}", 3.0)]
        tasks += [(s, n) for s in validation for n in ("synergy", "synergy-proportional")]
    runs: dict[tuple[Scenario, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [pool.submit(simulate, *s, n, args.generations, args.gpu_speed) for s, n in tasks]
        for i, f in enumerate(futures):
            scenario, name, summary, secs = f.result()
            runs[scenario, name] = summary
            print(f"  [{i + 1}/{len(tasks)}] {scenario} {name}: {secs:.0f} s", file=sys.stderr)
    ratios: dict[str, dict[str, list[float]]] = {}
    for title, scenarios in groups.items():
        rows = []
        for s in scenarios:
            for n in names:
                r = runs[s, n]
                rows.append(
                    [
                        s[0],
                        n,
                        r["avg_jct_s"] / 3600,
                        r["p99_jct_s"] / 3600,
                        r["makespan_s"] / 3600,
                        r["gpu_utilisation"],
                        "-" if math.isnan(r["cpu_utilisation"]) else r["cpu_utilisation"],
                    ]
                )
        print(f"## {title}")
        cols = ["workload", "policy", "avg JCT h", "p99 JCT h", "makespan h", "GPU util"]
        print(table([*cols, "CPU util"], rows))
        ratio_rows = []
        for peer in names[1:]:
            mine = ratios.setdefault(title, {}).setdefault(peer, [])
            for key in ("avg_jct_s", "p99_jct_s", "makespan_s"):
                values = [runs[s, "goodput-dp"][key] / runs[s, peer][key] for s in scenarios]
                if key == "avg_jct_s":
                    mine.extend(values)
                ratio_rows.append(
                    [peer, key.removesuffix("_s"), _median(values), max(values), min(values)]
                )
        print(table(["goodput-dp / peer", "measure", "median", "worst", "best"], ratio_rows))
        print()
    if args.validate:
        rows = []
        for s in validation:
            tuned, fair = runs[s, "synergy"], runs[s, "synergy-proportional"]
            rows.append(
                [
                    s[0],
                    fair["avg_jct_s"] / 3600,
                    tuned["avg_jct_s"] / 3600,
                    fair["avg_jct_s"] / tuned["avg_jct_s"],
                    tuned["cpu_utilisation"],
                    fair["cpu_utilisation"],
                ]
            )
        print("## Synergy-TUNE against GPU-proportional cores (Synergy's own comparison)")
        print("16 servers x 8 GPUs x 24 cores, 160-job Philly draws; the paper: up to 3.4x lower")
        print("average JCT with TUNE than with GPU-proportional cores")
        cols = ["workload", "proportional avg JCT h", "TUNE avg JCT h", "speed-up"]
        print(table([*cols, "TUNE CPU util", "proportional CPU util"], rows))
    payload = {
        "machine": machine(),
        "seed": seed,
        "gpu_speed": args.gpu_speed,
        "runs": [
            {"workload": s[0], "cores_per_gpu": s[1], "policy": n, **r}
            for (s, n), r in runs.items()
        ],
        "ratios": ratios,
    }
    outs("bench_cpu.json").write_text(json.dumps(payload, indent=1, default=float))
    plots.cpu_ratios(ratios, outs("bench_cpu.png"))
    print(f"wrote {outs('bench_cpu.json')} and {outs('bench_cpu.png')}")
    return 0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


if __name__ == "__main__":
    sys.exit(main())
