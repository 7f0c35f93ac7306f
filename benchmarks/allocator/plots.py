"""The allocator benchmarks' plots: each takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import machine, pyplot


def jct_cdfs(
    curves: dict[int, dict[str, tuple[list[float], int]]],
    published: dict[int, float],
    png: Path,
    title: str,
) -> None:
    """One panel per workload: the CDF of job completion times per policy (``curves``:
    workload -> label -> (the finished jobs' JCTs in hours, the workload's job count)), and the
    published average JCT as a dashed line."""
    plt = pyplot()
    workloads = sorted(curves)
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for label, (jct, total) in curves[w].items():
            xs = np.sort(jct)
            ax.step(xs, np.arange(1, len(xs) + 1) / max(total, 1), where="post", label=label)
        if w in published:
            ax.axvline(published[w], color="grey", lw=0.8, ls="--", label="published (avg)")
        ax.set_xscale("log")
        ax.set_title(f"workload {w}", fontsize=9)
        ax.set_xlabel("JCT (h)")
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("share of jobs")
    fig.suptitle(f"{title}\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def decision_time(results: list[dict[str, Any]], png: Path) -> None:
    """Median decision time by jobs, per policy and cluster size, with the targets."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = {"goodput-dp": "-", "goodput-dp + CPUs": "--", "elastic-gpu": ":"}
    for policy in dict.fromkeys(r["policy"] for r in results):
        for gpus, marker in ((64, "o"), (512, "^"), (1024, "v"), (2048, "s")):
            pts = [r for r in results if r["policy"] == policy and r["gpus"] == gpus]
            if pts:
                ax.plot(
                    [r["jobs"] for r in pts],
                    [r["decide_ms_p50"] for r in pts],
                    marker=marker,
                    linestyle=styles.get(policy, "-."),
                    label=f"{policy}, {gpus} GPUs",
                )
    ax.axhline(10, color="grey", lw=0.8, ls="--")
    ax.axhline(300, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("jobs")
    ax.set_ylabel("decision time, median (ms)")
    ax.set_title(f"allocator decision time (targets dashed)\n{machine()}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def cpu_ratios(ratios: dict[str, dict[str, list[float]]], png: Path) -> None:
    """goodput-dp's average JCT over each peer's, one dot per scenario, a bar at the median, by
    group (``ratios``: group -> peer -> ratios); below 1 goodput-dp is faster."""
    plt = pyplot()
    groups = list(ratios)
    peers = sorted({p for g in ratios.values() for p in g})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups)), 4.2))
    width = 0.8 / max(len(peers), 1)
    for i, peer in enumerate(peers):
        for x, g in enumerate(groups):
            values = ratios[g].get(peer, [])
            if not values:
                continue
            at = x - 0.4 + width * (i + 0.5)
            ax.scatter([at] * len(values), values, s=12, color=f"C{i}", alpha=0.7)
            ax.hlines(np.median(values), at - width / 2, at + width / 2, color=f"C{i}", lw=2)
        ax.scatter([], [], color=f"C{i}", label=f"/ {peer}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g.replace(", ", "\n") for g in groups], fontsize=7)
    ax.set_ylabel("goodput-dp avg JCT / peer's")
    ax.legend(fontsize=7)
    fig.suptitle(f"GPUs and CPUs decided together (bar: median)\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def pool_shares(speeds: dict[str, dict[str, Any]], png: Path) -> None:
    """Per GPU speed, each workload's share of the average-JCT gain the CPU pool reached (of
    what the same cores on the GPU nodes give), its p99 and makespan ratios; a bar at the
    median share."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(speeds.values()):
        shares = [s for s in r["shares"] if s == s]
        if not shares:
            continue
        ax.scatter([i] * len(shares), shares, s=14, color="C0", alpha=0.7)
        ax.hlines(np.median(shares), i - 0.3, i + 0.3, color="C0", lw=2)
        ax.scatter([i + 0.15] * len(r["p99"]), r["p99"], s=10, color="C1", marker="x")
        ax.scatter([i - 0.15] * len(r["makespan"]), r["makespan"], s=10, color="C2", marker="+")
    ax.scatter([], [], color="C0", label="share of the gain")
    ax.scatter([], [], color="C1", marker="x", label="p99 JCT, pool / none")
    ax.scatter([], [], color="C2", marker="+", label="makespan, pool / none")
    ax.axhline(0.6, color="grey", lw=0.8, ls="--")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xticks(range(len(speeds)), [f"GPU x{s}" for s in speeds])
    ax.legend(fontsize=7)
    fig.suptitle(f"a CPU pool for input pipelines (goodput-dp)\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def ratio_intervals(ratios: dict[str, dict[str, Any]], labels: list[str], png: Path) -> None:
    """One row per ratio: each workload's jitters (dots), the median over all
    (a bar) and its 95% interval (a band); 1 is parity, left of it the first arm is ahead."""
    plt = pyplot()
    names = list(ratios)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    for i, name in enumerate(names):
        r = ratios[name]
        lo, hi = r["interval"]
        ax.fill_betweenx([i - 0.3, i + 0.3], lo, hi, color="C0", alpha=0.2, lw=0)
        ax.vlines(r["median"], i - 0.3, i + 0.3, color="C0", lw=2)
        for j, lab in enumerate(labels):
            vals = r["per_workload"][lab]
            y = i + 0.25 * (j / max(len(labels) - 1, 1) - 0.5)
            ax.scatter(vals, [y] * len(vals), s=6, color="C1" if "pollux-" in lab else "C2")
    ax.scatter([], [], s=6, color="C1", label="Pollux workloads 1-4 (each jitter)")
    ax.scatter([], [], s=6, color="C2", label="Philly draws (each jitter)")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (median bar, 95% interval band)")
    ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"admission by attained service (goodput-dp)\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
