"""The Synergy twin against Synergy's own published comparison, on the workload its artifact
draws (#48 §4): Synergy-TUNE (``synergy``, ``synergy-fifo``) against the same scheduler with
GPU-proportional cores (``synergy-proportional``, ``synergy-fifo-proportional``).

The workload is the artifact's default (msr-fiddle/synergy, ``ae-readme.md``: "Philly-derived
trace", Figs. 7-8): its cluster (16 servers x 8 GPUs x 24 cores), jobs arriving as a Poisson
process at ``--loads`` jobs/h, 20% image, 70% language and 10% speech jobs, each job's input
pipeline one of the artifact's models of its class (``--synergy-models``), its length drawn as
the artifact draws it at the GPU-proportional share (``--durations synergy``), one GPU each
(Fig. 8; ``--multi-gpu``: the trace's GPU counts, Fig. 7). As the artifact, the average JCT is
over a window of the stream (``--window A:B``: the jobs arriving A-th to B-th; the artifact's:
jobs 4000-5000 of an endless stream), so that neither the empty cluster of the start nor the
drain at the end weighs in. The GPU side of each job is its Pollux application's (the
simulator's); the artifact has no GPU model beyond a job's iteration time.

Published to compare with: FIFO-TUNE at 9 jobs/h, one GPU per job, average JCT 21.88 h over
jobs 4000-5000 (``ae-readme.md``, "a quick point of validation" against Fig. 8, one draw: seed 42
of its runner); TUNE's gain "up to 3.4x" in average JCT (the abstract). At 9 jobs/h the cluster
is at the edge of saturation, where a draw's few percent more or less work doubles or halves the
queue, so one draw says little: each ratio (proportional / TUNE, average JCT over the window) is
the median over ``--seeds`` draws with a 95% interval (draws resampled) and its range. For the
FIFO arms each draw is also put beside the pure queue the twin reduces to on one-GPU jobs
(first come, first served on the 128 GPUs, each job running its length, or its length over its
profile's speed-up at its ideal cores: TUNE's ceiling), with the load the draw offers, and a
second panel plots each draw's speed-up against its FIFO-TUNE JCT with the artifact's point.

    python -m benchmarks.allocator.bench_synergy      # 9 jobs/h, 10 draws, FIFO: ~1 h, 2 cores
    python -m benchmarks.allocator.bench_synergy --loads 6,8,9,10 --seeds 2 --orders fifo,las
    python -m benchmarks.allocator.bench_synergy --loads 9 --jobs 1500 --window 500:1000  # ~6 min

Prints the table, writes ``bench_synergy.json`` and ``bench_synergy.png`` (average JCT over
load per arm, as the paper's figures).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from benchmarks._common import add_out_dir, machine, outputs, pyplot, table
from benchmarks.allocator.bench_admission import interval
from dloader.allocator import Cluster
from dloader.allocator.cpu_profiles import read_cpu_profiles
from dloader.allocator.policies import make_policy
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    AppTrace,
    WorkloadJob,
    load_apps,
    read_philly,
)

__all__ = ["main", "window_jct"]

#: (TUNE, GPU-proportional) per order.
ARMS = {
    "fifo": ("synergy-fifo", "synergy-fifo-proportional"),
    "las": ("synergy", "synergy-proportional"),
}
SPLIT = (20.0, 70.0, 10.0)
#: The artifact's cluster: 16 servers of 8 V100s and 24 cores.
NODES, GPUS, CORES = 16, 8, 24.0
#: ``ae-readme.md``: FIFO-TUNE, 9 jobs/h, one GPU per job, jobs 4000-5000.
PUBLISHED_FIFO_TUNE_9_H = 21.876600555555555


def arrival_index(name: str) -> int:
    """A job's place in its draw's stream: the number ending the name a Philly draw gives it."""
    return int(name.rsplit("-", 1)[1])


def window_jct(jobs: list[Any], window: tuple[int, int]) -> float:
    """Mean JCT in seconds of the jobs whose arrival index is in ``[a, b)``; NaN if one of them
    did not complete."""
    a, b = window
    jct = [j.jct_s for j in jobs if a <= arrival_index(j.name) < b]
    if not jct or any(x is None for x in jct):
        return float("nan")
    return float(np.mean(jct))


def draw(
    load: float, seed: int, jobs: int, multi_gpu: bool, apps: dict[str, AppTrace] | None = None
) -> list[WorkloadJob]:
    """The artifact's workload at ``load`` jobs/h, drawn with ``seed`` (``apps``: the packaged
    applications, loaded if not given)."""
    return read_philly(
        PACKAGED_PHILLY,
        load_apps(PACKAGED_TRACES) if apps is None else apps,
        num_jobs=jobs,
        seed=seed,
        max_gpus=NODES * GPUS if multi_gpu else 1,
        jobs_per_hour=load,
        class_split=SPLIT,
        durations="synergy",
        synergy_models=True,
    )


def queue_jct(arrival_s: np.ndarray, runtime_s: np.ndarray, gpus: int) -> np.ndarray:
    """Each job's JCT in a first-come, first-served queue of ``gpus`` GPUs, one GPU a job,
    job ``i`` arriving at ``arrival_s[i]`` (non-decreasing) and running ``runtime_s[i]``."""
    free = [0.0] * gpus
    jct = np.empty(len(arrival_s))
    for i, (a, r) in enumerate(zip(arrival_s, runtime_s, strict=True)):
        start = max(heapq.heappop(free), a)
        heapq.heappush(free, start + r)
        jct[i] = start + r - a
    return jct


def queue_reference(work: list[WorkloadJob], window: tuple[int, int]) -> dict[str, float]:
    """What the twin's FIFO arms reduce to on a one-GPU-a-job draw: the pure queue with each
    job running its length (GPU-proportional cores) or its length over its profile's speed-up
    at its ideal cores (TUNE with every job at its ideal, the most cores can give), and the
    load each offers (its GPU-seconds over the arrival span's GPU-seconds)."""
    profiles = read_cpu_profiles()
    order = sorted(work, key=lambda j: j.time)
    arrival = np.array([j.time for j in order])
    length = np.array([j.duration_s or 0.0 for j in order])
    speedup = np.array([1.0 / profiles[str(j.cpu_profile)].share(CORES / GPUS) for j in order])
    index = np.array([arrival_index(j.name) for j in order])
    measured = (index >= window[0]) & (index < window[1])
    span = NODES * GPUS * (arrival[-1] - arrival[0])
    out = {}
    for key, runtime in (("proportional", length), ("ideal", length / speedup)):
        out[f"{key}_load"] = float(runtime.sum() / span)
        jct = queue_jct(arrival, runtime, NODES * GPUS)[measured]
        out[f"{key}_queue_h"] = float(jct.mean()) / 3600
    return out


def simulate(
    load: float, seed: int, arm: str, jobs: int, window: tuple[int, int], multi_gpu: bool
) -> tuple[float, int, str, dict[str, Any]]:
    """One arm at one load on one draw: (load, seed, arm, its numbers)."""
    apps = load_apps(PACKAGED_TRACES)
    work = draw(load, seed, jobs, multi_gpu, apps)
    began = time.perf_counter()
    result = Simulator(work, apps, make_policy(arm), Cluster.uniform(NODES, GPUS, CORES)).run()
    summary = result.summary()
    summary["window_jct_s"] = window_jct(result.jobs, window)
    summary["seconds"] = time.perf_counter() - began
    return load, seed, arm, summary


def queue_gain(ref: dict[str, float]) -> float:
    """The pure queue's proportional / TUNE-ceiling average JCT."""
    return ref["proportional_queue_h"] / ref["ideal_queue_h"]


def plot_queue(
    ax: Any, refs: dict[tuple[float, int], dict[str, float]], label: str, title: str
) -> None:
    """Each draw's pure-queue gain against its TUNE-ceiling JCT (beside the twin's, if the
    caller drew them), the artifact's point, the axes' labels."""
    for load in sorted({k[0] for k in refs}):
        q = [r for k, r in refs.items() if k[0] == load]
        ax.scatter([r["ideal_queue_h"] for r in q], [queue_gain(r) for r in q], marker="x",
                   label=f"{label}{load:g} jobs/h")  # fmt: skip
    ax.plot([PUBLISHED_FIFO_TUNE_9_H], [3.4], "k*", ms=12, label="artifact (21.88 h, 3.4x)")
    ax.set_xlabel("FIFO-TUNE avg JCT of the draw (hours)")
    ax.set_ylabel("FIFO: proportional / TUNE")
    ax.set_title(title)
    ax.legend(fontsize=7)


def queue_only(
    loads: list[float], seeds: list[int], jobs: int, window: tuple[int, int], out: Any
) -> int:
    """``--queue-only``: each draw's pure FIFO queues (see ``queue_reference``), the spread of
    TUNE's ceiling and of its speed-up over draws, table, JSON and plot."""
    rng = np.random.default_rng(seeds[0])
    apps = load_apps(PACKAGED_TRACES)
    refs = {
        (x, s): queue_reference(draw(x, s, jobs, False, apps), window) for x in loads for s in seeds
    }
    rows = []
    for load in loads:
        q = [refs[load, s] for s in seeds]
        ratio = {str(s): [queue_gain(r)] for s, r in zip(seeds, q, strict=True)}
        mid, lo, hi, _ = interval(ratio, rng)
        ideal = [r["ideal_queue_h"] for r in q]
        rows.append(
            [
                f"{load:g}",
                str(len(seeds)),
                f"{np.median([r['proportional_load'] for r in q]):.3f}",
                f"{np.median(ideal):.1f} [{np.percentile(ideal, 2.5):.1f}, "
                f"{np.percentile(ideal, 97.5):.1f}]",
                f"{mid:.2f} [{lo:.2f}, {hi:.2f}]",
                str(sum(x <= PUBLISHED_FIFO_TUNE_9_H for x in ideal)),
            ]
        )
    print()
    print(
        "## The pure FIFO queue of each draw (no twin), average JCT of jobs "
        f"{window[0]}-{window[1]}"
    )
    cols = ["jobs/h", "draws", "offered load (median)", "TUNE's ceiling h [2.5-97.5%]",
            "speed-up [95%]", "draws <= 21.88 h"]  # fmt: skip
    print(table(cols, rows))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_queue(ax, refs, "", "pure FIFO queue of each draw, every job at its ideal")
    fig.tight_layout()
    fig.savefig(out("bench_synergy.png"), dpi=110)
    plt.close(fig)
    payload = {"machine": machine(), "seeds": seeds, "jobs": jobs, "window": list(window),
               "queue": {f"{k[0]:g}/{k[1]}": v for k, v in refs.items()}}  # fmt: skip
    out("bench_synergy.json").write_text(json.dumps(payload, indent=2))
    print(f"wrote {out('bench_synergy.json')} and {out('bench_synergy.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.allocator.bench_synergy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--loads", default="9", help="jobs per hour, comma-separated (default 9)")
    p.add_argument("--jobs", type=int, default=5500, help="jobs per draw (default 5500)")
    p.add_argument(
        "--window", default="4000:5000", help="A:B, the jobs measured (default 4000:5000)"
    )
    p.add_argument("--orders", default="fifo", help="fifo, las or fifo,las (default fifo)")
    p.add_argument("--seeds", type=int, default=10, help="draws per load (default 10)")
    p.add_argument("--seed", type=int, help="first draw's seed (default: a new one, printed)")
    p.add_argument("--multi-gpu", action="store_true", help="the trace's GPU counts (Fig. 7)")
    p.add_argument(
        "--queue-only",
        action="store_true",
        help="only the pure FIFO queue of each draw (seconds a draw, no twin): how much draws "
        "differ, e.g. --queue-only --seeds 30",
    )
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    add_out_dir(p)
    args = p.parse_args(argv)
    try:
        loads = [float(x) for x in args.loads.split(",") if x]
        a, b = (int(x) for x in args.window.split(":"))
    except ValueError:
        p.error(f"--loads {args.loads!r} / --window {args.window!r}: expected numbers, A:B")
    orders = [x for x in args.orders.split(",") if x]
    if not loads or min(loads) <= 0 or any(o not in ARMS for o in orders) or not orders:
        p.error(f"--loads: jobs/h > 0; --orders: some of {', '.join(ARMS)}")
    if not 0 <= a < b <= args.jobs:
        p.error(f"--window {args.window}: expected 0 <= A < B <= --jobs ({args.jobs})")
    if args.seeds < 1 or args.processes < 1:
        p.error("expected --seeds >= 1 and --processes >= 1")
    if args.queue_only and args.multi_gpu:
        p.error("--queue-only: the pure queue is of one-GPU jobs; drop --multi-gpu")
    seed = random.randrange(1, 1 << 30) if args.seed is None else args.seed
    seeds = [seed + i for i in range(args.seeds)]
    arms = [arm for o in orders for arm in ARMS[o]]
    out = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(
        f"{NODES} x {GPUS} GPUs x {CORES:g} cores; {args.jobs} jobs a draw, "
        f"{'the trace GPU counts' if args.multi_gpu else 'one GPU each'}, measured "
        f"{a}-{b}; seeds {seeds[0]}..{seeds[-1]} (--seed {seed} to repeat); loads "
        f"{', '.join(f'{x:g}' for x in loads)} jobs/h; "
        + ("the pure queue only" if args.queue_only else f"arms {', '.join(arms)}"),
        flush=True,
    )
    if args.queue_only:
        return queue_only(loads, seeds, args.jobs, (a, b), out)
    tasks = [(load, s, arm) for load in loads for s in seeds for arm in arms]
    runs: dict[tuple[float, int, str], dict[str, Any]] = {}
    began = time.perf_counter()
    with ProcessPoolExecutor(args.processes) as pool:
        futures = [pool.submit(simulate, *t, args.jobs, (a, b), args.multi_gpu) for t in tasks]
        for i, f in enumerate(futures):
            load, s, arm, summary = f.result()
            runs[load, s, arm] = summary
            print(
                f"  [{i + 1}/{len(tasks)}] {load:g} jobs/h seed {s} {arm}: window "
                f"{summary['window_jct_s'] / 3600:.2f} h, all {summary['avg_jct_s'] / 3600:.2f}"
                f" h ({summary['seconds']:.0f} s; {time.perf_counter() - began:.0f} s in all)",
                file=sys.stderr,
                flush=True,
            )
    refs: dict[tuple[float, int], dict[str, float]] = {}
    if not args.multi_gpu and "fifo" in orders:
        apps = load_apps(PACKAGED_TRACES)
        refs = {
            (x, s): queue_reference(draw(x, s, args.jobs, False, apps), (a, b))
            for x in loads
            for s in seeds
        }
    rng = np.random.default_rng(seed)
    rows, results = [], []
    for order in orders:
        tune, fair = ARMS[order]
        for load in loads:
            t_h = [runs[load, s, tune]["window_jct_s"] / 3600 for s in seeds]
            f_h = [runs[load, s, fair]["window_jct_s"] / 3600 for s in seeds]
            ratio = [f / t for f, t in zip(f_h, t_h, strict=True)]
            mid, lo, hi, _ = interval({str(s): [r] for s, r in zip(seeds, ratio, strict=True)}, rng)
            util = np.mean([runs[load, s, tune]["gpu_utilisation"] for s in seeds])
            rows.append(
                [
                    order.upper(),
                    f"{load:g}",
                    f"{np.median(f_h):.2f}",
                    f"{np.median(t_h):.2f}",
                    f"{mid:.2f} [{lo:.2f}, {hi:.2f}]",
                    f"{min(ratio):.2f}-{max(ratio):.2f}",
                    f"{util:.2f}",
                ]
            )
            results.append(
                {
                    "order": order,
                    "load": load,
                    "proportional_h": f_h,
                    "tune_h": t_h,
                    "ratio": ratio,
                    "ratio_median_interval": [mid, lo, hi],
                    "tune_gpu_utilisation": float(util),
                    "queue": [refs[load, s] for s in seeds] if order == "fifo" and refs else None,
                }
            )
    print()
    print(f"## Synergy-TUNE against GPU-proportional cores, average JCT of jobs {a}-{b}")
    cols = ["order", "jobs/h", "proportional h", "TUNE h", "speed-up [95%]", "range", "GPU util"]
    print(table(cols, rows))
    if refs:
        print()
        print("## Per draw (FIFO): the twin beside the pure queue it reduces to")
        print(
            "offered load: the draw's GPU-hours over the cluster's, at proportional cores and at "
            "every job's ideal; queue: first come, first served on 128 GPUs, each job its length "
            "(proportional) or its length over its profile's ideal speed-up (TUNE's ceiling)"
        )
        per_draw = []
        for load in loads:
            for s in seeds:
                r, prop, tun = (
                    refs[load, s],
                    runs[load, s, ARMS["fifo"][1]],
                    runs[load, s, ARMS["fifo"][0]],
                )
                per_draw.append(
                    [
                        f"{load:g}",
                        str(s),
                        f"{r['proportional_load']:.3f} / {r['ideal_load']:.3f}",
                        f"{prop['window_jct_s'] / 3600:.1f} ({r['proportional_queue_h']:.1f})",
                        f"{tun['window_jct_s'] / 3600:.1f} ({r['ideal_queue_h']:.1f})",
                        f"{prop['window_jct_s'] / tun['window_jct_s']:.2f} ({queue_gain(r):.2f})",
                    ]
                )
        cols = ["jobs/h", "seed", "offered load", "proportional h (queue)", "TUNE h (queue)",
                "speed-up (queue)"]  # fmt: skip
        print(table(cols, per_draw))
    print(
        f"published: FIFO-TUNE {PUBLISHED_FIFO_TUNE_9_H:.2f} h at 9 jobs/h, one GPU per job, jobs "
        "4000-5000, one draw (ae-readme.md, Fig. 8); TUNE up to 3.4x lower average JCT (abstract)"
    )
    if 9.0 in loads and "fifo" in orders and not args.multi_gpu:
        nine = [runs[9.0, s, ARMS["fifo"][0]]["window_jct_s"] / 3600 for s in seeds]
        below = sum(x <= PUBLISHED_FIFO_TUNE_9_H for x in nine)
        print(
            f"the twin's FIFO-TUNE at 9 jobs/h: {min(nine):.1f}-{max(nine):.1f} h over "
            f"{len(nine)} draws, {below} at or under the published point"
        )
    plt = pyplot()
    fig, axes = plt.subplots(1, 2 if refs else 1, figsize=(11 if refs else 6, 4), squeeze=False)
    ax = axes[0][0]
    for order in orders:
        for arm, key in zip(ARMS[order], ("tune_h", "proportional_h"), strict=True):
            ys = [np.median(r[key]) for r in results if r["order"] == order]
            ax.plot(loads, ys, marker="o", label=arm)
    if not args.multi_gpu and "fifo" in orders:
        ax.plot([9], [PUBLISHED_FIFO_TUNE_9_H], "k*", ms=12, label="artifact FIFO-TUNE")
    ax.set_xlabel("load (jobs/hour)")
    ax.set_ylabel(f"avg JCT of jobs {a}-{b} (hours, median of draws)")
    ax.set_title("Synergy twin, " + ("trace GPU counts" if args.multi_gpu else "one GPU a job"))
    ax.legend(fontsize=8)
    if refs:
        ax = axes[0][1]
        for load in loads:
            tj = [runs[load, s, ARMS["fifo"][0]]["window_jct_s"] / 3600 for s in seeds]
            fj = [runs[load, s, ARMS["fifo"][1]]["window_jct_s"] / 3600 for s in seeds]
            ax.scatter(tj, np.divide(fj, tj), label=f"twin, {load:g} jobs/h")
        plot_queue(ax, refs, "pure queue, ", "each draw: heavier draws gain less")
    fig.tight_layout()
    fig.savefig(out("bench_synergy.png"), dpi=110)
    plt.close(fig)
    payload = {
        "machine": machine(),
        "seed": seed,
        "seeds": seeds,
        "jobs": args.jobs,
        "window": [a, b],
        "multi_gpu": args.multi_gpu,
        "results": results,
        "runs": {f"{k[0]:g}/{k[1]}/{k[2]}": v for k, v in runs.items()},
    }
    out("bench_synergy.json").write_text(json.dumps(payload, indent=2, default=float))
    print(f"wrote {out('bench_synergy.json')} and {out('bench_synergy.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
