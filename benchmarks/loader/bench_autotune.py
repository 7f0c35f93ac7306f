"""``num_workers="auto"`` against the best fixed worker count, found by sweeping in the same run.

For each testbed profile alone on this node (the emulated io/cpu/gpu-bound jobs and the real
JPEG, text and remote-read pipelines), each a separate process as a user would run it:

* ``fixed N`` for every N of ``--counts``: samples/s over the run after ``--warmup`` seconds;
* ``auto``: samples/s over its whole run after the same warm-up, so the search's cost counts;
  when its first search ended (it held a count), and the last change of its worker count (a
  later change: a probe of one more worker, or a new search when the job drifted);
* ``again``: the best count of the sweep and ``auto`` once more each, ``--repeats`` times,
  alternating, each as long as an auto run. The best of the sweep's noisy means is biased
  upwards (the winner's curse); measured again, it is not, and auto is compared with both.

Then pairs of jobs side by side (``--pairs``): both ``auto`` (``--repeats`` runs, mean) against
the best static split, found by a coordinate search over the two counts (from each job's best
count alone, each job's count varied over ``--counts`` in turn until no change helps; a job
not in ``--profiles`` gets one fixed sweep to find that count). Score of
a pair: the sum of each job's samples/s over its accelerator limit. The split the search found
is the best of many short noisy runs, so its score there is biased upward (the winner's curse):
it is run again, as long as ``auto`` and alternating with it, and ``auto`` is compared with
both scores.

    python -m benchmarks.loader.bench_autotune              # ~2 h (two passes, and again)
    python -m benchmarks.loader.bench_autotune --quick      # ~4 min: two profiles, short runs

Prints the tables, writes ``bench_autotune.json`` and ``bench_autotune.png`` (fixed counts as
bars, auto as a line, per profile; static split and auto scores as bars, per pair).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots
from dloader.apps.experiment import run_jobs, score
from dloader.apps.testbed import PROFILES

ALL = ("io_heavy", "cpu_heavy", "gpu_bound", "image_jpeg", "text_pack", "remote_read")
COUNTS = (1, 2, 3, 4, 6, 8, 11, 14, 18, 24)
PAIRS = ("image_jpeg+text_pack", "io_heavy+cpu_heavy")


def _rate(result: dict[str, Any], start: float, end: float) -> float:
    """One run's samples/s over ``[start, end)`` (the experiment harness's own measure)."""
    return float(score({"run": result}, start, end)[1]["run"]["samples_per_s"])


def settled_at(result: dict[str, Any]) -> float:
    """Seconds into the run of the last change of the worker count."""
    last, when = None, 0.0
    for t, _, _, workers in result["timeline"]:
        if workers != last:
            last, when = workers, t
    return when


def run(
    plan: Sequence[tuple[str, int | str]], seconds: float, folder: Path, extra: Sequence[str]
) -> dict[str, Any]:
    jobs = [(name, n, 0.0, None) for name, n in plan]
    return run_jobs(jobs, folder, seconds=seconds, extra=extra)


def sweep(
    name: str,
    fixed: dict[int, list[float]],
    rep: int,
    args: argparse.Namespace,
    folder: Path,
    extra: Sequence[str],
) -> None:
    """One pass of ``name`` alone at every count of ``--counts`` (in reverse on odd passes),
    each run's samples/s appended to ``fixed``."""
    counts = list(args.counts) if rep % 2 == 0 else list(reversed(args.counts))
    for n in counts:
        print(f"  {name}: fixed {n} x {args.fixed_seconds:g} s", file=sys.stderr, flush=True)
        r = run([(name, n)], args.fixed_seconds, folder, extra)[name]
        fixed.setdefault(n, []).append(_rate(r, args.warmup, args.fixed_seconds))


def alone(
    name: str, args: argparse.Namespace, folder: Path, extra: Sequence[str]
) -> dict[str, Any]:
    """The fixed sweep and the auto run of one profile, ``--repeats`` passes (each pass: the
    sweep, then auto; the order of the sweep alternates), means per configuration."""
    fixed: dict[int, list[float]] = {}
    autos, runs = [], []
    for rep in range(args.repeats):
        sweep(name, fixed, rep, args, folder, extra)
        print(f"  {name}: auto x {args.auto_seconds:g} s", file=sys.stderr, flush=True)
        r = run([(name, "auto")], args.auto_seconds, folder, extra)[name]
        autos.append(_rate(r, args.warmup, args.auto_seconds))
        runs.append(r)
    mean = {n: sum(v) / len(v) for n, v in fixed.items()}
    best = max(mean, key=lambda n: mean[n])
    auto = sum(autos) / len(autos)
    again = []
    for _ in range(args.repeats):
        print(f"  {name}: fixed {best} again, then auto", file=sys.stderr, flush=True)
        r = run([(name, best)], args.auto_seconds, folder, extra)[name]
        again.append(_rate(r, args.warmup, args.auto_seconds))
        r = run([(name, "auto")], args.auto_seconds, folder, extra)[name]
        autos.append(_rate(r, args.warmup, args.auto_seconds))
        runs.append(r)
    late, best_again = sum(autos[args.repeats :]) / args.repeats, sum(again) / len(again)
    return {
        "fixed": mean,
        "fixed_runs": fixed,
        "best_count": best,
        "auto": auto,
        "auto_runs": autos,
        "ratio": auto / mean[best],
        "best_again_runs": again,
        "best_again": best_again,
        "auto_again": late,
        "ratio_again": late / best_again,
        "settled_s": max(settled_at(r) for r in runs),
        "search_s": None
        if any(r.get("search_s") is None for r in runs)
        else max(r["search_s"] for r in runs),
        "auto_final_workers": [r["timeline"][-1][3] for r in runs],
        "tuner": runs[-1].get("tuner", ""),
        "auto_timeline": [(t, w) for t, _, _, w in runs[-1]["timeline"]],
    }


def pair(
    names: tuple[str, str],
    start: dict[str, int],
    args: argparse.Namespace,
    folder: Path,
    extra: Sequence[str],
) -> dict[str, Any]:
    """Two jobs side by side: the best static split by coordinate search, then both auto."""
    seen: dict[tuple[int, int], float] = {}

    def total(split: tuple[int, int]) -> float:
        if split not in seen:
            print(f"  {'+'.join(names)}: fixed {split}", file=sys.stderr, flush=True)
            r = run(list(zip(names, split, strict=True)), args.fixed_seconds, folder, extra)
            seen[split] = score(r, args.warmup, args.fixed_seconds)[0]
        return seen[split]

    best = (start[names[0]], start[names[1]])
    improved = True
    while improved:
        improved = False
        for axis in (0, 1):
            for n in args.counts:
                split = (n, best[1]) if axis == 0 else (best[0], n)
                if total(split) > total(best):
                    best, improved = split, True
    autos, again = [], []
    for rep in range(args.repeats):
        label = f"  {'+'.join(names)}: ({rep + 1}) "
        print(f"{label}static {best} again", file=sys.stderr, flush=True)
        r = run(list(zip(names, best, strict=True)), args.auto_seconds, folder, extra)
        again.append(score(r, args.warmup, args.auto_seconds)[0])
        print(f"{label}auto + auto", file=sys.stderr, flush=True)
        r = run([(names[0], "auto"), (names[1], "auto")], args.auto_seconds, folder, extra)
        autos.append(score(r, args.warmup, args.auto_seconds)[0])
    auto, per = sum(autos) / len(autos), score(r, args.warmup, args.auto_seconds)[1]
    static_again = sum(again) / len(again)
    return {
        "start": [start[n] for n in names],
        "static_best": list(best),
        "static_score": seen[best],
        "static_again_runs": again,
        "static_again": static_again,
        "splits_tried": len(seen),
        "auto": auto,
        "auto_runs": autos,
        "ratio": auto / seen[best],
        "ratio_again": auto / static_again,
        "auto_final_workers": {n: r[n]["timeline"][-1][3] for n in names},
        "auto_per_job": per,
    }


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(x) for x in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts like 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: counts must be >= 1")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_autotune",
        description="num_workers='auto' vs the best fixed worker count (swept in the same run), "
        "per testbed profile alone and for pairs side by side.",
    )
    parser.add_argument(
        "--profiles",
        default=",".join(ALL),
        help="profiles to run alone, comma-separated; '' for none (a pair's job not listed "
        "here gets one fixed sweep, no auto run) (default: %(default)s)",
    )
    parser.add_argument(
        "--pairs",
        default=",".join(PAIRS),
        help="pairs run side by side, a+b, comma-separated; '' for none (default: %(default)s)",
    )
    parser.add_argument(
        "--counts",
        type=_counts,
        default=COUNTS,
        help="fixed counts swept (default: " + ",".join(map(str, COUNTS)) + ")",
    )
    parser.add_argument("--fixed-seconds", type=float, default=15.0, help="per fixed run")
    parser.add_argument("--auto-seconds", type=float, default=90.0, help="per auto run")
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="seconds left out at each run's start"
    )
    parser.add_argument("--jpegs", type=int, default=3000, help="JPEG files for image_jpeg")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="passes over each profile's sweep and auto run; means are compared (default: 2)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="io_heavy and gpu_bound only, counts 1,2,8,14, runs of 8 s and 40 s, one pass, "
        "no pairs",
    )
    add_out_dir(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.profiles, args.pairs, args.counts = "io_heavy,gpu_bound", "", (1, 2, 8, 14)
        args.fixed_seconds, args.auto_seconds, args.repeats = 8.0, 40.0, 1
    profiles = [p for p in args.profiles.split(",") if p]
    pairs = [tuple(p.split("+")) for p in args.pairs.split(",") if p]
    for name in [*profiles, *(n for p in pairs for n in p)]:
        if name not in PROFILES:
            parser.error(f"profile {name!r}: expected one of {', '.join(sorted(PROFILES))}")
    if any(len(p) != 2 for p in pairs):
        parser.error(f"--pairs={args.pairs!r}: expected a+b pairs")
    if not profiles and not pairs:
        parser.error("--profiles and --pairs are both empty: nothing to run")
    if not 0 <= args.warmup < min(args.fixed_seconds, args.auto_seconds):
        parser.error("--warmup must be shorter than the runs")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} must be >= 1")
    outs = outputs(args.out_dir)
    extra = ["--jpegs", str(args.jpegs)]
    print(f"machine: {machine()}", flush=True)
    results: dict[str, Any] = {}
    pair_results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in profiles:
            results[name] = alone(name, args, folder, extra)
        for a, b in pairs:
            start = {}
            for n in (a, b):
                if n in results:
                    start[n] = results[n]["best_count"]
                else:  # not run alone (--profiles): one sweep finds where to start
                    fixed: dict[int, list[float]] = {}
                    sweep(n, fixed, 0, args, folder, extra)
                    start[n] = max(fixed, key=lambda k: fixed[k][0])
            pair_results[f"{a}+{b}"] = pair((a, b), start, args, folder, extra)
    counts = list(args.counts)
    if results:
        print(
            table(
                [
                    "profile",
                    *(f"fixed {n}" for n in counts),
                    "best",
                    "auto",
                    "auto/best",
                    "best again",
                    "auto again",
                    "auto/best again",
                    "search s",
                    "last change s",
                ],
                [
                    [
                        name,
                        *(r["fixed"][n] for n in counts),
                        r["best_count"],
                        r["auto"],
                        r["ratio"],
                        r["best_again"],
                        r["auto_again"],
                        r["ratio_again"],
                        "-" if r["search_s"] is None else r["search_s"],
                        r["settled_s"],
                    ]
                    for name, r in results.items()
                ],
            )
        )
        print(
            f"samples/s, mean of {args.repeats} pass(es); auto over its whole run after the "
            "warm-up (target: auto/best >= 0.95); again: the best count and auto, "
            f"{args.repeats} more run(s) of {args.auto_seconds:g} s each, alternating (the best "
            "of the sweep's noisy means is biased upwards); search: seconds until its first "
            "search held a count (target: 30; '-': never), last change: of the count (a probe or "
            "a new search), the latest of the passes"
        )
    if pair_results:
        print(
            table(
                [
                    "pair",
                    "static best split",
                    "splits tried",
                    "static (search)",
                    "static again",
                    "auto runs",
                    "auto workers, last run",
                    "auto",
                    "auto/static (search)",
                    "auto/static again",
                ],
                [
                    [
                        k,
                        "/".join(map(str, r["static_best"])),
                        r["splits_tried"],
                        r["static_score"],
                        r["static_again"],
                        ", ".join(f"{x:.3f}" for x in r["auto_runs"]),
                        "/".join(str(n) for n in r["auto_final_workers"].values()),
                        r["auto"],
                        r["ratio"],
                        r["ratio_again"],
                    ]
                    for k, r in pair_results.items()
                ],
            )
        )
        print(
            f"score: sum of samples/s over accelerator limit; auto and static again: means of "
            f"{args.repeats} run(s) of {args.auto_seconds:g} s, alternating; static (search): "
            f"the best split's one {args.fixed_seconds:g} s run in the search (target: "
            "auto/static >= 0.95)"
        )
    stem = "bench_autotune"
    outs(f"{stem}.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "args": {k: v for k, v in vars(args).items() if k != "out_dir"},
                "alone": results,
                "pairs": pair_results,
            },
            indent=1,
        )
    )
    plots.autotune(results, pair_results, outs(f"{stem}.png"))
    print(f"wrote {outs(stem + '.json')} and {outs(stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
