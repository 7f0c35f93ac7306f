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
    for policy in ("goodput-dp", "elastic-gpu"):
        for gpus, marker in ((64, "o"), (512, "^"), (1024, "v"), (2048, "s")):
            pts = [r for r in results if r["policy"] == policy and r["gpus"] == gpus]
            if pts:
                ax.plot(
                    [r["jobs"] for r in pts],
                    [r["decide_ms_p50"] for r in pts],
                    marker=marker,
                    linestyle="-" if policy == "goodput-dp" else ":",
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
