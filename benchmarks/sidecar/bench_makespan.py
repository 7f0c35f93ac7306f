"""Jobs that arrive and finish: makespan under the even vs the adaptive sidecar.

Each job trains a fixed number of samples (not a fixed time), starting with 4 workers, under a
sidecar with the same worker budget. Two arrival orders:

* ``a``: io_heavy at 0 s, cpu_heavy at 10 s, gpu_bound at 20 s. The gpu_bound job, last to
  arrive and already at its accelerator limit with one worker, sets a floor (20 s + ~32 s) that
  no loader allocation can lower;
* ``b``: the same jobs in reverse order: the data-starved io_heavy job arrives last and is on
  the critical path, where the loader allocation matters.

Reported: each job's run time, the makespan (first start to last end), its floor (each job
from its start through its samples at its accelerator limit: what no loader allocation can
beat) and the adaptive/even ratio (target, issue #22: adaptive <= 0.85x even in both orders);
a PNG shows each run's jobs' throughput and worker counts over time.

    python -m benchmarks.sidecar.bench_makespan                  # both orders, ~6 min
    python -m benchmarks.sidecar.bench_makespan --workload a     # ~3 min
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.sidecar import plots
from dloader.apps.experiment import run_jobs, sidecar_process

WORKLOADS = {
    "a": [("io_heavy", 0.0, 50_000), ("cpu_heavy", 10.0, 15_000), ("gpu_bound", 20.0, 5_000)],
    "b": [("gpu_bound", 0.0, 5_000), ("cpu_heavy", 10.0, 15_000), ("io_heavy", 20.0, 50_000)],
}


def run(
    policy: str, budget: int, workload: list[tuple[str, float, int]], folder: Path
) -> dict[str, Any]:
    with sidecar_process(folder, policy=policy, worker_budget=budget) as sc:
        return run_jobs(
            [(name, 4, at, samples) for name, at, samples in workload], folder, sidecar=sc.target
        )


def floor(results: dict[str, Any], samples: dict[str, int]) -> float:
    """The makespan no loader allocation can beat in this run: each job from its start (as it
    happened: arrival and start-up) through its samples at its accelerator limit (its data never
    late), the latest of them."""
    first = min(r["started"] for r in results.values())
    return max(r["started"] - first + samples[n] / r["limit"] for n, r in results.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sidecar.bench_makespan", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--budget", type=int, default=24, help="node worker budget (default: 24)")
    p.add_argument(
        "--workload", choices=["a", "b", "both"], default="both", help="arrival order (see above)"
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="every job's samples and arrival time times this (default: 1; the slow test runs 0.1)",
    )
    add_out_dir(p)
    args = p.parse_args(argv)
    if args.budget < 3:
        p.error("--budget must be >= 3 (one worker per job)")
    if not 0 < args.scale <= 10:
        p.error(f"--scale {args.scale:g}: expected a factor in (0, 10]")
    outs = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-makespan-"))
    names = ["a", "b"] if args.workload == "both" else [args.workload]
    rows, result, runs, floors = [], {}, {}, {}
    for w in names:
        workload = [
            (n, at * args.scale, max(int(samples * args.scale), 1))
            for n, at, samples in WORKLOADS[w]
        ]
        for policy in ("even", "adaptive"):
            print(f"  workload {w}, {policy} ...", file=sys.stderr, flush=True)
            res = run(policy, args.budget, workload, tmp / f"{w}-{policy}")
            start = min(r["started"] for r in res.values())
            makespan = max(r["ended"] for r in res.values()) - start
            result[f"{w}/{policy}"] = makespan
            floors[f"{w}/{policy}"] = floor(res, {n: s for n, _, s in workload})
            runs[f"workload {w}, {policy}: makespan {makespan:.0f} s"] = res
            order = ", ".join(f"{n} ({s:,} samples) at {a:g} s" for n, a, s in workload)
            times = [f"{res[n]['ended'] - res[n]['started']:.0f}" for n in sorted(res)]
            rows.append([w, order, policy, makespan, floors[f"{w}/{policy}"], *times])
    print(
        table(
            ["workload", "arrivals", "policy", "makespan s", "floor s"]
            + [f"{n} run s" for n in sorted(WORKLOADS["a"][i][0] for i in range(3))],
            rows,
        )
    )
    ratios = {w: result[f"{w}/adaptive"] / result[f"{w}/even"] for w in names}
    for w, r in ratios.items():
        best = floors[f"{w}/adaptive"] / result[f"{w}/even"]
        print(
            f"workload {w}: adaptive makespan / even = {r:.2f} (target <= 0.85); no allocation "
            f"could go below {best:.2f} (the adaptive run's floor / even's makespan)"
        )
    plots.jobs_timeline(
        runs, max(result.values()) + 1, outs("bench_makespan.png"), "Jobs arrive and finish"
    )
    outs("bench_makespan.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "budget": args.budget,
                "scale": args.scale,
                "makespan": result,
                "floor": floors,
                "ratio": ratios,
            },
            indent=1,
        )
    )
    print(f"wrote {outs('bench_makespan.json')} and {outs('bench_makespan.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
