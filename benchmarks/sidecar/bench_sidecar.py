"""The headline: three emulated jobs share this node; how much useful throughput do they get?

The testbed's io_heavy, cpu_heavy and gpu_bound jobs (docs/architecture.md) run concurrently as
separate processes, each starting with the same worker count (4), under

(a) ``even``: a sidecar with the even policy (the node's workers split equally);
(b) ``adaptive``: a sidecar with the adaptive policy (it explores, models, re-divides);
each at the same node worker budget: 12 (even: 4 each, the architecture doc's baseline) and 24;
(c) ``static best``: no sidecar, the best fixed split within the same budget, found in the same
run by a local search (:func:`coordinate_search`: from one worker each, each job in turn tries
every count of a ladder with the others held, then budget-neutral transfers between jobs, the
best kept, until a round changes nothing): jobs that know their best worker count in advance,
which nobody does.

Score: the sum over jobs of samples/s divided by the job's accelerator limit, over the last
``--window`` seconds of each run (the adaptive sidecar needs the first part to explore).
Then (``--again N``, default 1) the best static split and the adaptive sidecar run N more
times each, alternating, at the sidecar runs' length and window: the search's best is the
largest of many short, noisy runs and leans high, so the mean of the adaptive runs is also
compared with the mean of that split's reruns. Also: each job's accelerator idle share, and
when the adaptive run reached 95% of its final score. A PNG shows per-job throughput and
worker counts over time.

    python -m benchmarks.sidecar.bench_sidecar              # ~13 min
    python -m benchmarks.sidecar.bench_sidecar --quick      # ~9 min, budget 12 only, shorter runs
    python -m benchmarks.sidecar.bench_sidecar --mix real   # the real-pipeline mix
                                                    # (dloader.apps.pipelines): JPEG decode +
                                                    # crop/flip/normalise, text tokenise + pack,
                                                    # remote reads with a tail
    python -m benchmarks.sidecar.bench_sidecar --mix dynamic   # jobs come and go (~40 min)
    python -m benchmarks.sidecar.bench_sidecar --generated 8   # 8 mixes drawn from a new seed
                                                    # (printed), each against "auto", naive,
                                                    # tuned alone and a static ceiling
                                                    # (~20 min a mix at 120 s): generated.py
    python -m benchmarks.sidecar.bench_sidecar --generated 8 --gen-seed S --only 0,1
                                                    # a part of them (then --combine the JSONs)

Also (d) ``no sidecar``: every job keeps its 4 workers; and (e) each job ``num_workers="auto"``
with no sidecar (what a user gets by changing one argument; the dynamic mix has it too, and
compares it with the adaptive sidecar at its default worker budget, as a user would run it).

``--mix dynamic``: no single split fits every phase. Three phases of ``--phase`` seconds at a
budget of 12: io_heavy (``io_a``), cpu_heavy and gpu_bound start; cpu_heavy leaves after one
phase as a second io_heavy job (``io_b``) arrives; at the third phase ``io_a``'s per-sample
cost doubles. Score: the sum over jobs of samples / accelerator limit over the whole scenario,
divided by its length. The static split holds one count per job for its life (within the
budget in every phase), found by the same coordinate search over whole scenario runs. Also:
how long the arriving job waited for its first decision (target: within 5 s). With
``--phase-oracle``, each phase's jobs also run as a mix of their own, searched the same way for
that phase's best split: switching to each phase's best at once is the most any dynamic policy
could reach, so it says whether a target over the static split is reachable at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.sidecar import plots
from benchmarks.sidecar.generated import ABLATIONS
from benchmarks.sidecar.records import read_records
from dloader.apps.experiment import Arrival, JobPlan, run_jobs, score, sidecar_process
from dloader.apps.splits import LADDER, QUICK_LADDER, Split, coordinate_search, parse_split
from dloader.apps.testbed import REAL_MIX
from dloader.sidecar.config import default_budget

JOBS: tuple[str, ...] = ("io_heavy", "cpu_heavy", "gpu_bound")
START_WORKERS = 4
BUDGETS = (12, 24)
DYNAMIC_JOBS = ("io_a", "cpu_heavy", "gpu_bound", "io_b")
DYNAMIC_BUDGET = 12
DEFAULT = "adaptive, default budget"
"""The dynamic mix's run of the sidecar as a user runs it (its default worker budget)."""


def with_sidecar(
    policy: str, budget: int, seconds: float, tmp: Path, extra: list[str], name: str = ""
) -> dict[str, Any]:
    """The mix under a sidecar with ``policy``; its files in ``tmp / name`` (default:
    ``policy-budget``)."""
    folder = tmp / (name or f"{policy}-{budget}")
    with sidecar_process(folder, policy=policy, worker_budget=budget) as sc:
        return run_jobs(
            specs(START_WORKERS), folder, seconds=seconds, sidecar=sc.target, extra=extra
        )


def prediction_errors(folder: Path, per: dict[str, Any]) -> dict[str, float | None]:
    """Per job: the adaptive sidecar's last prediction for the worker count the job ran in the
    scored window (its run in ``folder``), vs what it measured there: ``|predicted / measured -
    1|`` (None: no prediction was recorded for that count). The last prediction for that
    count, not the last one recorded: when the other jobs leave at the end, the sidecar gives
    the last one more workers, with a prediction for a count the scored window never ran."""
    rec = read_records(folder)
    names = rec.names
    last: dict[str, dict[int, float]] = {}
    for _, e in rec.events:
        if e.kind in ("directed", "restarted") and e.samples_per_s is not None:
            job = names.get(e.job_id, e.job_id)
            last.setdefault(job, {})[e.num_workers] = e.samples_per_s
    out: dict[str, float | None] = {}
    for job, p in per.items():
        predicted = last.get(job, {}).get(p["workers"])
        measured = p["samples_per_s"]
        if predicted is None or measured <= 0:
            out[job] = None  # no prediction recorded for that count, or nothing measured
        else:
            out[job] = abs(predicted / measured - 1)
    return out


AUTO = 'each "auto", no sidecar'
"""The arm a user gets by changing one argument: each job's loader tunes itself
(``num_workers="auto"``), no daemon."""


def specs(workers: int | str | dict[str, int]) -> list[JobPlan]:
    counts: dict[str, int | str] = (
        dict(workers) if isinstance(workers, dict) else dict.fromkeys(JOBS, workers)
    )
    return [(name, counts[name], 0.0, None) for name in JOBS]


def converged_at(results: dict[str, Any], final: float, seconds: float) -> float | None:
    for t in range(0, int(seconds) - 5):
        if score(results, t, t + 5)[0] >= 0.95 * final:
            return float(t)
    return None


def static_best(
    budget: int,
    tmp: Path,
    seconds: float,
    window: float,
    extra: list[str],
    ladder: Sequence[int],
    rounds: int,
    seeds: Sequence[Split] = (),
    search_runs: int | None = None,
) -> tuple[str, Split, float, dict[str, Any], dict[str, Any]]:
    """The best static split within ``budget`` by coordinate search from one worker each (from
    the even split, a full budget leaves no single job room to grow) or from the best of
    ``seeds``, each split run for ``seconds`` and scored over its last ``window``: (label,
    split, score, per job, results)."""
    tried: dict[tuple[int, ...], tuple[float, dict[str, Any], dict[str, Any]]] = {}

    def evaluate(split: Split) -> float:
        print(
            f"  budget {budget} static search, run {len(tried) + 1}: {split} ...",
            file=sys.stderr,
            flush=True,
        )
        folder = tmp / f"static-{budget}-{len(tried)}"
        res = run_jobs(specs(split), folder, seconds=seconds, extra=extra)
        total, per = score(res, seconds - window, seconds)
        tried[tuple(split[j] for j in JOBS)] = (total, per, res)
        return total

    _, split = coordinate_search(
        evaluate,
        dict.fromkeys(JOBS, 1),
        lambda s: sum(s.values()) <= budget,
        ladder,
        rounds,
        seeds,
        search_runs,
    )
    label = f"static best of {len(tried)}, budget {budget}: " + "/".join(
        str(split[j]) for j in JOBS
    )
    return (label, split, *tried[tuple(split[j] for j in JOBS)])


def dynamic_plans(phase: float, split: Mapping[str, int | str] | None = None) -> list[Arrival]:
    """The dynamic scenario's jobs, each starting at ``START_WORKERS`` or at its ``split`` (a
    count or ``"auto"`` per job)."""
    k = split or dict.fromkeys(DYNAMIC_JOBS, START_WORKERS)
    slow = ("--slowdown-at", str(2 * phase))
    return [
        Arrival("io_heavy", k["io_a"], 0.0, seconds=3 * phase, label="io_a", extra=slow),
        Arrival("cpu_heavy", k["cpu_heavy"], 0.0, seconds=phase),
        Arrival("gpu_bound", k["gpu_bound"], 0.0, seconds=3 * phase),
        Arrival("io_heavy", k["io_b"], phase, seconds=2 * phase, label="io_b"),
    ]


def scenario_score(results: dict[str, Any], length: float) -> tuple[float, dict[str, float]]:
    """The sum over jobs of samples / accelerator limit over the scenario, per second of it;
    and per job, its part."""
    per = {
        name: sum(x[1] for x in r["timeline"]) / r["limit"] / length for name, r in results.items()
    }
    return sum(per.values()), per


def phase_split(results: dict[str, Any], phase: float, i: int) -> Split:
    """The worker count each job running in phase ``i`` held longest in it."""
    t0 = min(r["started"] for r in results.values())
    out = {}
    for name, r in results.items():
        at = r["started"] - t0
        counts = Counter(p[3] for p in r["timeline"] if i * phase <= at + p[0] < (i + 1) * phase)
        if counts:
            out[name] = counts.most_common(1)[0][0]
    return out


def phase_scores(results: dict[str, Any], phase: float, phases: int = 3) -> list[float]:
    """Per phase of the scenario (``phase`` seconds each, from the first job's start): the sum
    over jobs of samples / accelerator limit in it, per second of it."""
    t0 = min(r["started"] for r in results.values())
    out = [0.0] * phases
    for r in results.values():
        at = r["started"] - t0
        for point in r["timeline"]:
            i = min(max(int((at + point[0]) // phase), 0), phases - 1)
            out[i] += point[1] / r["limit"] / phase
    return out


def placed_after_s(folder: Path, name: str, nth: int) -> float | None:
    """Seconds from the ``nth`` (0-based) registration of a job named ``name`` in the sidecar
    run in ``folder`` until the adaptive policy's model placed it (None: never, or another
    policy)."""
    return _after(folder, name, nth, "placed")


def first_decision_s(folder: Path, name: str, nth: int) -> float | None:
    """Seconds from the ``nth`` (0-based) registration of a job named ``name`` to its first
    worker-count change (None: none recorded: it kept the count it came with)."""
    return _after(folder, name, nth, "directed")


def _after(folder: Path, name: str, nth: int, kind: str) -> float | None:
    rec = read_records(folder)
    job = rec.nth(name, nth)
    if job is None:
        return None
    at = rec.first(job[0], kind)
    return None if at is None else at - job[1]


#: --phase-oracle: each phase's jobs (label, profile, testbed arguments), run as a mix of its own
PHASE_MIXES: tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...] = (
    (("io_a", "io_heavy", ()), ("cpu_heavy", "cpu_heavy", ()), ("gpu_bound", "gpu_bound", ())),
    (("io_a", "io_heavy", ()), ("gpu_bound", "gpu_bound", ()), ("io_b", "io_heavy", ())),
    (
        ("io_a", "io_heavy", ("--slowdown-at", "0")),
        ("gpu_bound", "gpu_bound", ()),
        ("io_b", "io_heavy", ()),
    ),
)
#: --phase-oracle: seconds a later phase's jobs run before its scored ``phase`` seconds (in the
#: scenario they are already running when it starts)
PHASE_WARM_S = 4.0


def phase_best(
    i: int,
    phase: float,
    ladder: Sequence[int],
    rounds: int,
    tmp: Path,
    seeds: Sequence[Split],
    search_runs: int | None = None,
) -> tuple[float, Split, int]:
    """The best split of phase ``i``'s jobs alone, within the budget, by the same coordinate
    search: each split runs for ``phase`` seconds (the first phase from a cold start, as in the
    scenario; the later ones after ``PHASE_WARM_S`` s of warm-up) and is scored over them:
    (score, split, runs)."""
    mix = PHASE_MIXES[i]
    start = PHASE_WARM_S if i else 0.0
    runs = [0]

    def evaluate(split: Split) -> float:
        runs[0] += 1
        print(f"  phase {i + 1} search, run {runs[0]}: {split} ...", file=sys.stderr, flush=True)
        plans = [
            Arrival(profile, split[label], 0.0, seconds=start + phase, label=label, extra=extra)
            for label, profile, extra in mix
        ]
        res = run_jobs(plans, tmp / f"phase{i + 1}-{runs[0]}")
        return score(res, start, start + phase)[0]

    labels = [label for label, _, _ in mix]
    value, split = coordinate_search(
        evaluate,
        dict.fromkeys(labels, 1),
        lambda k: sum(k.values()) <= DYNAMIC_BUDGET,
        ladder,
        rounds,
        [{j: s[j] for j in labels} for s in seeds if set(labels) <= set(s)],
        search_runs,
    )
    return value, split, runs[0]


def dynamic(
    phase: float,
    ladder: Sequence[int],
    rounds: int,
    out_dir: Path,
    seeds: Sequence[Split] = (),
    phase_oracle: bool = False,
    search_runs: int | None = None,
) -> int:
    """``--mix dynamic``: no sidecar, even, adaptive and the searched static split."""
    outs = outputs(out_dir)
    length = 3 * phase
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sidecar-dynamic-"))
    runs: dict[str, dict[str, Any]] = {}
    print(f"  no sidecar: the scenario, {length:g} s ...", file=sys.stderr, flush=True)
    runs[f"no sidecar ({START_WORKERS} each)"] = run_jobs(dynamic_plans(phase), tmp / "none")
    print(f"  {AUTO}: the scenario, {length:g} s ...", file=sys.stderr, flush=True)
    auto = dict.fromkeys(DYNAMIC_JOBS, "auto")
    runs[AUTO] = run_jobs(dynamic_plans(phase, auto), tmp / "auto")
    decided: dict[str, float | None] = {}
    # The splits are compared at a budget of 12; a user runs the sidecar at its default
    # budget beside jobs that tune themselves without one, so the comparison with those is
    # made at the default budget (at 12 the sidecar cannot give the I/O-bound jobs the 17-21
    # workers each takes by itself).
    own = default_budget().workers
    arms = {"even": ("even", DYNAMIC_BUDGET), "adaptive": ("adaptive", DYNAMIC_BUDGET)}
    arms[DEFAULT] = ("adaptive", own)
    for name, (policy, budget) in arms.items():
        print(f"  {name}: the scenario, {length:g} s ...", file=sys.stderr, flush=True)
        folder = tmp / f"{policy}-{budget}"
        with sidecar_process(folder, policy=policy, worker_budget=budget) as sc:
            runs[name] = run_jobs(dynamic_plans(phase), folder, sidecar=sc.target)
        decided[name] = first_decision_s(folder, "io_heavy", 1)
    placed = placed_after_s(tmp / f"adaptive-{DYNAMIC_BUDGET}", "io_heavy", 1)
    tried: dict[tuple[int, ...], dict[str, Any]] = {}

    def evaluate(split: Split) -> float:
        print(f"  static search, run {len(tried) + 1}: {split} ...", file=sys.stderr, flush=True)
        res = run_jobs(dynamic_plans(phase, split), tmp / f"static-{len(tried)}")
        tried[tuple(split[j] for j in DYNAMIC_JOBS)] = res
        return scenario_score(res, length)[0]

    def allowed(k: Split) -> bool:  # within the budget in every phase
        first = k["io_a"] + k["cpu_heavy"] + k["gpu_bound"]
        return max(first, k["io_a"] + k["gpu_bound"] + k["io_b"]) <= DYNAMIC_BUDGET

    _, split = coordinate_search(
        evaluate, dict.fromkeys(DYNAMIC_JOBS, 1), allowed, ladder, rounds, seeds, search_runs
    )
    label = f"static best of {len(tried)}: " + "/".join(str(split[j]) for j in DYNAMIC_JOBS)
    runs[label] = tried[tuple(split[j] for j in DYNAMIC_JOBS)]
    scores = {name: scenario_score(res, length) for name, res in runs.items()}
    best = scores[label][0]
    by_phase = {name: phase_scores(res, phase) for name, res in runs.items()}
    # The most any switching policy could get from the splits tried: in each phase, the one
    # that measured best in that phase, switched to at once (no ramp, no measuring).
    by_tried = {k: phase_scores(res, phase) for k, res in tried.items()}
    oracle = [max(p[i] for p in by_tried.values()) for i in range(3)]
    print(
        table(
            ["run", "sum samples/limit per s", "vs static best", "phases 1 / 2 / 3", *DYNAMIC_JOBS],
            [
                [name, total, total / best, " / ".join(f"{x:.2f}" for x in by_phase[name])]
                + [f"{per.get(j, 0.0):.3f}" for j in DYNAMIC_JOBS]
                for name, (total, per) in scores.items()
            ],
        )
    )
    adaptive = scores["adaptive"][0]
    print(
        f"an oracle that runs in each phase the split that measured best in it (of the "
        f"{len(tried)} tried), switching at once: {sum(oracle) / 3:.3f} ("
        + " / ".join(f"{x:.2f}" for x in oracle)
        + f"), {sum(oracle) / 3 / best:.2f}x the best static split; adaptive / oracle = "
        f"{adaptive / (sum(oracle) / 3):.2f}"
    )
    searched = None
    if phase_oracle:
        # The best split of each phase found by a search of its own, seeded with the split
        # that measured best in it above, the static best and the adaptive run's: what a
        # policy that knew each phase's best split and switched to it at once could reach (an
        # upper bound for any switching policy, as far as the search finds each phase's best).
        searched = []
        for i in range(3):
            top = max(by_tried, key=lambda k: by_tried[k][i])
            seed = [
                dict(zip(DYNAMIC_JOBS, top, strict=True)),
                split,
                phase_split(runs["adaptive"], phase, i),
            ]
            searched.append(phase_best(i, phase, ladder, rounds, tmp, seed, search_runs))
        bound = sum(v for v, _, _ in searched) / 3
        print(
            table(
                ["phase", "best split, searched alone", "runs", "its score", "adaptive", "static"],
                [
                    [
                        i + 1,
                        "/".join(f"{j} {n}" for j, n in k.items()),
                        count,
                        v,
                        by_phase["adaptive"][i],
                        by_phase[label][i],
                    ]
                    for i, (v, k, count) in enumerate(searched)
                ],
            )
        )
        print(
            f"each phase's own best split, switched to at once: {bound:.3f}, "
            f"{bound / best:.2f}x the best static split (the most a switching policy could "
            f"reach, as far as the searches find each phase's best); adaptive / it = "
            f"{adaptive / bound:.2f}"
        )
    better = max(scores["even"][0], scores[f"no sidecar ({START_WORKERS} each)"][0])
    vs_auto = scores[DEFAULT][0] / scores[AUTO][0]
    print(
        f"dynamic, budget {DYNAMIC_BUDGET}: adaptive / the best static split = "
        f"{adaptive / best:.2f} (target >= 1.02); adaptive / the better of (no sidecar, even) "
        f"= {adaptive / better:.2f}; adaptive at its default budget ({own}) / {AUTO} = "
        f"{vs_auto:.2f} (target >= 1.05; at 12: {adaptive / scores[AUTO][0]:.2f}); the arriving "
        "job placed by the adaptive policy's model "
        f"after {f'{placed:.1f} s' if placed is not None else 'n/a'} (target: within 5 s); its "
        "first worker-count change after "
        + ", ".join(f"{p} {s:.1f} s" if s is not None else f"{p} n/a" for p, s in decided.items())
        + " (even changes it only when the even share moves)"
    )
    outs("bench_sidecar_dynamic.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "phase_s": phase,
                "scores": {n: {"total": t, "per": per} for n, (t, per) in scores.items()},
                "summary": {
                    "adaptive_vs_static_best": adaptive / best,
                    "adaptive_vs_better_baseline": adaptive / better,
                    "adaptive_vs_auto": vs_auto,
                    "adaptive_12_vs_auto": adaptive / scores[AUTO][0],
                    "default_budget": own,
                    "static_best": split,
                    "static_runs": len(tried),
                    "first_decision_s": decided,
                    "placed_after_s": placed,
                    "phases": by_phase,
                    "oracle_phases": oracle,
                    "adaptive_vs_oracle": adaptive / (sum(oracle) / 3),
                    "phase_searches": (
                        [{"score": v, "split": k, "runs": n} for v, k, n in searched]
                        if searched is not None
                        else None
                    ),
                },
            },
            indent=1,
        )
    )
    plots.jobs_timeline(
        runs, length, outs("bench_sidecar_dynamic.png"), "Jobs come and go on one node"
    )
    print(f"wrote {outs('bench_sidecar_dynamic.json')} and {outs('bench_sidecar_dynamic.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sidecar.bench_sidecar",
        description="Three emulated jobs on one node: even vs adaptive vs the best static split.",
    )
    p.add_argument(
        "--seconds", type=float, help="length of a sidecar run (default: 90, --quick: 40)"
    )
    p.add_argument(
        "--window", type=float, help="scored final window, seconds (default: 30, --quick: 12)"
    )
    p.add_argument(
        "--static-seconds",
        type=float,
        help="length of a static-split run (default: 25, --quick: 15)",
    )
    p.add_argument("--quick", action="store_true", help="shorter runs, a smaller search")
    p.add_argument(
        "--again",
        type=int,
        default=1,
        help="emulated and real mixes: after the search, the best static split and the "
        "adaptive sidecar run N more times each, alternating, at the sidecar runs' length and "
        "window (the best of the search's many short, noisy runs leans high; its rerun does "
        "not); 0: none (default: 1)",
    )
    p.add_argument(
        "--jpegs",
        type=int,
        default=3000,
        help="real mix: JPEG files the image job reads (generated once into the cache)",
    )
    add_out_dir(p)
    p.add_argument(
        "--mix",
        choices=("dynamic", "emulated", "real"),
        default="emulated",
        help="emulated: the testbed's three profiles (docs/architecture.md); real: the "
        "real-pipeline mix; dynamic: jobs come and go, a pipeline's cost doubles",
    )
    p.add_argument(
        "--phase",
        type=float,
        help="--mix dynamic: length of each of its three phases, s (default: 20, --quick: 8)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="rounds of the static split's coordinate search at most (default: 3, --quick: 1)",
    )
    p.add_argument(
        "--search-runs",
        type=int,
        metavar="N",
        help="runs of each static split search at most (the mix's, and with --phase-oracle "
        "each phase's; default: until a round changes nothing)",
    )
    p.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        help=f"node worker budgets to run (default: {' '.join(map(str, BUDGETS))}; --quick: "
        f"{BUDGETS[0]})",
    )
    p.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="SPLIT",
        help="a split the static search also runs and may start from, as worker counts in "
        "the mix's job order separated by '/' (emulated: io/cpu/gpu, e.g. 9/2/1; real: "
        "image/text/remote, e.g. 1/1/17; dynamic: io_a/cpu/gpu/io_b); repeatable. A local "
        "search from one worker each can miss the best split; seeding it with the best "
        "split of an earlier run keeps the reference strong",
    )
    p.add_argument(
        "--phase-oracle",
        action="store_true",
        help="--mix dynamic: also search each phase's jobs on their own for that phase's best "
        "split (about as long again as the scenario's search): an upper bound on what "
        "switching splits can gain over the best static one",
    )
    g = p.add_argument_group(
        "generated mixes (--generated N)",
        "N node mixes drawn from a seed (2-5 jobs of the emulated and real-pipeline profiles, "
        "costs and limits varied, jobs arriving and leaving, costs changing), each scored for "
        "the adaptive sidecar against each job at its own count (naive), each job "
        'num_workers="auto" without a sidecar, each at the count auto chose for it alone, and '
        "the best static split searched in the same run (a ceiling), with 95%% intervals, over "
        "the whole run and its steady part (benchmarks/sidecar/generated.py)",
    )
    g.add_argument("--generated", type=int, metavar="N", help="run N drawn mixes")
    g.add_argument(
        "--contention",
        action="store_true",
        help="draw contention mixes instead: trainers that need a core of their own among "
        "CPU-bound neighbours (dloader.apps.scenarios.draw_contention_mix), where a node arbiter "
        "has something to win over jobs tuning themselves",
    )
    g.add_argument(
        "--gen-seed",
        type=int,
        metavar="SEED",
        help="the seed the mixes are drawn from (default: a new one, printed)",
    )
    g.add_argument(
        "--ablation",
        nargs="?",
        const=",".join(ABLATIONS),
        default="",
        metavar="GROUPS",
        help='more arms, by group (default when given: all): nice, each job "auto" with its '
        "workers at nice 10 set by hand (worker_init_fn, no sidecar) and the sidecar with "
        "--worker-nice 0 (its policy without trainers first); spares, the adaptive sidecar with "
        "--spare-workers 1 (no spare workers for I/O-bound jobs)",
    )
    g.add_argument(
        "--policy",
        choices=("adaptive", "guided"),
        default="adaptive",
        help="the sidecar's policy (default: adaptive); guided (each job's own tuner within "
        "the sidecar's ceilings) adds an arm of the sidecar with the adaptive policy",
    )
    g.add_argument(
        "--length",
        type=float,
        default=120.0,
        help="seconds of each scenario (default: 120: start-up a small part of it)",
    )
    g.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs of the sidecar, of the auto arm and of the ceiling per mix (default: 2)",
    )
    g.add_argument(
        "--static-runs",
        type=int,
        default=4,
        help="runs the ceiling's search may make per mix, its seeds included (default: 4; "
        "0: no ceiling)",
    )
    g.add_argument(
        "--alone-s",
        type=float,
        default=40.0,
        help='seconds each job runs alone with "auto" for the alone arm (default: 40; 0: no '
        "alone arm)",
    )
    g.add_argument(
        "--settle",
        type=float,
        default=20.0,
        help="the steady part: blocks this many seconds or more after an event (default: 20)",
    )
    g.add_argument(
        "--only",
        metavar="I,J,...",
        help="run only these mix indices of --generated N (a part of a long set, same seed)",
    )
    g.add_argument(
        "--rooms",
        action="store_true",
        help="print each of the N mixes' room (what a perfect division of the cores would give "
        "over an even one, by the jobs' costs, the real pipelines' measured here first) and "
        "their distribution, and run nothing: whether a set of mixes leaves a node arbiter "
        "anything to divide",
    )
    g.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="print and plot the parts' JSON files (one seed) as one set, and run nothing",
    )
    args = p.parse_args(argv)
    if args.combine:
        from benchmarks.sidecar.generated import combine

        try:
            return combine(args.combine, args.out_dir)
        except (OSError, ValueError, KeyError) as exc:
            p.error(f"--combine: {exc}")
    if args.generated is not None:
        if args.generated < 1:
            p.error(f"--generated {args.generated}: expected at least 1 mix")
        if not (args.length >= 12 and args.length < 3600):
            p.error(f"--length {args.length:g}: expected seconds within [12, 3600)")
        if args.repeats < 1:
            p.error(f"--repeats {args.repeats}: expected at least 1")
        if args.static_runs < 0:
            p.error(f"--static-runs {args.static_runs}: expected 0 (no ceiling) or more")
        if not (args.alone_s == 0 or 10 <= args.alone_s < 3600):
            p.error(f"--alone-s {args.alone_s:g}: expected 0 (no alone arm) or [10, 3600) s")
        if not 0 <= args.settle < args.length:
            p.error(f"--settle {args.settle:g}: expected seconds within [0, --length)")
        only = None
        if args.only is not None:
            try:
                only = sorted({int(i) for i in args.only.split(",")})
            except ValueError:
                p.error(f"--only {args.only!r}: expected mix indices, e.g. 0,1,2")
            if not all(0 <= i < args.generated for i in only):
                p.error(f"--only {args.only}: expected indices within [0, {args.generated})")
        if args.jpegs < 1:
            p.error(f"--jpegs {args.jpegs}: expected at least 1")
        if args.rooms:
            from benchmarks.sidecar.generated import rooms

            return rooms(
                args.generated,
                args.gen_seed,
                contention=args.contention,
                length=args.length,
                jpegs=args.jpegs,
                out_dir=args.out_dir,
            )
        ablation = tuple(a for a in args.ablation.split(",") if a)
        if not set(ablation) <= set(ABLATIONS):
            p.error(f"--ablation {args.ablation}: expected groups of {','.join(ABLATIONS)}")
        from benchmarks.sidecar.generated import generated

        return generated(
            args.generated,
            args.gen_seed,
            contention=args.contention,
            ablation=ablation,
            policy=args.policy,
            length=args.length,
            repeats=args.repeats,
            static_runs=args.static_runs,
            alone_s=args.alone_s,
            settle_s=args.settle,
            only=only,
            budget=args.budgets[0] if args.budgets else default_budget().workers,
            jpegs=args.jpegs,
            out_dir=args.out_dir,
        )
    global JOBS
    JOBS = REAL_MIX if args.mix == "real" else JOBS
    order = DYNAMIC_JOBS if args.mix == "dynamic" else JOBS
    try:
        seeds = [parse_split(text, order) for text in args.seed]
    except ValueError as exc:
        p.error(str(exc))
    ladder = QUICK_LADDER if args.quick else LADDER
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        p.error(f"--rounds {rounds}: expected at least 1")
    if args.search_runs is not None and args.search_runs < 1:
        p.error(f"--search-runs {args.search_runs}: expected at least 1")
    if args.mix == "dynamic":
        phase = args.phase if args.phase is not None else (8.0 if args.quick else 20.0)
        if not phase >= 2:
            p.error(f"--phase {phase:g}: expected at least 2 seconds")
        return dynamic(
            phase, ladder, rounds, args.out_dir, seeds, args.phase_oracle, args.search_runs
        )
    budgets = args.budgets or (BUDGETS[:1] if args.quick else BUDGETS)
    if any(b < len(JOBS) for b in budgets):
        p.error(f"--budgets {budgets}: each must give every job a worker (>= {len(JOBS)})")
    for name, full, quick in (
        ("seconds", 90.0, 40.0),
        ("window", 30.0, 12.0),
        ("static_seconds", 25.0, 15.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.window >= args.seconds:
        p.error(f"--window {args.window:g} must be shorter than --seconds {args.seconds:g}")
    if args.jpegs < 1:
        p.error(f"--jpegs {args.jpegs}: expected at least 1")
    if args.again < 0:
        p.error(f"--again {args.again}: expected 0 or more")
    extra = ["--jpegs", str(args.jpegs)]
    outs = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    runs, rows = {}, []
    best: dict[int, tuple[float, str]] = {}
    again: dict[int, dict[str, list[float]]] = {}  # budget: "static"/"adaptive": rerun scores
    print(f"  no sidecar: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
    res = run_jobs(specs(START_WORKERS), tmp / "none", seconds=args.seconds, extra=extra)
    runs["no sidecar (4 each)"] = res
    rows.append(("no sidecar (4 each)", *score(res, args.seconds - args.window, args.seconds)))
    print(f"  {AUTO}: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
    res = run_jobs(specs("auto"), tmp / "auto", seconds=args.seconds, extra=extra)
    runs[AUTO] = res
    rows.append((AUTO, *score(res, args.seconds - args.window, args.seconds)))
    for budget in budgets:
        for policy in ("even", "adaptive"):
            label = f"{policy}, budget {budget}"
            print(f"  {label}: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
            res = with_sidecar(policy, budget, args.seconds, tmp, extra)
            runs[label] = res
            total, per = score(res, args.seconds - args.window, args.seconds)
            rows.append((label, total, per))
        label, split, total, per, res = static_best(
            budget,
            tmp,
            args.static_seconds,
            args.window * args.static_seconds / args.seconds,
            extra,
            ladder,
            rounds,
            [x for x in seeds if sum(x.values()) <= budget],
            args.search_runs,
        )
        runs[label] = res
        rows.append((label, total, per))
        best[budget] = (total, label)
        again[budget] = {"static": [], "adaptive": []}
        shown = "/".join(str(split[j]) for j in JOBS)
        for i in range(args.again):
            for kind, name in (("static", f"static {shown}"), ("adaptive", "adaptive")):
                label = f"{name} again ({i + 1}), budget {budget}"
                print(f"  {label}: 3 jobs x {args.seconds:g} s ...", file=sys.stderr, flush=True)
                folder = f"again-{kind}-{budget}-{i}"
                if kind == "static":
                    res = run_jobs(specs(split), tmp / folder, seconds=args.seconds, extra=extra)
                else:
                    res = with_sidecar("adaptive", budget, args.seconds, tmp, extra, folder)
                total, per = score(res, args.seconds - args.window, args.seconds)
                rows.append((label, total, per))
                again[budget][kind].append(total)
    first = budgets[0]
    base = next(t for n, t, _ in rows if n == f"even, budget {first}")
    headers = [
        "run",
        "sum throughput/limit",
        f"vs even, budget {first}",
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
    auto = rows[1][1]
    targets = {"emulated": (1.30, 1.00), "real": (1.15, 1.00)}[args.mix]
    for budget in budgets:
        even = next(t for n, t, _ in rows if n == f"even, budget {budget}")
        label = f"adaptive, budget {budget}"
        adaptive, per = next((t, q) for n, t, q in rows if n == label)
        conv = converged_at(runs[label], adaptive, args.seconds)
        errors = prediction_errors(tmp / f"adaptive-{budget}", per)
        better = max(even, none)
        statics, adaptives = again[budget]["static"], again[budget]["adaptive"]
        # the mean of every adaptive run against the mean of the static split's reruns: runs
        # of one length and window (the search's value is the best of many shorter runs)
        vs_again = (
            (adaptive + sum(adaptives)) / (1 + len(adaptives)) / (sum(statics) / len(statics))
            if statics
            else None
        )
        summary[budget] = {
            "adaptive_vs_better_baseline": adaptive / better,
            "adaptive_vs_even_same_budget": adaptive / even,
            "adaptive_vs_no_sidecar": adaptive / none,
            "adaptive_vs_auto": adaptive / auto,
            "adaptive_vs_static_best_same_budget": adaptive / best[budget][0],
            "adaptive_vs_static_again": vs_again,
            "static_again": statics,
            "adaptive_again": adaptives,
            "converged_s": conv,
            "prediction_error": errors,
        }
        print(
            f"budget {budget}: adaptive / the better of (no sidecar, even at this budget) = "
            f"{adaptive / better:.2f} (target >= {targets[0]:.2f}); adaptive / {AUTO} = "
            f"{adaptive / auto:.2f} (target >= 1.05); adaptive / the best static "
            f"split within this budget = {adaptive / best[budget][0]:.2f} (target >= "
            f"{targets[1]:.2f})"
            + (
                f", mean of {1 + len(adaptives)} adaptive runs / that split run again "
                f"(mean of {len(statics)}) = {vs_again:.2f}"
                if vs_again is not None
                else ""
            )
            + "; reached 95% of its final score after "
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
    plots.jobs_timeline(runs, args.seconds, outs(f"{stem}.png"))
    print(f"wrote {outs(stem + '.json')} and {outs(stem + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
