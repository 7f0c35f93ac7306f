"""``dloader-sim``: replay a workload under cluster policies and compare them.

Examples (the Pollux traces, workloads 1-8 and the Philly arrivals ship with the package)::

    dloader-sim --workload 1 --policy goodput-dp --out results.json
    dloader-sim --workload jobs.csv --traces traces/ --policy all --out cmp.json --plot cmp.png
    dloader-sim --philly --philly-jobs 1000 --time-scale 30 --nodes 512 --out philly.json
    dloader-sim --philly --philly-jobs 200 --jobs-per-hour 9 --cpus-per-node 12 \
        --policy goodput-dp,synergy --out steady.json       # steady load, as Synergy's runs
    dloader-sim --workload 2 --cpus-per-node 12 --policy goodput-dp,goodput-dp-cpu-blind,synergy \
        --out cpu.json
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from dloader._shared.cli import finite, positive
from dloader.allocator.cpu_profiles import PACKAGED_CPU_PROFILES, read_cpu_profiles
from dloader.allocator.optimizer import (
    DEFAULT_HORIZON_S,
    DEFAULT_RESTART_S,
    POOL_EFFICIENCY,
    Cluster,
)
from dloader.allocator.policies import POLICIES, make_policy
from dloader.allocator.simulator import LEARNING, SimResult, Simulator
from dloader.allocator.traces import (
    DURATIONS,
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    POLLUX_NUMBERS,
    WorkloadJob,
    jitter_arrivals,
    load_apps,
    packaged_workload,
    read_philly,
    read_workload,
)
from dloader.errors import AllocatorError

__all__ = ["main"]

log = logging.getLogger("dloader.allocator.sim")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloader-sim",
        description="Trace-driven simulator of the cluster GPU allocator. Replays job arrivals "
        "(a Pollux workload CSV or Philly arrivals) with application behaviour measured in the "
        "Pollux traces, under one or more policies, and reports job completion times (JCT), "
        "makespan, GPU utilisation and optimizer time.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--workload",
        help="workload CSV (name,time,application,num_replicas,batch_size), or "
        f"{POLLUX_NUMBERS} for the Pollux workload shipped with the package",
    )
    src.add_argument(
        "--philly",
        type=Path,
        nargs="?",
        const=PACKAGED_PHILLY,
        help="Philly arrivals CSV (timestamp,duration,num_gpus,...; .gz too); without a path: "
        "the copy shipped with the package",
    )
    p.add_argument(
        "--traces",
        type=Path,
        default=PACKAGED_TRACES,
        help="Pollux traces/ folder, one subfolder per application (default: shipped copy)",
    )
    p.add_argument(
        "--policy",
        default="goodput-dp",
        help=f"policy, a comma-separated list, or 'all' ({', '.join(POLICIES)})",
    )
    p.add_argument("--out", type=Path, required=True, help="results JSON to write")
    p.add_argument("--csv", type=Path, help="per-job CSV (default: next to --out)")
    p.add_argument("--plot", type=Path, help="PNG: JCT CDF and GPUs per job over time")
    p.add_argument("--nodes", type=int, default=16, help="nodes in the cluster")
    p.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node")
    p.add_argument(
        "--cpus-per-node",
        type=positive,
        help="CPU cores per node for the jobs' input pipelines (default: unlimited, every "
        "pipeline feeds its GPUs); e.g. 12 for 3 per GPU on 4-GPU nodes",
    )
    p.add_argument(
        "--cpu-profiles",
        type=Path,
        default=PACKAGED_CPU_PROFILES,
        help="with --cpus-per-node: how fast each application's input pipeline is on the "
        "cores it gets (Synergy's format; default: Synergy's profiles, shipped with the package)",
    )
    p.add_argument(
        "--gpu-speed",
        type=positive,
        default=1.0,
        help="with --cpus-per-node: the GPUs' speed over the V100 the profiles were measured "
        "on; a GPU s times faster needs s times the cores (about 3 for an H100)",
    )
    p.add_argument(
        "--cpu-pool-nodes",
        type=int,
        default=0,
        help="with --cpus-per-node: CPU-only nodes whose cores run jobs' loader workers "
        "remotely (Ray; default 0: no pool)",
    )
    p.add_argument(
        "--cpu-pool-cores",
        type=positive,
        default=16.0,
        help="cores of each CPU-only node of the pool (default 16)",
    )
    p.add_argument(
        "--pool-efficiency",
        type=positive,
        default=POOL_EFFICIENCY,
        help="what a pool core (or one lent by another node, goodput-dp-lend) feeds as a "
        "share of what a core on the job's node feeds "
        f"(default {POOL_EFFICIENCY}: measured by benchmarks/loader/bench_remote.py)",
    )
    p.add_argument(
        "--pooled-cores",
        action="store_true",
        help="with --cpus-per-node: the pooled same-cores bound, not a real cluster: each "
        "policy's GPUs and batches, but all the nodes' cores one pool divided by each job's "
        "true need (what a perfect division of the same cores could feed)",
    )
    p.add_argument(
        "--input-prior",
        action="store_true",
        help="with --cpus-per-node, online: a job that has not run yet brings the input curve "
        "its application's earlier jobs measured (as a JobSpec.input_curve from an earlier run)",
    )
    p.add_argument(
        "--declared-lengths",
        type=finite,
        metavar="SIGMA",
        help="every job declares its length (its epochs) and reports the share done, which "
        "goodput-dp weighs: 0 declares the true length, SIGMA > 0 the true length times "
        "exp(N(0, SIGMA)) per job (an estimate off by that much); default: none declared",
    )
    p.add_argument("--interval", type=finite, default=60.0, help="seconds between decisions")
    p.add_argument(
        "--restart-delay",
        type=finite,
        default=DEFAULT_RESTART_S,
        help="seconds a placement change costs",
    )
    p.add_argument(
        "--learning",
        choices=LEARNING,
        default="online",
        help="online: each job's throughput model is fitted only to what it has run so far "
        "(the honest mode); oracle: fitted offline to every measurement of its application",
    )
    p.add_argument(
        "--losses",
        action="store_true",
        help="also print, per application, where the time went (queue, restarts, placement)",
    )
    p.add_argument(
        "--horizon",
        type=finite,
        default=DEFAULT_HORIZON_S,
        help="seconds a restart is amortised over",
    )
    p.add_argument(
        "--within-hours", type=finite, default=4.0, help="count jobs completed in the first N h"
    )
    p.add_argument("--max-hours", type=finite, help="stop the simulated clock after N hours")
    p.add_argument("--philly-jobs", type=int, default=1000, help="Philly jobs to replay")
    p.add_argument(
        "--philly-max-gpus",
        type=int,
        metavar="N",
        help="Philly: the most GPUs a job asks for, larger requests cut to it (default: the "
        "cluster's GPUs; 1: single-GPU jobs, as Synergy's Fig. 8)",
    )
    p.add_argument(
        "--time-scale", type=finite, default=1.0, help="Philly: divide arrival times by this"
    )
    p.add_argument(
        "--jobs-per-hour",
        type=finite,
        metavar="R",
        help="Philly, steady load: the drawn jobs arrive as a Poisson process at R jobs/h "
        "(as Synergy's experiments: its default 9 jobs/h) instead of at the trace's times",
    )
    p.add_argument(
        "--class-split",
        metavar="I,L,S",
        help="Philly: weights of image, language and speech jobs (Synergy's experiments: "
        "20,70,10); each job's class is drawn by them, its application within the class by "
        "its GPU time (default: the application by GPU time alone)",
    )
    p.add_argument(
        "--synergy-models",
        action="store_true",
        help="with --class-split and --cpus-per-node: each job's input pipeline is one of the "
        "models Synergy's artifact draws for its class (image: alexnet, res18, res50, "
        "mobilenet, shufflenet; language: gnmt, transformer, lstm; speech: m5, deepspeech), "
        "its GPUs still its application's (default: its application's CPU profile)",
    )
    p.add_argument(
        "--durations",
        choices=DURATIONS,
        default="app",
        help="Philly: how long each job runs. app (default): its application's length; "
        "philly: as long as it ran in the trace; synergy: a length drawn as Synergy's "
        "artifact draws it (10**U minutes, U uniform on 1.5-3 for 80%% of jobs, 3-4 for the "
        "rest). Both of the last measure the length at the job's requested GPUs with their "
        "share of the cores, and keep, as the artifact does, the jobs that ran 31.6 min to "
        "167 h on at most 16 GPUs",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="Philly: window and application draw (default: a new one each run, printed)",
    )
    p.add_argument(
        "--jitter-seeds",
        type=int,
        default=0,
        help="run every policy on K copies of the workload, each arrival moved by up to "
        "--jitter-s seconds (seeds 0..K-1), and report each policy's median and range over "
        "them: one run cannot tell a policy's effect from the luck of its arrival times "
        "(default 0: the arrivals as given, once)",
    )
    p.add_argument(
        "--jitter-s", type=finite, default=30.0, help="with --jitter-seeds: the largest shift"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _policies(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [n.strip() for n in text.split(",") if n]
    for n in names:
        if n not in POLICIES:
            raise AllocatorError(f"--policy {n!r}: expected one of {', '.join(POLICIES)} or all")
    return names


def _run(sim: Simulator, label: str, total: int, quiet: bool, max_s: float | None) -> SimResult:
    if quiet:
        return sim.run(max_time_s=max_s)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done, simulated {task.fields[hours]:.1f} h"),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(label, total=total, hours=0.0)

        def step(t: float, done: int, _total: int) -> None:
            bar.update(task, completed=done, hours=t / 3600)

        return sim.run(max_time_s=max_s, on_step=step)


def write_csv(path: Path, results: Sequence[SimResult]) -> None:
    """One row per job and policy."""
    with path.open("w", newline="") as f:
        w = None
        for r in results:
            for job in r.jobs:
                row = {"policy": r.policy, **asdict(job)}
                if w is None:
                    w = csv.DictWriter(f, fieldnames=list(row))
                    w.writeheader()
                w.writerow(row)


def plot(path: Path, results: Sequence[SimResult]) -> None:
    """JCT CDF per policy, and a heat map of GPUs per job over time for each policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(results)
    fig, axes = plt.subplots(1, n + 1, figsize=(5 * (n + 1), 4.2), squeeze=False)
    ax = axes[0][0]
    for r in results:
        jct = np.sort([j.jct_s / 3600 for j in r.jobs if j.jct_s is not None])
        ax.step(jct, np.arange(1, len(jct) + 1) / len(r.jobs), where="post", label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.legend()
    for ax, r in zip(axes[0][1:], results, strict=True):
        grid = np.array([r.gpus[j.name] for j in r.jobs], dtype=float)
        grid[grid == 0] = np.nan
        hours = (r.times[-1] - r.times[0]) / 3600 if r.times else 1.0
        im = ax.imshow(
            grid,
            aspect="auto",
            interpolation="nearest",
            extent=(0, hours, len(r.jobs), 0),
            cmap="viridis",
        )
        ax.set_xlabel("time (h)")
        ax.set_ylabel("job (by arrival)")
        ax.set_title(f"{r.policy}: GPUs per job")
        fig.colorbar(im, ax=ax, label="GPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _workload(args: argparse.Namespace) -> tuple[list[WorkloadJob], dict]:
    if args.workload is not None:
        w = args.workload
        jobs = read_workload(packaged_workload(int(w)) if w.isdigit() else Path(w))
        return jobs, load_apps(args.traces, sorted({j.application for j in jobs}))
    apps = load_apps(args.traces)
    cluster_gpus = args.nodes * args.gpus_per_node
    jobs = read_philly(
        args.philly,
        apps,
        num_jobs=args.philly_jobs,
        seed=args.seed,
        time_scale=args.time_scale,
        max_gpus=min(args.philly_max_gpus or cluster_gpus, cluster_gpus),
        jobs_per_hour=args.jobs_per_hour,
        class_split=_split(args.class_split),
        durations=args.durations,
        synergy_models=args.synergy_models,
    )
    return jobs, apps


def _split(text: str | None) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        i, lang, speech = (float(x) for x in text.split(","))
    except ValueError:
        raise AllocatorError(
            f"--class-split {text!r}: expected three comma-separated weights (image, "
            "language, speech), e.g. 20,70,10"
        ) from None
    return i, lang, speech


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        names = _policies(args.policy)
        cluster = Cluster.uniform(args.nodes, args.gpus_per_node, args.cpus_per_node)
        if args.cpus_per_node is not None:  # the pool's, and cores lent across nodes
            cluster = replace(cluster, pool_efficiency=min(args.pool_efficiency, 1.0))
        if args.cpu_pool_nodes:
            if args.cpu_pool_nodes < 0 or args.cpus_per_node is None:
                raise AllocatorError(
                    f"--cpu-pool-nodes {args.cpu_pool_nodes}: expected >= 0 nodes, and "
                    "--cpus-per-node (where cores are unlimited no pipeline needs a pool)"
                )
            cluster = replace(cluster, pool=args.cpu_pool_nodes * args.cpu_pool_cores)
        if args.jobs_per_hour is not None and (args.philly is None or args.time_scale != 1):
            raise AllocatorError(
                f"--jobs-per-hour {args.jobs_per_hour:g}: a Philly draw's steady load "
                "(expected with --philly, and without --time-scale: the rate sets the load)"
            )
        if args.class_split is not None and args.philly is None:
            raise AllocatorError(f"--class-split {args.class_split}: expected with --philly")
        if args.synergy_models and (args.class_split is None or args.cpus_per_node is None):
            raise AllocatorError(
                "--synergy-models: expected with --class-split and --cpus-per-node"
            )
        if args.philly_max_gpus is not None and args.philly_max_gpus < 1:
            raise AllocatorError(f"--philly-max-gpus {args.philly_max_gpus}: expected >= 1")
        if args.durations != "app" and args.philly is None:
            raise AllocatorError(f"--durations {args.durations}: expected with --philly")
        if args.philly is not None and args.seed is None:
            args.seed = random.randrange(1 << 31)
            log.info("Philly draw: --seed %d (give it to draw the same workload again)", args.seed)
        if not 0 <= args.jitter_seeds <= 1000:
            raise AllocatorError(f"--jitter-seeds {args.jitter_seeds}: expected 0-1000")
        jobs, apps = _workload(args)
        copies = {"": jobs}
        if args.jitter_seeds:
            copies = {
                f" j{k}": jitter_arrivals(jobs, k, args.jitter_s) for k in range(args.jitter_seeds)
            }
        profiles = read_cpu_profiles(args.cpu_profiles) if cluster.cpus is not None else None
        results = []
        for name in names:
            for tag, workload in copies.items():
                sim = Simulator(
                    workload,
                    apps,
                    make_policy(name, horizon_s=args.horizon),
                    cluster,
                    interval_s=args.interval,
                    restart_s=args.restart_delay,
                    learning=args.learning,
                    cpu_profiles=profiles,
                    gpu_speed=args.gpu_speed,
                    pooled_cores=args.pooled_cores,
                    input_prior=args.input_prior,
                    declared_lengths=args.declared_lengths,
                )
                max_s = None if args.max_hours is None else args.max_hours * 3600
                result = _run(sim, name + tag, len(jobs), args.quiet, max_s)
                results.append(replace(result, policy=name + tag))
    except AllocatorError as exc:
        print(f"dloader-sim: error: {exc}", file=sys.stderr)
        return 2
    summaries = {r.policy: r.summary(args.within_hours) for r in results}
    csv_path = args.csv or args.out.with_suffix(".jobs.csv")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_csv(csv_path, results)
    if args.plot is not None:
        try:
            plot(args.plot, results)
        except ImportError:
            log.warning("matplotlib is not installed; no plot (pip install matplotlib)")
    single = len(names) == 1 and not args.jitter_seeds
    payload: dict = dict(summaries[names[0]]) if single else {"policies": summaries}
    if args.jitter_seeds:
        payload["jitter"] = _jitter_summary(names, summaries, args.jitter_seeds)
    payload["losses"] = {r.policy: r.losses() for r in results}
    payload.update(
        learning=args.learning,
        jobs_csv=str(csv_path),
        cluster={
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "cpus_per_node": args.cpus_per_node,
            "cpu_pool_cores": cluster.pool,
            "pool_efficiency": cluster.pool_efficiency,
        },
        gpu_speed=args.gpu_speed,
        seed=args.seed,
        jitter_seeds=args.jitter_seeds,
        jitter_s=args.jitter_s,
        interval_s=args.interval,
        restart_delay_s=args.restart_delay,
    )
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    _table(summaries)
    if args.jitter_seeds:
        _jitter_table(payload["jitter"], names[0], args.jitter_seeds, args.jitter_s)
    if args.losses:
        for r in results:
            _loss_table(r)
    return 0


def _table(summaries: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="dloader-sim")
    cols = (
        "policy",
        "done",
        "avg JCT h",
        "p99 JCT h",
        "makespan h",
        "GPU util",
        "CPU util",
        "restarts",
        "opt ms",
    )
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    for name, s in summaries.items():
        t.add_row(
            name,
            f"{s['jobs_completed']}/{s['jobs']}",
            f"{s['avg_jct_s'] / 3600:.3f}",
            f"{s['p99_jct_s'] / 3600:.2f}",
            f"{s['makespan_s'] / 3600:.2f}",
            f"{s['gpu_utilisation']:.2f}",
            "-" if math.isnan(s["cpu_utilisation"]) else f"{s['cpu_utilisation']:.2f}",
            str(s["restarts"]),
            f"{s['optimizer_ms_p50']:.2f}",
        )
    Console(width=max(Console().width, 110)).print(t)


_JITTERED = (("avg_jct_s", "avg JCT"), ("p99_jct_s", "p99 JCT"), ("makespan_s", "makespan"))


def _jitter_summary(names: list[str], summaries: dict[str, dict], k: int) -> dict[str, dict]:
    """Per policy and metric over the ``k`` jittered copies: the values, their median and
    range, and the same for the ratio to the first policy (copy by copy)."""
    out: dict[str, dict] = {}
    for name in names:
        out[name] = {}
        for key, _ in _JITTERED:
            vals = [summaries[f"{name} j{i}"][key] for i in range(k)]
            ratios = [v / summaries[f"{names[0]} j{i}"][key] for i, v in enumerate(vals)]
            out[name][key] = {
                "values": vals,
                "median": statistics.median(vals),
                "range": [min(vals), max(vals)],
                "ratio_median": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
            }
    return out


def _jitter_table(jitter: dict[str, dict], first: str, k: int, seconds: float) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(f"{k} jittered copies (+-{seconds:g} s): median [range]"))
    t.add_column("policy", justify="right", no_wrap=True)
    for _, label in _JITTERED:
        t.add_column(f"{label} h", justify="right", no_wrap=True)
        t.add_column(f"/ {first}", justify="right", no_wrap=True)
    for name, m in jitter.items():
        cells = []
        for key, _ in _JITTERED:
            v = m[key]
            lo, hi = (x / 3600 for x in v["range"])
            rlo, rhi = v["ratio_range"]
            cells += [
                f"{v['median'] / 3600:.3f} [{lo:.3f}, {hi:.3f}]",
                f"{v['ratio_median']:.3f} [{rlo:.3f}, {rhi:.3f}]",
            ]
        t.add_row(name, *cells)
    Console(width=max(Console().width, 170)).print(t)


def _loss_table(result: SimResult) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{result.policy}: where each application's time went (mean h per job)")
    parts = ("jct", "queue", "restart", "placement", "input", "run")
    for col in ("application", "jobs", *parts, "restarts"):
        t.add_column(col, justify="right", no_wrap=True)
    for app, m in result.losses().items():
        t.add_row(
            app,
            f"{m['jobs']:.0f}",
            *(f"{m[k] / 3600:.3f}" for k in parts),
            f"{m['restarts']:.1f}",
        )
    Console(width=max(Console().width, 110)).print(t)


if __name__ == "__main__":
    sys.exit(main())
