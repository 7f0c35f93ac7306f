"""Admission by attained service (``goodput-dp``'s ``las`` line) against first come, first
served and against Pollux's policy, each ratio with its noise.

Every scenario runs in the same simulator: 16 nodes x 4 GPUs, 60 s decisions, 30 s restarts,
online learning, unlimited cores (the setting of #48's comparison). Workloads: Pollux workloads
1-4 and ``--philly N`` 160-job draws from the Philly trace (a new base seed per run unless
``--seed``; printed), each run ``--jitter-seeds K`` times with every arrival moved by up to
``--jitter-s`` seconds (:func:`dloader.allocator.traces.jitter_arrivals`, seed = the jitter's
index). Arms: ``goodput-dp-fifo`` (first-come admission: ``fifo``), ``goodput-dp`` (``las``
admission) at each threshold of ``--thresholds`` (``las@T``, GPU-seconds), and the peers of
``--peers`` (``pollux``: its genetic search makes it the slow arm). With ``--declared-lengths
SIGMA`` every job declares its length (its true one times ``exp(N(0, SIGMA))``), which the
``goodput-dp`` arms weigh and the peer ``goodput-dp-no-lengths`` ignores.

Per ratio (an ``las`` arm over ``fifo`` or a peer; average JCT, p99 JCT, makespan): the median
over all scenarios with a 95% interval (a bootstrap that resamples workloads, keeping each
workload's jitters together: they are not independent draws), and the worst workload (the mean
over its jitters). Restarts per job for every arm.

    python -m benchmarks.allocator.bench_admission                 # ~2.5 h on 2 cores
    python -m benchmarks.allocator.bench_admission --philly 16 --peers '' --thresholds 450,900,1800
    python -m benchmarks.allocator.bench_admission --declared-lengths 0 \\
        --peers goodput-dp-no-lengths

Prints the tables, writes ``bench_admission.json`` and ``bench_admission.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from benchmarks.allocator.bench_pool import pollux_workloads, workload
from dloader.allocator import Cluster
from dloader.allocator.policies import DpPolicy, make_policy
from dloader.allocator.simulator import MAX_DECLARED_SIGMA, Simulator
from dloader.allocator.traces import jitter_arrivals

PEERS = (
    "pollux",
    "goodput-dp-parametric",
    "goodput-dp-extrapolated",
    "goodput-dp-cpu-blind",
    "goodput-dp-no-lengths",
)
METRICS = (("avg_jct_s", "avg JCT"), ("p99_jct_s", "p99 JCT"), ("makespan_s", "makespan"))
BOOTSTRAP = 4000


def simulate(
    label: str,
    jitter: int,
    arm: str,
    jitter_s: float,
    num_jobs: int,
    declared: float | None = None,
) -> tuple[str, int, str, Any]:
    """One arm of one scenario: (label, jitter, arm, summary with its seconds)."""
    jobs, apps = workload(label, num_jobs)
    jobs = jitter_arrivals(jobs, seed=jitter, seconds=jitter_s)
    if arm.startswith("las@"):
        policy = make_policy("goodput-dp")
        assert isinstance(policy, DpPolicy)
        policy.las_threshold_gpu_s = float(arm[4:])
    else:
        policy = make_policy("goodput-dp-fifo" if arm == "fifo" else arm)
    began = time.perf_counter()
    sim = Simulator(jobs, apps, policy, Cluster.uniform(16, 4), declared_lengths=declared)
    summary = sim.run().summary()
    summary["seconds"] = time.perf_counter() - began
    return label, jitter, arm, summary


def interval(ratios: dict[str, list[float]], rng: np.random.Generator) -> tuple[float, ...]:
    """(median, 2.5%, 97.5%, worst workload) of ratios per workload (its jitters): the
    interval from resampling workloads with their jitters."""
    groups = [np.asarray(v) for v in ratios.values()]
    flat = np.concatenate(groups)
    picks = rng.integers(0, len(groups), (BOOTSTRAP, len(groups)))
    medians = [np.median(np.concatenate([groups[i] for i in row])) for row in picks]
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return float(np.median(flat)), float(lo), float(hi), max(float(g.mean()) for g in groups)


def check_declared_lengths(p: argparse.ArgumentParser, sigma: float | None) -> None:
    """``--declared-lengths SIGMA``: none, or a log-normal sigma the simulator takes."""
    if sigma is not None and not 0 <= sigma <= MAX_DECLARED_SIGMA:
        p.error(f"--declared-lengths={sigma}: expected a sigma in [0, {MAX_DECLARED_SIGMA:g}]")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.allocator.bench_admission",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", default="1,2,3,4", help="Pollux workloads (default 1,2,3,4)")
    p.add_argument("--philly", type=int, default=16, help="160-job Philly draws (default 16)")
    p.add_argument("--seed", type=int, help="first Philly seed (default: a new one, printed)")
    p.add_argument("--jobs", type=int, default=160, help="jobs per Philly draw (default 160)")
    p.add_argument("--jitter-seeds", type=int, default=3, help="runs per workload (default 3)")
    p.add_argument("--jitter-s", type=float, default=30.0, help="arrival shift bound (30 s)")
    p.add_argument("--thresholds", default="900", help="las thresholds, GPU-s (default 900)")
    p.add_argument("--peers", default="pollux", help=f"some of {','.join(PEERS)} (pollux)")
    p.add_argument(
        "--declared-lengths",
        type=float,
        metavar="SIGMA",
        help="every job declares its length, off by exp(N(0, SIGMA)) (0: exact), which "
        "goodput-dp weighs (peer goodput-dp-no-lengths ignores it); default: none declared",
    )
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    pollux = pollux_workloads(p, args.workloads)
    try:
        thresholds = [float(x) for x in args.thresholds.split(",") if x]
    except ValueError:
        p.error(f"--thresholds={args.thresholds!r}: expected comma-separated numbers")
    peers = [x for x in args.peers.split(",") if x]
    if any(x not in PEERS for x in peers):
        p.error(f"--peers={args.peers!r}: expected some of {PEERS}")
    if not thresholds or min(thresholds) <= 0:
        p.error(f"--thresholds={args.thresholds!r}: expected GPU-seconds > 0")
    if args.philly < 0 or args.jitter_seeds < 1 or args.processes < 1 or args.jobs < 1:
        p.error("expected --philly >= 0, --jitter-seeds >= 1, --processes >= 1, --jobs >= 1")
    if not (0 <= args.jitter_s < 3600):
        p.error(f"--jitter-s={args.jitter_s}: expected seconds in [0, 3600)")
    check_declared_lengths(p, args.declared_lengths)
    seed = random.randrange(1, 1 << 30) if args.seed is None else args.seed
    labels = [f"pollux-{w}" for w in pollux] + [f"philly-{seed + i}" for i in range(args.philly)]
    if not labels:
        p.error("no workload: give --workloads or --philly")
    las = [f"las@{t:g}" for t in thresholds]
    arms = ["fifo", *las, *peers]
    out = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(
        f"16 x 4 GPUs, unlimited cores, online learning; {args.jobs}-job Philly draws, seeds "
        f"{seed}..{seed + args.philly - 1} (--seed {seed} to repeat); {args.jitter_seeds} "
        f"jitter seeds of +-{args.jitter_s:g} s; arms {', '.join(arms)}; lengths "
        + (
            "not declared"
            if args.declared_lengths is None
            else f"declared (sigma {args.declared_lengths:g})"
        ),
        flush=True,
    )
    tasks = [(lab, k, arm) for lab in labels for k in range(args.jitter_seeds) for arm in arms]
    runs: dict[tuple[str, int, str], dict[str, Any]] = {}
    began = time.perf_counter()
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [
            pool.submit(simulate, *t, args.jitter_s, args.jobs, args.declared_lengths)
            for t in tasks
        ]
        for i, f in enumerate(futures):
            lab, k, arm, summary = f.result()
            runs[lab, k, arm] = summary
            print(
                f"  [{i + 1}/{len(tasks)}] {lab} jitter {k} {arm}: "
                f"{summary['avg_jct_s'] / 3600:.3f} h ({summary['seconds']:.0f} s; "
                f"{time.perf_counter() - began:.0f} s in all)",
                file=sys.stderr,
                flush=True,
            )
    rng = np.random.default_rng(0)
    jitters = range(args.jitter_seeds)
    result: dict[str, Any] = {
        "machine": machine(),
        "seed": seed,
        "labels": labels,
        "declared_lengths": args.declared_lengths,
        "ratios": {},
    }
    rows = []
    for arm in las:
        for ref in ("fifo", *peers):
            for key, name in METRICS:
                per = {
                    lab: [runs[lab, k, arm][key] / runs[lab, k, ref][key] for k in jitters]
                    for lab in labels
                }
                med, lo, hi, worst = interval(per, rng)
                result["ratios"][f"{arm} / {ref}: {name}"] = {
                    "per_workload": per, "median": med, "interval": [lo, hi], "worst": worst,
                }  # fmt: skip
                rows.append([f"{arm} / {ref}", name, med, f"[{lo:.3f}, {hi:.3f}]", worst])
    print()
    print(table(["ratio", "metric", "median", "95% interval", "worst workload"], rows))
    arm_rows = []
    for arm in arms:
        each = [runs[lab, k, arm] for lab in labels for k in jitters]
        arm_rows.append(
            [
                arm,
                f"{sum(r['jobs_completed'] for r in each)}/{sum(r['jobs'] for r in each)}",
                float(np.mean([r["avg_jct_s"] / 3600 for r in each])),
                float(np.mean([r["restarts"] / r["jobs"] for r in each])),
                float(np.median([r["seconds"] for r in each])),
            ]
        )
    print()
    print(
        table(
            ["arm", "jobs done", "avg JCT h (mean)", "restarts per job", "run s (median)"],
            arm_rows,
        )
    )
    per_workload = [
        [
            lab,
            *(float(np.mean([runs[lab, k, a]["avg_jct_s"] for k in jitters])) / 3600 for a in arms),
        ]
        for lab in labels
    ]
    print()
    print(table(["workload", *(f"{a} h" for a in arms)], per_workload))
    result["runs"] = [
        {"workload": lab, "jitter": k, "arm": arm, **s} for (lab, k, arm), s in runs.items()
    ]
    out("bench_admission.json").write_text(json.dumps(result, indent=1, default=float))
    plots.ratio_intervals(result["ratios"], labels, out("bench_admission.png"))
    print(f"\nwrote {out('bench_admission.json')} and {out('bench_admission.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
