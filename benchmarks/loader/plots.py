"""The loader benchmarks' plots: each takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common import machine, pyplot


def loader_throughput(results: list[dict[str, Any]], png: Path) -> None:
    """dloader against torch per profile and worker count, the ratio on top."""
    profiles = list(dict.fromkeys(r["profile"] for r in results))
    plt = pyplot()

    fig, axes = plt.subplots(1, len(profiles), figsize=(11, 4))
    for ax, profile in zip(axes, profiles, strict=True):
        rows = [r for r in results if r["profile"] == profile]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["dloader"] for r in rows], 0.4, label="dloader")
        ax.bar([x + 0.2 for x in xs], [r["torch"] for r in rows], 0.4, label="torch")
        for x, r in zip(xs, rows, strict=True):
            ax.annotate(
                f"{r['ratio']:.2f}x",
                (x, max(r["dloader"], r["torch"])),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(list(xs), [str(r["workers"]) for r in rows])
        ax.set_xlabel("workers")
        ax.set_ylabel("samples/s")
        ax.set_title(profile)
        ax.legend()
    fig.suptitle(f"Loader throughput, dloader vs torch (ratio on top)\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def resize_timeline(panels: list[dict[str, Any]], limit: float, png: Path) -> None:
    """One panel per run: samples/s and the trainer's idle share in half-second bins, the
    accelerator limit, and each live change (``panels``: ``title``, ``bins``, ``tput``, ``idle``,
    ``events`` as ``(seconds, label)``)."""
    plt = pyplot()

    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)), sharex=True)
    for ax, panel in zip(axes, panels, strict=True):
        bins, tput, idle = panel["bins"], panel["tput"], panel["idle"]
        ax.plot(bins, tput, color="tab:blue", label="samples/s")
        ax.axhline(limit, color="tab:blue", ls=":", lw=0.8, label="accelerator limit")
        ax.set_ylabel("samples/s")
        ax2 = ax.twinx()
        ax2.plot(bins, idle, color="tab:red", alpha=0.6, label="idle share")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("idle share")
        for at, label in panel["events"]:
            ax.axvline(at, color="gray", ls="--", lw=0.8)
            ax.annotate(
                label,
                (at, ax.get_ylim()[1] * 0.92),
                fontsize=7,
                rotation=90,
                va="top",
            )
        ax.set_title(panel["title"], fontsize=9)
        if ax is axes[0]:
            ax.legend(loc="upper left", fontsize=7)
            ax2.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("seconds")
    fig.suptitle(f"io_heavy job: live resize vs rebuild-and-resume\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def resume_cost(rows: list[dict[str, Any]], png: Path) -> None:
    """Time to the first batch and extra peak RSS of a resume, by dataset size, per world-size
    change and kind (dloader, naive)."""
    changes = list(dict.fromkeys((r["w_old"], r["w_new"]) for r in rows))
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for kind, marker in (("dloader", "o-"), ("naive", "s--")):
        for w_old, w_new in changes:
            pts = [
                r for r in rows if r["kind"] == kind and (r["w_old"], r["w_new"]) == (w_old, w_new)
            ]
            if not pts:
                continue
            label = f"{kind} {w_old}->{w_new}"
            axes[0].plot(
                [p["n"] for p in pts], [p["seconds"] * 1000 for p in pts], marker, label=label
            )
            axes[1].plot(
                [p["n"] for p in pts], [p["extra_rss_mb"] for p in pts], marker, label=label
            )
    for ax, ylabel in zip(axes, ("time to first batch (ms)", "extra peak RSS (MB)"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("symlog")
        ax.set_xlabel("dataset size (samples), resumed at 50%")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(f"Resuming an epoch under a new world size\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def autotune(results: dict[str, Any], pairs: dict[str, Any], png: Path) -> None:
    """One panel per profile alone (fixed counts as bars, auto as a line), then one per pair
    (the static split's scores and auto's, as bars)."""
    plt = pyplot()

    panels = len(results) + len(pairs)
    fig, axes = plt.subplots(1, panels, figsize=(3.2 * panels, 3.2), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=False):
        counts = sorted(r["fixed"])
        ax.bar([str(n) for n in counts], [r["fixed"][n] for n in counts], color="#9ab")
        ax.axhline(r["auto"], color="#c33", label=f"auto ({r['ratio']:.2f}x best)")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("fixed num_workers")
        ax.set_ylabel("samples/s")
        ax.legend(fontsize=7, loc="lower right")
    for ax, (name, r) in zip(axes[0][len(results) :], pairs.items(), strict=True):
        split = "/".join(map(str, r["static_best"]))
        ax.bar(
            [f"static {split}\n(search)", f"static {split}\n(again)", "auto"],
            [r["static_score"], r["static_again"], r["auto"]],
            color=["#9ab", "#9ab", "#c33"],
        )
        ax.set_title(f"{name}\nauto: {r['ratio_again']:.2f}x static again", fontsize=9)
        ax.set_ylabel("score (sum of samples/s over limit)")
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"num_workers='auto' vs fixed counts\n{machine()}", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def worker_memory(results: dict[str, Any], paths: int, png: Path) -> None:
    """Mean USS per worker over the run, per container and worker count (``results``: key ->
    a run with its ``trace`` of (seconds, MiB))."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, r in results.items():
        xs, ys = zip(*r["trace"], strict=True) if r["trace"] else ((), ())
        ax.plot(xs, ys, label=key, linestyle="-" if key.startswith("list") else "--")
    ax.set_xlabel("seconds reading (shuffled epoch)")
    ax.set_ylabel("mean USS per worker (MiB)")
    ax.set_title(f"forked workers reading {paths:,} paths\n{machine()}", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def pinning(runs: dict[str, dict[str, list[dict[str, float]]]], png: Path) -> None:
    """Samples/s (mean of rounds) per emulated step, pinned in the trainer's thread vs on the
    receiver thread (``runs``: step in ms -> mode -> rounds)."""
    plt = pyplot()
    modes = list(dict.fromkeys(m for v in runs.values() for m in v))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, mode in enumerate(modes):
        xs = [j + 0.2 * (i * 2 - 1) for j in range(len(runs))]
        ys = [sum(x["samples_per_s"] for x in v[mode]) / len(v[mode]) for v in runs.values()]
        ax.bar(xs, ys, width=0.4, label=mode)
    ax.set_xticks(range(len(runs)), [f"step {s} ms" for s in runs])
    ax.set_ylabel("samples/s (mean of rounds)")
    ax.legend()
    ax.set_title(machine()[:80], fontsize=7)
    fig.tight_layout()
    fig.savefig(png)


def remote(
    runs: dict[str, dict[str, list[dict[str, Any]]]],
    sizes: dict[int, dict[str, Any]],
    png: Path,
) -> None:
    """Left: samples/s per pipeline, local workers alone vs with one remote worker (mean of
    rounds, each round a dot). Right: the local node's CPU per remote batch by batch bytes."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    arms = list(dict.fromkeys(a for v in runs.values() for a in v))
    for i, arm in enumerate(arms):
        for j, by_arm in enumerate(runs.values()):
            ys = [x["samples_per_s"] for x in by_arm.get(arm, [])]
            if not ys:
                continue
            x = j + 0.2 * (i * 2 - 1)
            ax.bar(x, sum(ys) / len(ys), width=0.4, color=f"C{i}", label=arm if j == 0 else None)
            ax.plot([x] * len(ys), ys, "k.", markersize=4)
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylabel("samples/s of the training loop")
    ax.legend()
    if sizes:
        xs = [s / 2**20 for s in sizes]
        bx.plot(xs, [v["local_cpu_ms_per_batch"] for v in sizes.values()], "o-")
        bx.set_xscale("log")
        bx.set_xlabel("batch size, MB")
        bx.set_ylabel("local CPU ms per remote batch")
    fig.suptitle(machine()[:100], fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
