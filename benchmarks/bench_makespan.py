"""Jobs that arrive and finish: makespan under the even vs the adaptive sidecar.

io_heavy arrives at 0 s, cpu_heavy at 10 s, gpu_bound at 20 s; each trains a fixed number of
samples (not a fixed time), starting with 4 workers, under a sidecar with the same worker budget.
Reported: each job's completion time and the makespan (first start to last end), and the
adaptive/even ratio (target: adaptive >= 10% shorter).

    python -m benchmarks.bench_makespan          # ~3 min
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import machine, out_path, table
from sidecar.experiment import run_jobs, sidecar_process

WORKLOAD = [("io_heavy", 0.0, 50_000), ("cpu_heavy", 10.0, 15_000), ("gpu_bound", 20.0, 5_000)]


def run(policy: str, budget: int, tmp: Path) -> dict[str, Any]:
    folder = tmp / policy
    with sidecar_process(folder, policy=policy, worker_budget=budget) as sc:
        return run_jobs(
            [(name, 4, at, samples) for name, at, samples in WORKLOAD], folder, sidecar=sc.target
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_makespan", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--budget", type=int, default=24, help="node worker budget (default: 24)")
    args = p.parse_args(argv)
    if args.budget < 3:
        p.error("--budget must be >= 3 (one worker per job)")
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-makespan-"))
    rows, result = [], {}
    for policy in ("even", "adaptive"):
        print(f"  {policy} ...", file=sys.stderr, flush=True)
        res = run(policy, args.budget, tmp)
        start = min(r["started"] for r in res.values())
        makespan = max(r["ended"] for r in res.values()) - start
        result[policy] = makespan
        rows.append(
            [policy, makespan] + [res[n]["ended"] - res[n]["started"] for n, _, _ in WORKLOAD]
        )
    print(
        table(
            ["policy", "makespan s"]
            + [f"{n} ({s:,} samples, at {a:g} s) s" for n, a, s in WORKLOAD],
            rows,
        )
    )
    ratio = result["adaptive"] / result["even"]
    print(f"\nadaptive makespan / even = {ratio:.2f} (target <= 0.90)")
    out_path("bench_makespan.json").write_text(
        json.dumps(
            {"machine": machine(), "budget": args.budget, "makespan": result, "ratio": ratio},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
