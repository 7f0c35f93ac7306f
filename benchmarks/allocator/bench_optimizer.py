"""Decision time of the allocator's DP optimizer (targets: < 10 ms at 64 GPUs and 160 jobs,
< 300 ms at 2,048 GPUs and 1,000 jobs).

Jobs are drawn (seeded) from the six Pollux applications, with their fitted scaling models and
gradient-noise statistics, requested GPU counts as in the Pollux workloads and, as in a live
cluster, the allocation of the previous decision as their current one (so restart costs are in
play). Each cell times a full ``policy.decide`` (building every job's value table, the DP, and
node packing) and, separately, the DP alone (``optimize``). Admission first: at 64 GPUs only the
first 64 jobs (one GPU minimum each) enter the DP; the others wait. ``goodput-dp + CPUs``: the
same with 3 cores per GPU and each job's input pipeline known (Synergy's profile of its
application): the cores priced in the tables, placed and divided (same targets).
``goodput-dp + CPUs + pool``: the same with a CPU pool of 1 core per GPU for remote loader
workers, every job able to use it (the pool priced in and divided too; same targets).

    python -m benchmarks.allocator.bench_optimizer               # ~1 min
    python -m benchmarks.allocator.bench_optimizer --repeats 5   # quicker
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.allocator import plots
from dloader.allocator import Cluster, optimize
from dloader.allocator.cpu_profiles import APP_PROFILES, input_truth, read_cpu_profiles
from dloader.allocator.policies import DpPolicy, JobState, make_policy
from dloader.allocator.traces import PACKAGED_TRACES, AppTrace, load_apps

TRACES = PACKAGED_TRACES  # shipped with the package
CELLS = [  # (nodes, gpus per node, jobs)
    (16, 4, 40),
    (16, 4, 80),
    (16, 4, 160),
    (128, 4, 250),
    (256, 4, 500),
    (512, 4, 1000),
    (256, 8, 1000),
]
REQUESTS = [1, 1, 1, 1, 2, 4, 4, 8, 8, 12, 16, 32]


def jobs_for(
    apps: dict[str, AppTrace], n: int, seed: int, cpus: bool = False, pool: bool = False
) -> list[JobState]:
    rng = random.Random(seed)
    names = sorted(apps)
    profiles = read_cpu_profiles() if cpus else {}
    out = []
    for i in range(n):
        app = apps[rng.choice(names)]
        batch = rng.choice(app.validated_batches)
        epoch = rng.randrange(app.max_epochs)
        out.append(
            JobState(
                f"{app.name}-{i}",
                float(i),
                app.model,
                requested_gpus=rng.choice(REQUESTS),
                requested_batch=batch,
                batch_range=(app.init_batch, app.max_batch),
                local_bsz_range=app.local_bsz_range,
                noise=app.noise(batch, epoch),
                batch_size=batch,
                input=input_truth(app, profiles[APP_PROFILES[app.name]]) if cpus else None,
                remote_max=1e6 if pool else 0.0,
            )
        )
    return out


def with_placements(jobs: list[JobState], decision) -> list[JobState]:
    return [
        replace(
            j,
            placement=decision.placements.get(j.job_id, ()),
            batch_size=decision.batch_sizes.get(j.job_id, j.batch_size),
        )
        for j in jobs
    ]


def ms(f, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=Path, default=TRACES)
    p.add_argument("--repeats", type=int, default=15)
    add_out_dir(p)
    args = p.parse_args(argv)
    print(f"machine: {machine()}\n")
    apps = load_apps(args.traces)
    rows, results = [], []
    for policy_name, cpus, pool in (
        ("goodput-dp", False, False),
        ("goodput-dp", True, False),
        ("goodput-dp", True, True),
        ("elastic-gpu", False, False),
    ):
        policy = make_policy(policy_name)
        assert isinstance(policy, DpPolicy)
        label = policy_name + (" + CPUs" if cpus else "") + (" + pool" if pool else "")
        for nodes, per_node, n in CELLS:
            cluster = Cluster.uniform(nodes, per_node, 3.0 * per_node if cpus else None)
            if pool:
                cluster = replace(cluster, pool=float(nodes * per_node))
            jobs = jobs_for(apps, n, seed=n, cpus=cpus, pool=pool)
            jobs = with_placements(jobs, policy.decide(jobs, cluster))  # a warm, running state
            decide = ms(functools.partial(policy.decide, jobs, cluster), args.repeats)
            specs = [policy.spec(j, cluster) for j in jobs]
            solve = functools.partial(
                optimize, specs, cluster, objective=policy.objective, fairness=policy.fairness
            )
            plan = solve()
            dp = ms(solve, args.repeats)
            r = {
                "policy": label,
                "gpus": nodes * per_node,
                "gpus_per_node": per_node,
                "jobs": n,
                "admitted": len(plan.assignments),
                "decide_ms_p50": statistics.median(decide),
                "decide_ms_max": max(decide),
                "optimize_ms_p50": statistics.median(dp),
            }
            results.append(r)
            rows.append(list(r.values()))
            print(f"  {label} {r['gpus']} GPUs {n} jobs: {r['decide_ms_p50']:.1f} ms")
    print()
    print(
        table(
            [
                "policy",
                "GPUs",
                "GPUs/node",
                "jobs",
                "admitted",
                "decide ms p50",
                "decide ms max",
                "optimize ms p50",
            ],
            rows,
        )
    )
    print()
    for label in ("goodput-dp", "goodput-dp + CPUs", "goodput-dp + CPUs + pool"):
        mine = [r for r in results if r["policy"] == label]
        small = next(r for r in mine if r["gpus"] == 64 and r["jobs"] == 160)
        large = next(r for r in mine if r["gpus"] == 2048 and r["jobs"] == 1000)
        print(
            f"{label}, 64 GPUs / 160 jobs: {small['decide_ms_p50']:.1f} ms (target < 10); "
            f"2,048 GPUs / 1,000 jobs: {large['decide_ms_p50']:.0f} ms (target < 300)"
        )
    outs = outputs(args.out_dir)
    outs("bench_optimizer.json").write_text(
        json.dumps({"machine": machine(), "results": results}, indent=1)
    )
    plots.decision_time(results, outs("bench_optimizer.png"))
    print(f"wrote {outs('bench_optimizer.json')} and {outs('bench_optimizer.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
