"""``bench_sidecar --generated N``: the node policy on N mixes drawn from a seed.

Each mix (:func:`dloader.apps.scenarios.draw_mixes`: 2-5 jobs of the emulated and real-pipeline
profiles, costs and accelerator limits varied, some jobs arriving or leaving, some costs
changing) runs, in one interleaved order, as

* ``naive``: no sidecar, each job at its own count;
* ``adaptive``: a real sidecar with the adaptive policy and its default budgets (``--repeats``
  runs);
* ``static``: the best static split within the same worker budget (a count per job for its
  life, within the budget in every phase), searched in the same run: the naive split cut to the
  budget, the split the jobs' true costs suggest (:func:`~dloader.apps.scenarios.cost_split`:
  what no policy is told), and the split the first adaptive run held longest are run first,
  then a coordinate search from the best of them, at most ``--static-runs`` runs in all; the
  best is run again ``--repeats - 1`` times (its search run counts as one: the best of many
  noisy runs leans high, so the baseline is, if anything, flattered).

Score: the sum over jobs of samples / accelerator limit over the whole scenario, per second
(exploring is paid for). Each ratio has a 95% confidence interval from a paired bootstrap:
runs resampled within each kind and 5-second blocks of the scenario resampled together across
kinds (the blocks are aligned in scenario time). Also, from the adaptive runs' sidecar logs:
when each job was first placed (seconds from registering until the sidecar directed a count of
its choosing: the model's, or its exploration's), when its model placed it, and the model's
prediction error per job (median over the run of ``|predicted / measured - 1|`` for every
split it predicted, against what the job measured there before the next change).
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from collections import Counter
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from benchmarks._common import machine, outputs, table
from benchmarks.sidecar import plots
from benchmarks.sidecar.sidecar_log import PLACED, REGISTERED, STAMP
from dloader.apps.experiment import run_jobs, sidecar_process
from dloader.apps.scenarios import NodeMix, cost_split, draw_mixes
from dloader.apps.splits import QUICK_LADDER, Split, coordinate_search
from dloader.apps.testbed import PROFILES, make_dataset

BLOCK_S = 5.0
SETTLE_S = 2.0
"""After a change of the node's split: seconds before a job's throughput is compared with the
model's prediction (the new workers start)."""


def block_scores(results: dict[str, Any], mix: NodeMix, block: float = BLOCK_S) -> np.ndarray:
    """Per block of the scenario: the sum over jobs of samples / limit, per second. Scenario
    time starts with the earliest of the jobs that start at 0 (each job's timeline is from its
    own start; a later job's start is its arrival)."""
    t0 = min(results[j.label]["started"] for j in mix.jobs if j.at == 0)
    n = max(int(mix.length // block), 1)
    out = np.zeros(n)
    for r in results.values():
        off = r["started"] - t0
        for t, samples, *_ in r["timeline"]:
            i = int((t + off) // block)
            if 0 <= i < n:
                out[i] += samples / r["limit"] / block
    return out


def held_split(results: dict[str, Any]) -> Split:
    """The count each job held for the most steps of its life."""
    return {
        name: Counter(x[3] for x in r["timeline"]).most_common(1)[0][0]
        for name, r in results.items()
        if r["timeline"]
    }


def within_budget(split: Split, mix: NodeMix, budget: int) -> Split:
    """``split`` cut down (largest counts first) until every phase is within ``budget``."""
    out = dict(split)
    while not mix.within(out, budget):
        over = [p for p in mix.phases() if sum(out[j] for j in p) > budget]
        big = max(over[0], key=lambda j: (out[j], j))
        if out[big] <= 1:
            break
        out[big] -= 1
    return out


def ratio_ci(
    a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n: int = 2000
) -> tuple[float, float, float]:
    """``mean(a) / mean(b)`` of two (runs x blocks) score arrays, and its 95% interval by a
    paired bootstrap: each kind's runs resampled, the blocks resampled once for both."""
    blocks = a.shape[1]
    ratios = np.empty(n)
    for i in range(n):
        cols = rng.integers(0, blocks, blocks)
        ra = a[rng.integers(0, len(a), len(a))][:, cols].mean()
        rb = b[rng.integers(0, len(b), len(b))][:, cols].mean()
        ratios[i] = ra / rb if rb > 0 else math.nan
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return float(a.mean() / b.mean()), float(lo), float(hi)


_DIRECTED = re.compile(r"job (\S+): (\d+) workers \(")
_EXPECTS = re.compile(r"the model expects \(samples/s\): (.*)$")


def _stamp(line: str) -> float | None:
    m = STAMP.match(line)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def read_log(log: Path) -> dict[str, Any]:
    """From an adaptive sidecar's log, per job label: seconds from registering to its first
    directed count (``first``) and to its model's placement (``placed``); and the model's
    expectations at each change of the node's split: ``(time, {label: samples/s})``."""
    names: dict[str, str] = {}
    registered: dict[str, float] = {}
    first: dict[str, float] = {}
    placed: dict[str, float] = {}
    expects: list[tuple[float, dict[str, float]]] = []
    for line in log.read_text().splitlines():
        at = _stamp(line)
        if at is None:
            continue
        if m := REGISTERED.search(line):
            names[m.group(1)] = m.group(2)
            registered[m.group(2)] = at
        elif m := PLACED.search(line):
            placed.setdefault(names.get(m.group(1), m.group(1)), float(m.group(2)))
        elif m := _EXPECTS.search(line):
            values = {}
            for item in m.group(1).split(", "):
                job, _, rate = item.partition("=")
                if job in names:
                    values[names[job]] = float(rate.replace(",", ""))
            expects.append((at, values))
        elif (m := _DIRECTED.search(line)) and names.get(m.group(1)) in registered:
            label = names[m.group(1)]
            first.setdefault(label, at - registered[label])
    for label, s in placed.items():  # placed at the count it came with: no directive for it
        first[label] = min(first.get(label, math.inf), s)
    return {"first": first, "placed": placed, "expects": expects}


def prediction_errors(
    expects: list[tuple[float, dict[str, float]]], results: dict[str, Any]
) -> dict[str, float]:
    """Per job: the median over the run of ``|predicted / measured - 1|``, each prediction
    against the job's throughput from ``SETTLE_S`` after that change of the node's split to
    the next (at least a second of it)."""
    errors: dict[str, list[float]] = {}
    ends = [t for t, _ in expects[1:]] + [math.inf]
    for (start, values), end in zip(expects, ends, strict=True):
        for label, predicted in values.items():
            r = results.get(label)
            if r is None or not predicted > 0:
                continue
            a, b = start + SETTLE_S - r["started"], end - r["started"]
            last = r["timeline"][-1][0] if r["timeline"] else 0.0
            b = min(b, last)
            if b - a < 1.0:
                continue
            samples = sum(x[1] for x in r["timeline"] if a <= x[0] < b)
            measured = samples / (b - a)
            if measured > 0:
                errors.setdefault(label, []).append(abs(predicted / measured - 1))
    return {label: median(v) for label, v in errors.items()}


def run_mix(
    mix: NodeMix,
    budget: int,
    tmp: Path,
    *,
    repeats: int,
    static_runs: int,
    extra: list[str],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """One mix: naive, adaptive and the searched static split, interleaved; their scores,
    ratios with intervals, placements and prediction errors."""
    folder = tmp / mix.name.replace("/", "-")
    count = 0

    def run(split: Split | None, sidecar: bool, what: str) -> dict[str, Any]:
        nonlocal count
        count += 1
        print(f"  mix {mix.name}, run {count}: {what} ...", file=sys.stderr, flush=True)
        where = folder / f"{count:02d}"
        if not sidecar:
            return run_jobs(mix.arrivals(split), where, extra=extra)
        with sidecar_process(where, policy="adaptive", worker_budget=budget) as sc:
            return run_jobs(mix.arrivals(split), where, sidecar=sc.target, extra=extra)

    naive = run(None, False, "naive (each job its own count)")
    adaptive = [run(None, True, "adaptive")]
    logs = [folder / f"{count:02d}" / "sidecar.log"]
    static: dict[tuple[tuple[str, int], ...], dict[str, Any]] = {}

    def evaluate(split: Split) -> float:
        shown = "/".join(str(split[j]) for j in mix.labels)
        res = run(split, False, f"static {shown} ({len(static) + 1} of <= {static_runs})")
        static[tuple(sorted(split.items()))] = res
        return float(block_scores(res, mix).mean())

    seeds = [cost_split(mix, 2.0, budget), within_budget(held_split(adaptive[0]), mix, budget)]
    start = within_budget(mix.own(), mix, budget)
    _, best = coordinate_search(
        evaluate,
        start,
        lambda s: mix.within(s, budget),
        [k for k in QUICK_LADDER if k <= budget],
        rounds=2,
        seeds=seeds,
        max_evaluations=static_runs,
    )
    statics = [static[tuple(sorted(best.items()))]]
    for _ in range(repeats - 1):
        adaptive.append(run(None, True, "adaptive again"))
        logs.append(folder / f"{count:02d}" / "sidecar.log")
        statics.append(run(best, False, "the best static split again"))
    scores = {
        "naive": np.array([block_scores(naive, mix)]),
        "adaptive": np.array([block_scores(r, mix) for r in adaptive]),
        "static": np.array([block_scores(r, mix) for r in statics]),
    }
    parsed = [read_log(p) for p in logs]
    errors: dict[str, list[float]] = {}
    for p, res in zip(parsed, adaptive, strict=True):
        for label, e in prediction_errors(p["expects"], res).items():
            errors.setdefault(label, []).append(e)
    return {
        "mix": mix.name,
        "describe": mix.describe(),
        "dynamic": mix.dynamic,
        "changes": mix.changes,
        "budget": budget,
        "static_split": best,
        "static_runs": len(static),
        "scores": {k: v.mean(axis=1).tolist() for k, v in scores.items()},
        "vs_static": ratio_ci(scores["adaptive"], scores["static"], rng),
        "vs_naive": ratio_ci(scores["adaptive"], scores["naive"], rng),
        "first_s": [s for p in parsed for s in p["first"].values()],
        "placed_s": [s for p in parsed for s in p["placed"].values()],
        "prediction_error": {k: median(v) for k, v in errors.items()},
    }


def generated(
    n: int,
    seed: int | None,
    *,
    length: float,
    repeats: int,
    static_runs: int,
    budget: int,
    jpegs: int,
    out_dir: Path,
) -> int:
    """Runs ``n`` drawn mixes and prints the table, the median and the worst."""
    if seed is None:
        seed = int.from_bytes(np.random.default_rng().bytes(4), "little") % 10**9
    print(f"machine: {machine()}", flush=True)
    print(
        f"seed {seed} (reproduce: --generated {n} --gen-seed {seed}); {n} mixes of {length:g} s; "
        f"worker budget {budget} (the sidecar's default here)",
        flush=True,
    )
    mixes = draw_mixes(seed, n, length)
    if any(j.profile == "image_jpeg" for m in mixes for j in m.jobs):
        make_dataset(PROFILES["image_jpeg"], 1, jpegs)  # generated once, outside any run
    tmp = Path(tempfile.mkdtemp(prefix="bench-generated-"))
    rng = np.random.default_rng(seed)
    outs = outputs(out_dir)
    done: list[dict[str, Any]] = []
    for mix in mixes:
        print(mix.describe(), flush=True)
        r = run_mix(
            mix,
            budget,
            tmp,
            repeats=repeats,
            static_runs=static_runs,
            extra=["--jpegs", str(jpegs)],
            rng=rng,
        )
        done.append(r)
        v, lo, hi = r["vs_static"]
        print(
            f"  adaptive / static {v:.3f} [{lo:.3f}, {hi:.3f}], / naive {r['vs_naive'][0]:.3f}",
            flush=True,
        )
        # written after every mix: a long run stopped early keeps what it measured
        outs("bench_sidecar_generated.json").write_text(
            json.dumps({"machine": machine(), "seed": seed, "length_s": length, "mixes": done})
        )
    print(report(done))
    plots.generated(done, seed, outs("bench_sidecar_generated.png"))
    print(f"wrote {outs('bench_sidecar_generated.json')} and {outs('bench_sidecar_generated.png')}")
    return 0


def _ci(x: list[float]) -> str:
    return f"{x[0]:.3f} [{x[1]:.3f}, {x[2]:.3f}]"


def report(done: list[dict[str, Any]]) -> str:
    """The table of mixes, then the median and worst of each ratio, the placements'
    percentiles and the prediction errors."""
    rows = [
        [
            r["mix"],
            ("dyn" if r["dynamic"] else "") + ("+chg" if r["changes"] else ""),
            len(r["static_split"]),
            _ci(r["vs_static"]),
            _ci(r["vs_naive"]),
            "/".join(str(v) for v in r["static_split"].values()),
            max(r["prediction_error"].values(), default=math.nan),
        ]
        for r in done
    ]
    lines = [
        table(
            [
                "mix",
                "kind",
                "jobs",
                "adaptive / static [95% CI]",
                "adaptive / naive [95% CI]",
                "static split",
                "worst job's median error",
            ],
            rows,
        )
    ]

    def summary(name: str, values: list[float]) -> str:
        if not values:
            return f"{name}: none"
        return f"{name}: median {median(values):.3f}, worst {min(values):.3f} (n={len(values)})"

    vs_static = [r["vs_static"][0] for r in done]
    dynamic = [r["vs_static"][0] for r in done if r["dynamic"]]
    naive = [r["vs_naive"][0] for r in done]
    lines += [
        summary("adaptive / static", vs_static) + " (targets: median >= 1.00, worst >= 0.95)",
        summary("  mixes with arrivals or departures", dynamic) + " (target: median >= 1.02)",
        summary("adaptive / naive", naive) + " (target: median >= 1.25)",
    ]
    first = [s for r in done for s in r["first_s"]]
    placed = [s for r in done for s in r["placed_s"]]
    for name, xs in (("first placement", first), ("placed by its model", placed)):
        if xs:
            p50, p95 = np.percentile(xs, [50, 95])
            lines.append(
                f"{name} after registering: p50 {p50:.1f} s, p95 {p95:.1f} s, max {max(xs):.1f} s "
                f"(n={len(xs)})" + (" (target: p95 <= 2 s)" if name == "first placement" else "")
            )
    errors = [e for r in done for e in r["prediction_error"].values()]
    if errors:
        over = sum(e >= 0.15 for e in errors)
        lines.append(
            f"prediction error per job (median over a run): median {median(errors):.1%}, worst "
            f"{max(errors):.1%}; {over} of {len(errors)} jobs at 15% or more (target: none)"
        )
    return "\n".join(lines)
