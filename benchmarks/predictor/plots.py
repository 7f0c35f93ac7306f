"""The predictor benchmark's plot: it takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import machine, pyplot


def model_errors(scatter: dict[str, Any], curves: dict[str, Any], png: Path) -> Path:
    plt = pyplot()

    fig, axes = plt.subplots(1, 1 + len(curves), figsize=(4.2 * (1 + len(curves)), 4))
    ax = axes[0]
    for app, pts in scatter.items():
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=5, label=app)
    lim = [
        min(p[0] for v in scatter.values() for p in v),
        max(p[0] for v in scatter.values() for p in v),
    ]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title("scaling model, unseen placements", fontsize=9)
    ax.legend(fontsize=7)
    for ax, (name, c) in zip(axes[1:], curves.items(), strict=True):
        ax.plot(c["ks"], c["real"], "o-", label="measured")
        ax.plot(c["ks"], c["pred"], "s--", label="predicted")
        seen = [c["real"][c["ks"].index(k)] for k in c["seen"]]
        ax.scatter(
            c["seen"], seen, s=90, facecolors="none", edgecolors="k", label="observed by the model"
        )
        ax.set_xlabel("loader workers (2 cores)")
        ax.set_ylabel("samples/s")
        ax.set_title(f"loader model: {name}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(machine(), fontsize=8)
    fig.tight_layout()
    path = png
    fig.savefig(path, dpi=110)
    return path


def node_errors(results: dict[str, Any], png: Path) -> Path:
    """bench_nodes: per application, the median signed held-out error by node count, the
    parametric model against the per-node corrected one."""
    plt = pyplot()
    apps = list(results)
    fig, axes = plt.subplots(
        1, len(apps), figsize=(3.2 * len(apps), 3.4), sharey=True, squeeze=False
    )
    axes = axes[0]
    for ax, app in zip(axes, apps, strict=True):
        for label, style in (("parametric", "o--"), ("per-node", "s-")):
            errors = results[app][label]
            nodes = sorted(int(n) for n in errors)
            medians = [100 * float(np.median(errors[str(n)])) for n in nodes]
            ax.plot(nodes, medians, style, label=label)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_title(app, fontsize=9)
        ax.set_xlabel("nodes")
    axes[0].set_ylabel("held-out step-time error, median (%)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"scaling model across nodes ({machine()})", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
