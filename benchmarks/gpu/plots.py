"""The GPU benchmark's plot: it takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common import pyplot


def training_runs(out: dict[str, Any], png: Path) -> None:
    """One job's samples/s per run (torch's fixed counts, auto), and the pair's score per run
    (static splits, the sidecar)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (section, job) in zip(axes, (("single", "image_jpeg"), ("pair", None)), strict=True):
        runs = out.get(section, {})
        names = list(runs)
        if job:
            vals = [runs[k]["jobs"][job]["samples_per_s"] for k in names]
            ax.set_ylabel("image_jpeg samples/s")
        else:
            vals = [runs[k].get("score", 0.0) for k in names]
            ax.set_ylabel("score (sum of samples/s over each job's best)")
        ax.bar(
            names, vals, color=["C1" if ("auto" in k or k == "sidecar") else "C0" for k in names]
        )
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(out["machine"][:110], fontsize=8)
    fig.tight_layout()
    fig.savefig(png)
