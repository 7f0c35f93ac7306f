"""GPUs and CPUs decided together: goodput-dp against the CPU-blind and CPU-aware peers in one
simulator, where the nodes' cores limit the jobs' input pipelines.

Every scenario runs each policy in the same simulator (60 s decisions, 30 s restarts, online
learning: each job's throughput and input models are what it has measured so far), on
16 nodes x 4 GPUs with ``c`` cores per GPU (``inf``: unlimited, the simulator without CPUs).
Each application's input pipeline follows Synergy's measured profile of the closest model
(:mod:`dloader.allocator.cpu_profiles`), on V100-speed GPUs (``--gpu-speed``).

* ``goodput-dp``: GPUs, batch sizes and cores together (:mod:`dloader.allocator.policies.cores`);
* ``goodput-dp-cpu-blind``: today's decisions, cores in proportion to GPUs on each node;
* ``synergy``: Synergy-TUNE (fixed GPUs as requested, 300-s rounds in LAS order, cores by
  profiled need);
* ``pollux``: Pollux's policy, cores in proportion to GPUs.

Beside them, with limited cores, ``goodput-dp@pooled``: the pooled same-cores bound, the same
cores without node boundaries, divided at every decision by each job's true need
(``Simulator(pooled_cores=True)``, goodput-dp's GPUs and batch sizes). ``reach`` is how much of
the way from ``goodput-dp-cpu-blind`` to that bound goodput-dp went, on average JCT:
``(blind - dp) / (blind - pooled)`` per workload (its jitters' sums).

Scenarios: Pollux workloads 1-4 at 2, 3 and 6 cores per GPU and unlimited (where the policy was
tuned); ``--philly N`` workloads of 160 jobs drawn from the Philly trace with new seeds (a new
base seed per run unless ``--seed``, printed) at 3 cores per GPU and unlimited; one CPU-hungry
mix (workload 1 with each CPU-light ncf job made a cifar10 job of the same size). Each workload
runs ``--jitter-seeds K`` times with every arrival moved by up to ``--jitter-s`` seconds
(:func:`dloader.allocator.traces.jitter_arrivals`; with ``--declared-lengths SIGMA`` every job
declares its length, off by ``exp(N(0, SIGMA))``, as a trainer declares its epochs); each ratio
is given as its median over the runs with a 95% interval from resampling workloads with their
jitters, and the worst workload.
The Synergy twin against Synergy's own comparison, on the workload its artifact draws:
:mod:`benchmarks.allocator.bench_synergy`.

    python -m benchmarks.allocator.bench_cpu                   # ~5 h on 2 cores (1 jitter: ~1.5 h)
    python -m benchmarks.allocator.bench_cpu --workloads 2 --cores-per-gpu 3 --philly 2 \\
        --policies goodput-dp,goodput-dp-cpu-blind --no-mix    # a few minutes

Prints one table per group (average and p99 JCT, makespan, GPU and CPU utilisation per policy,
the mean over jitters), the ratios of goodput-dp's to each peer's (and to the bound's) with their
intervals, and the reach, writes ``bench_cpu.json`` and ``bench_cpu.png`` (the ratios per
scenario).
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

import numpy as np

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from benchmarks.allocator.bench_admission import check_declared_lengths, interval
from benchmarks.allocator.bench_pool import pollux_workloads
from dloader.allocator import Cluster
from dloader.allocator.optimizer import POOL_EFFICIENCY
from dloader.allocator.policies import POLICIES as KNOWN
from dloader.allocator.policies import Policy, make_policy
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    AppTrace,
    WorkloadJob,
    jitter_arrivals,
    load_apps,
    packaged_workload,
    read_philly,
    read_workload,
)

POLICIES = ("goodput-dp", "goodput-dp-cpu-blind", "synergy", "pollux")
#: The pooled same-cores bound (see the module docstring).
POOLED = "goodput-dp@pooled"
BLIND = "goodput-dp-cpu-blind"
#: The CPU-aware arms whose reach towards the pooled bound is printed (with BLIND and the bound).
REACHING = ("goodput-dp", "goodput-dp-lend")

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
    """The jobs of a scenario label: ``pollux-N``, ``philly-SEED`` or ``mix``."""
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
    raise ValueError(label)


def policy(name: str, generations: int) -> Policy:
    pol = make_policy(name)
    if name == "pollux":
        pol.generations = generations  # type: ignore[attr-defined]
    return pol


def simulate(
    scenario: Scenario,
    jitter: int,
    name: str,
    generations: int,
    gpu_speed: float,
    jitter_s: float,
    input_prior: bool = False,
    declared: float | None = None,
) -> tuple[Scenario, int, str, dict[str, Any], float]:
    label, cores_per_gpu = scenario
    nodes, per_node = 16, 4
    cpus = None if math.isinf(cores_per_gpu) else cores_per_gpu * per_node
    # remote workers (goodput-dp-lend's cores lent across nodes) feed at the measured efficiency
    cluster = replace(Cluster.uniform(nodes, per_node, cpus), pool_efficiency=POOL_EFFICIENCY)
    jobs, apps = workload(label, nodes * per_node)
    jobs = jitter_arrivals(jobs, seed=jitter, seconds=jitter_s)
    began = time.perf_counter()
    pooled = name == POOLED
    sim = Simulator(
        jobs,
        apps,
        policy("goodput-dp" if pooled else name, generations),
        cluster,
        gpu_speed=gpu_speed,
        pooled_cores=pooled,
        input_prior=input_prior,
        declared_lengths=declared,
    )
    summary = sim.run().summary()
    return scenario, jitter, name, summary, time.perf_counter() - began


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
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="goodput-dp first, then its peers: any dloader-sim policy, e.g. an ablation such "
        "as goodput-dp-no-core-admission (default: %(default)s)",
    )
    p.add_argument("--gpu-speed", type=float, default=1.0, help="GPU speed over the V100")
    p.add_argument(
        "--input-prior",
        action="store_true",
        help="a new job brings its application's measured input curve (Simulator input_prior)",
    )
    p.add_argument(
        "--declared-lengths",
        type=float,
        metavar="SIGMA",
        help="every job declares its length, off by exp(N(0, SIGMA)) (0: exact), which "
        "goodput-dp weighs; default: none declared",
    )
    p.add_argument("--generations", type=int, default=100, help="pollux's genetic search")
    p.add_argument("--jitter-seeds", type=int, default=3, help="runs per workload (default 3)")
    p.add_argument("--jitter-s", type=float, default=30.0, help="arrival shift bound (30 s)")
    p.add_argument("--no-bound", action="store_true", help="skip the pooled same-cores bound")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    workloads = pollux_workloads(p, args.workloads)
    cores = _numbers(args.cores_per_gpu, "--cores-per-gpu", p)
    philly_cores = _numbers(args.philly_cores_per_gpu, "--philly-cores-per-gpu", p)
    names = [n for n in args.policies.split(",") if n]
    known = KNOWN
    if not names or any(n not in known for n in names) or names[0] != "goodput-dp":
        p.error(f"--policies={args.policies!r}: goodput-dp first, then any of {known}")
    if args.philly < 0 or args.processes < 1 or args.jitter_seeds < 1:
        p.error(
            f"--philly={args.philly} must be >= 0, --processes={args.processes} and "
            f"--jitter-seeds={args.jitter_seeds} >= 1"
        )
    if not (0 <= args.jitter_s < 3600):
        p.error(f"--jitter-s={args.jitter_s}: expected seconds in [0, 3600)")
    check_declared_lengths(p, args.declared_lengths)
    seed = random.randrange(1, 1 << 30) if args.seed is None else args.seed
    outs = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(f"Philly draws: seeds {seed}..{seed + args.philly - 1} (--seed {seed} to repeat)\n")
    groups: dict[str, list[Scenario]] = {}
    for c in cores if workloads else ():
        groups[f"Pollux workloads, {c:g} cores/GPU"] = [(f"pollux-{w}", c) for w in workloads]
    for c in philly_cores if args.philly else ():
        groups[f"Philly draws, {c:g} cores/GPU"] = [
            (f"philly-{seed + i}", c) for i in range(args.philly)
        ]
    if not args.no_mix:
        groups["CPU-hungry mix, 3 cores/GPU"] = [("mix", 3.0)]

    def arms(s: Scenario) -> list[str]:
        return names + ([] if args.no_bound or math.isinf(s[1]) else [POOLED])

    jitters = range(args.jitter_seeds)
    tasks = [(s, k, n) for g in groups.values() for s in g for k in jitters for n in arms(s)]
    print(
        f"{len(tasks)} runs: {args.jitter_seeds} jitter(s) of +-{args.jitter_s:g} s per "
        f"workload, {args.processes} process(es)",
        flush=True,
    )
    runs: dict[tuple[Scenario, int, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [
            pool.submit(
                simulate,
                s,
                k,
                n,
                args.generations,
                args.gpu_speed,
                args.jitter_s,
                args.input_prior,
                args.declared_lengths,
            )
            for s, k, n in tasks
        ]
        for i, f in enumerate(futures):
            scenario, k, name, summary, secs = f.result()
            runs[scenario, k, name] = summary
            print(f"  [{i + 1}/{len(tasks)}] {scenario} {k} {name}: {secs:.0f} s", file=sys.stderr)

    def mean(s: Scenario, n: str, key: str) -> float:
        return float(np.mean([runs[s, k, n][key] for k in jitters]))

    def ratio(scenarios: list[Scenario], n: str, peer: str, key: str) -> dict[str, list[float]]:
        """``n``'s ``key`` over ``peer``'s, per workload, one per jitter."""
        return {
            s[0]: [runs[s, k, n][key] / runs[s, k, peer][key] for k in jitters] for s in scenarios
        }

    rng = np.random.default_rng(0)
    ratios: dict[str, dict[str, list[float]]] = {}
    reach: dict[str, dict[str, Any]] = {}
    for title, scenarios in groups.items():
        rows = []
        for s in scenarios:
            for n in arms(s):
                cpu = mean(s, n, "cpu_utilisation")
                rows.append(
                    [s[0], n]
                    + [mean(s, n, k) / 3600 for k in ("avg_jct_s", "p99_jct_s", "makespan_s")]
                    + [mean(s, n, "gpu_utilisation"), "-" if math.isnan(cpu) else cpu]
                )
        print(f"## {title}")
        cols = ["workload", "policy", "avg JCT h", "p99 JCT h", "makespan h", "GPU util"]
        print(table([*cols, "CPU util"], rows))
        ratio_rows = []
        bounded = all(POOLED in arms(s) for s in scenarios)
        for peer in names[1:] + ([POOLED] if bounded else []):  # / the bound: how far from it
            for key in ("avg_jct_s", "p99_jct_s", "makespan_s"):
                by_workload = ratio(scenarios, "goodput-dp", peer, key)
                if key == "avg_jct_s":
                    ratios.setdefault(title, {})[peer] = [
                        v for vs in by_workload.values() for v in vs
                    ]
                med, lo, hi, worst = interval(by_workload, rng)
                ratio_rows.append(
                    [peer, key.removesuffix("_s"), med, f"[{lo:.3f}, {hi:.3f}]", worst]
                )
        print(
            table(["goodput-dp / peer", "measure", "median", "95% interval", "worst"], ratio_rows)
        )
        for n in [n for n in names[1:] if n in REACHING]:  # another CPU-aware arm, the same way
            rows = []
            for peer in [p for p in names if p not in (n, "goodput-dp")] + (
                [POOLED] if bounded else []
            ):
                med, lo, hi, worst = interval(ratio(scenarios, n, peer, "avg_jct_s"), rng)
                rows.append([peer, "avg_jct", med, f"[{lo:.3f}, {hi:.3f}]", worst])
            print(table([f"{n} / peer", "measure", "median", "95% interval", "worst"], rows))
        for n in [n for n in names if n in REACHING] if BLIND in names and bounded else ():
            r = _reach(runs, scenarios, jitters, rng, n)
            reach.setdefault(title, {})[n] = r
            print(
                f"{n}'s reach from {BLIND} to the pooled bound (avg JCT): median "
                f"{r['median']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}], worst {r['worst']:.2f}; "
                f"bound / blind median {r['headroom']:.3f} (per workload: "
                + ", ".join(f"{w} {v:.2f}" for w, v in r["by_workload"].items())
                + ")"
            )
        print()
    payload = {
        "machine": machine(),
        "seed": seed,
        "gpu_speed": args.gpu_speed,
        "input_prior": args.input_prior,
        "declared_lengths": args.declared_lengths,
        "jitter_seeds": args.jitter_seeds,
        "jitter_s": args.jitter_s,
        "runs": [
            {**r, "workload": s[0], "cores_per_gpu": s[1], "jitter": k, "policy": n}
            for (s, k, n), r in runs.items()
        ],
        "ratios": ratios,
        "reach": reach,
    }
    outs("bench_cpu.json").write_text(json.dumps(payload, indent=1, default=float))
    plots.cpu_ratios(ratios, outs("bench_cpu.png"))
    print(f"wrote {outs('bench_cpu.json')} and {outs('bench_cpu.png')}")
    return 0


def _reach(
    runs: dict[tuple[Scenario, int, str], dict[str, Any]],
    scenarios: list[Scenario],
    jitters: range,
    rng: np.random.Generator,
    policy: str = "goodput-dp",
) -> dict[str, Any]:
    """How much of the way from the CPU-blind policy to the pooled bound ``policy`` went on
    average JCT, per workload (its jitters' gaps summed): median, 95% interval, worst, and the
    bound's average JCT over blind's (the headroom; a workload without any is left out)."""
    by_workload, headroom = {}, []
    for s in scenarios:
        blind = sum(runs[s, k, BLIND]["avg_jct_s"] for k in jitters)
        dp = sum(runs[s, k, policy]["avg_jct_s"] for k in jitters)
        bound = sum(runs[s, k, POOLED]["avg_jct_s"] for k in jitters)
        headroom.append(bound / blind)
        if blind - bound > 1e-3 * blind:
            by_workload[s[0]] = (blind - dp) / (blind - bound)
    out = {"by_workload": by_workload, "headroom": float(np.median(headroom))}
    if not by_workload:
        return {**out, **dict.fromkeys(("median", "lo", "hi", "worst"), float("nan"))}
    med, lo, hi, _ = interval({w: [v] for w, v in by_workload.items()}, rng)
    return {**out, "median": med, "lo": lo, "hi": hi, "worst": min(by_workload.values())}


if __name__ == "__main__":
    sys.exit(main())
