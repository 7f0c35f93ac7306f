"""The headline: three emulated jobs share this node; how much useful throughput do they get?

The testbed's io_heavy, cpu_heavy and gpu_bound jobs (docs/architecture.md) run concurrently as
separate processes, each starting with the same worker count (4), under

(a) ``even``: a sidecar with the even policy (the node's workers split equally);
(b) ``adaptive``: a sidecar with the adaptive policy (it explores, models, re-divides);
each at the same node worker budget: 12 (even: 4 each, the architecture doc's baseline) and 24;
(c) ``static best``: no sidecar, the best fixed split within the same budget found by a small
grid search (jobs that know their best worker count in advance, which nobody does).

Score: the sum over jobs of samples/s divided by the job's accelerator limit, over the last
``--window`` seconds of each run (the adaptive sidecar needs the first part to explore).
Also: each job's accelerator idle share, and when the adaptive run reached 95% of its final
score. A PNG shows per-job throughput and worker counts over time.

    python -m benchmarks.bench_sidecar              # ~13 min
    python -m benchmarks.bench_sidecar --quick      # ~2 min, budget 12 only, shorter runs
    python -m benchmarks.bench_sidecar --mix real   # the real-pipeline mix
                                                    # (dloader.apps.pipelines): JPEG decode +
                                                    # crop/flip/normalise, text tokenise + pack,
                                                    # remote reads with a tail

Also (d) ``no sidecar``: every job keeps its 4 workers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import machine, out_path, table
from dloader.apps.experiment import JobPlan, run_jobs, score, sidecar_process
from dloader.apps.testbed import PROFILES, REAL_MIX, make_dataset

JOBS: tuple[str, ...] = ("io_heavy", "cpu_heavy", "gpu_bound")
START_WORKERS = 4
#: per mix: the static splits searched for each node budget (only those within it compete)
GRIDS = {
    "emulated": {
        12: {"io_heavy": (8, 9, 10), "cpu_heavy": (1, 2, 3), "gpu_bound": (1,)},
        24: {"io_heavy": (12, 16, 20), "cpu_heavy": (1, 2, 3), "gpu_bound": (1,)},
    },
    "real": {
        12: {"image_jpeg": (1, 2, 3), "text_pack": (1, 2), "remote_read": (7, 8, 9)},
        24: {"image_jpeg": (1, 2, 3), "text_pack": (1, 2), "remote_read": (14, 18, 21)},
    },
}
QUICK_GRIDS = {
    "emulated": {12: {"io_heavy": (9,), "cpu_heavy": (1, 2), "gpu_bound": (1,)}},
    "real": {12: {"image_jpeg": (1, 2), "text_pack": (1,), "remote_read": (9,)}},
}


def with_sidecar(
    policy: str, budget: int, seconds: float, tmp: Path, extra: list[str]
) -> dict[str, Any]:
    folder = tmp / f"{policy}-{budget}"
    with sidecar_process(folder, policy=policy, worker_budget=budget) as sc:
        return run_jobs(
            specs(START_WORKERS), folder, seconds=seconds, sidecar=sc.target, extra=extra
        )


_REGISTERED = re.compile(r"job (\S+) \((\S+)\) registered")
_PREDICTED = re.compile(r"job (\S+): (\d+) workers \((\d+) workers: predicted ([\d,]+) samples/s")


def prediction_errors(log: Path, per: dict[str, Any]) -> dict[str, float | None]:
    """Per job: the adaptive sidecar's last prediction for the worker count the job ran in the
    scored window, vs what it measured there: ``|predicted / measured - 1|`` (None: no
    prediction was logged for that count)."""
    names: dict[str, str] = {}
    last: dict[str, tuple[int, float]] = {}
    for line in log.read_text().splitlines():
        if m := _REGISTERED.search(line):
            names[m.group(1)] = m.group(2)
        elif m := _PREDICTED.search(line):
            last[names.get(m.group(1), m.group(1))] = (
                int(m.group(2)),
                float(m.group(4).replace(",", "")),
            )
    out: dict[str, float | None] = {}
    for job, p in per.items():
        k, predicted = last.get(job, (None, 0.0))
        ok = k == p["workers"] and p["samples_per_s"] > 0
        out[job] = abs(predicted / p["samples_per_s"] - 1) if ok else None
    return out


def specs(workers: int | dict[str, int]) -> list[JobPlan]:
    counts = workers if isinstance(workers, dict) else dict.fromkeys(JOBS, workers)
    return [(name, counts[name], 0.0, None) for name in JOBS]


def converged_at(results: dict[str, Any], final: float, seconds: float) -> float | None:
    for t in range(0, int(seconds) - 5):
        if score(results, t, t + 5)[0] >= 0.95 * final:
            return float(t)
    return None


def plot(runs: dict[str, dict[str, Any]], seconds: float, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.8 * len(runs)), sharex=True)
    for ax, (label, results) in zip(axes, runs.items(), strict=True):
        ax2 = ax.twinx()
        for name, r in results.items():
            ts = [i * 1.0 for i in range(int(seconds))]
            norm = [sum(x[1] for x in r["timeline"] if t <= x[0] < t + 1) / r["limit"] for t in ts]
            line = ax.plot(ts, norm, label=f"{name} throughput/limit")[0]
            ax2.step(
                [x[0] for x in r["timeline"]],
                [x[3] for x in r["timeline"]],
                where="post",
                color=line.get_color(),
                ls=":",
                alpha=0.8,
            )
        ax.set_ylabel("throughput / limit")
        ax2.set_ylabel("workers (dotted)")
        ax.set_ylim(0, 1.1)
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("seconds")
    fig.suptitle(f"Three jobs on one node\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_sidecar",
        description="Three emulated jobs on one node: even vs adaptive vs the best static split.",
    )
    p.add_argument(
        "--seconds", type=float, help="length of a sidecar run (default: 90, --quick: 40)"
    )
    p.add_argument(
        "--window", type=float, help="scored final window, seconds (default: 30, --quick: 12)"
    )
    p.add_argument(
        "--grid-seconds", type=float, help="length of a grid run (default: 25, --quick: 15)"
    )
    p.add_argument("--quick", action="store_true", help="shorter runs, smaller grid")
    p.add_argument(
        "--jpegs",
        type=int,
        default=3000,
        help="real mix: JPEG files the image job reads (generated once into the cache)",
    )
    p.add_argument(
        "--out-dir", type=Path, help="where the JSON and the PNG go (default: benchmarks/out)"
    )
    p.add_argument(
        "--mix",
        choices=sorted(GRIDS),
        default="emulated",
        help="emulated: the testbed's three profiles (docs/architecture.md); real: the "
        "real-pipeline mix",
    )
    args = p.parse_args(argv)
    global JOBS
    JOBS = REAL_MIX if args.mix == "real" else JOBS
    grids = (QUICK_GRIDS if args.quick else GRIDS)[args.mix]
    for name, full, quick in (
        ("seconds", 90.0, 40.0),
        ("window", 30.0, 12.0),
        ("grid_seconds", 25.0, 15.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.window >= args.seconds:
        p.error(f"--window {args.window:g} must be shorter than --seconds {args.seconds:g}")
    if args.jpegs < 1:
        p.error(f"--jpegs {args.jpegs}: expected at least 1")
    extra = ["--jpegs", str(args.jpegs)]
    outs = (lambda name: args.out_dir / name) if args.out_dir else out_path
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    runs, rows = {}, []
    best: dict[int, tuple[float, str]] = {}
    if args.mix == "real":  # generate the JPEGs first: not inside the first run's time
        make_dataset(PROFILES["image_jpeg"], 1, args.jpegs)
    print(f"  no sidecar: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
    res = run_jobs(specs(START_WORKERS), tmp / "none", seconds=args.seconds, extra=extra)
    runs["no sidecar (4 each)"] = res
    rows.append(("no sidecar (4 each)", *score(res, args.seconds - args.window, args.seconds)))
    for budget, grid in grids.items():
        for policy in ("even", "adaptive"):
            label = f"{policy}, budget {budget}"
            print(f"  {label}: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
            res = with_sidecar(policy, budget, args.seconds, tmp, extra)
            runs[label] = res
            total, per = score(res, args.seconds - args.window, args.seconds)
            rows.append((label, total, per))
        combos = [c for c in itertools.product(*grid.values()) if sum(c) <= budget]
        found: tuple[float, dict[str, Any], dict[str, int], dict[str, Any]] | None = None
        for i, combo in enumerate(combos):
            workers = dict(zip(grid, combo, strict=True))
            print(
                f"  budget {budget} grid [{i + 1}/{len(combos)}] {workers} ...",
                file=sys.stderr,
                flush=True,
            )
            res = run_jobs(
                specs(workers), tmp / f"grid-{budget}-{i}", seconds=args.grid_seconds, extra=extra
            )
            total, per = score(
                res,
                args.grid_seconds - args.window * args.grid_seconds / args.seconds,
                args.grid_seconds,
            )
            if found is None or total > found[0]:
                found = (total, per, workers, res)
        assert found is not None
        label = f"static best, budget {budget}: " + "/".join(str(found[2][j]) for j in JOBS)
        runs[label] = found[3]
        rows.append((label, found[0], found[1]))
        best[budget] = (found[0], label)
    base = next(t for n, t, _ in rows if n == f"even, budget {START_WORKERS * len(JOBS)}")
    headers = [
        "run",
        "sum throughput/limit",
        "vs even (4 each)",
        *(f"{j} (workers, idle)" for j in JOBS),
    ]
    print(
        table(
            headers,
            [
                [name, total, total / base]
                + [
                    f"{per[j]['normalized']:.2f} ({per[j]['workers']}, {per[j]['idle']:.0%})"
                    for j in JOBS
                ]
                for name, total, per in rows
            ],
        )
    )
    summary = {}
    none = rows[0][1]
    targets = {"emulated": (1.27, 1.00), "real": (1.15, 0.97)}[args.mix]
    for budget in grids:
        even = next(t for n, t, _ in rows if n == f"even, budget {budget}")
        label = f"adaptive, budget {budget}"
        adaptive, per = next((t, q) for n, t, q in rows if n == label)
        conv = converged_at(runs[label], adaptive, args.seconds)
        errors = prediction_errors(tmp / f"adaptive-{budget}" / "sidecar.log", per)
        better = max(even, none)
        summary[budget] = {
            "adaptive_vs_better_baseline": adaptive / better,
            "adaptive_vs_even_same_budget": adaptive / even,
            "adaptive_vs_no_sidecar": adaptive / none,
            "adaptive_vs_static_best_same_budget": adaptive / best[budget][0],
            "converged_s": conv,
            "prediction_error": errors,
        }
        print(
            f"budget {budget}: adaptive / the better of (no sidecar, even at this budget) = "
            f"{adaptive / better:.2f} (target >= {targets[0]:.2f}); adaptive / the best static "
            f"split within this budget = {adaptive / best[budget][0]:.2f} (target >= "
            f"{targets[1]:.2f}); reached 95% of its final score after "
            f"{conv if conv is not None else 'n/a'} s; the model's error on the final worker "
            "counts: "
            + ", ".join(f"{j} {e:.0%}" if e is not None else f"{j} n/a" for j, e in errors.items())
        )
    stem = "bench_sidecar" if args.mix == "emulated" else f"bench_sidecar_{args.mix}"
    outs(f"{stem}.json").write_text(
        json.dumps(
            {"machine": machine(), "rows": [[n, t, per] for n, t, per in rows], "summary": summary},
            indent=1,
        )
    )
    plot(runs, args.seconds, outs(f"{stem}.png"))
    print(f"wrote {outs(stem + '.json')} and {outs(stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
