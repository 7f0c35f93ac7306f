"""The sidecar benchmarks' plots: each takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common import machine, pyplot


def jobs_timeline(
    runs: dict[str, dict[str, Any]],
    seconds: float,
    png: Path,
    title: str = "Three jobs on one node",
) -> None:
    """One panel per run: each job's throughput over its accelerator limit (solid) and its
    worker count (dotted) over time, a job's curve starting when it arrived."""
    plt = pyplot()

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.8 * len(runs)), sharex=True)
    for ax, (label, results) in zip(axes, runs.items(), strict=True):
        ax2 = ax.twinx()
        first = min(r.get("started", 0.0) for r in results.values())
        for name, r in results.items():
            off = r.get("started", 0.0) - first  # when the job arrived
            ts = [i * 1.0 for i in range(int(seconds))]
            norm = [
                sum(x[1] for x in r["timeline"] if t <= x[0] + off < t + 1) / r["limit"] for t in ts
            ]
            line = ax.plot(ts, norm, label=f"{name} throughput/limit")[0]
            ax2.step(
                [x[0] + off for x in r["timeline"]],
                [x[3] for x in r["timeline"]],
                where="post",
                color=line.get_color(),
                ls=":",
                alpha=0.8,
            )
        ax.set_ylabel("throughput / limit")
        ax2.set_ylabel("workers (dotted)")
        ax.set_ylim(0, 1.1)
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("seconds")
    fig.suptitle(f"{title}\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def overhead(trace: list[tuple[float, float]], split: float, goal: float | None, png: Path) -> None:
    """The sidecar's CPU (share of a core) over the run, where its steady window starts, and
    the target."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot([t for t, _ in trace], [100 * c for _, c in trace], drawstyle="steps-post")
    ax.axvline(split, color="grey", ls=":", label="steady window starts")
    if goal is not None:
        ax.axhline(100 * goal, color="red", ls="--", label=f"target: {goal:.0%} of one core")
    title = "Sidecar CPU with N jobs reporting once a second"
    _save(fig, ax, ("seconds since the jobs registered", "sidecar CPU, % of one core"), title, png)


def generated(done: list[dict[str, Any]], seed: int, png: Path) -> None:
    """Per drawn mix: the sidecar's ratio to each arm over the steady part (the whole run where
    there is none), with its 95% interval; and how long each job waited for its first
    placement."""
    plt = pyplot()

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    xs = list(range(len(done)))
    arms = list(dict.fromkeys(a for r in done for a in r["ratios"]))  # in the benchmark's order
    for i, arm in enumerate(arms):
        off = (i - (len(arms) - 1) / 2) * 0.15
        at, v, lo, hi = [], [], [], []
        for x, r in zip(xs, done, strict=True):
            parts = r["ratios"].get(arm)
            if parts:
                c = parts.get("steady") or parts["whole"]
                at.append(x + off)
                v.append(c[0])
                lo.append(c[0] - c[1])
                hi.append(c[2] - c[0])
        ax.errorbar(at, v, yerr=[lo, hi], fmt="o", capsize=3, label=f"sidecar / {arm}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(1.05, color="red", ls=":", lw=0.8, label="1.05 (target / auto)")
    ax.set_xticks(xs, [r["mix"].split("/")[1] + ("*" if r["dynamic"] else "") for r in done])
    ax.set_xlabel("mix (* jobs come or go)")
    ax.set_ylabel("ratio of scores, steady part")
    ax.legend(fontsize=8)
    first = [s for r in done for s in r["first_s"]]
    bx.hist(first, bins=20)
    bx.axvline(2.0, color="red", ls=":")
    bx.set_xlabel("s from registering to first placement")
    fig.suptitle(f"Generated node mixes, seed {seed}\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def rooms(room: Any, title: str, png: Path) -> None:
    """``--rooms``: the histogram of the mixes' room (what a perfect division of the cores
    would give over an even one), the 1.05 line marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.hist(room, bins=40)
    ax.axvline(1.05, color="red", ls=":", label="1.05")
    _save(fig, ax, ("room: best division of the cores / an even one", "mixes"), title, png)


def _save(fig: Any, ax: Any, labels: tuple[str, str], title: str, png: Path) -> None:
    """One panel's axis labels, legend and title (the machine under it), written to ``png``."""
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.legend(fontsize=8)
    ax.set_title(f"{title}\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
