"""The predictor benchmark's plot: it takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
