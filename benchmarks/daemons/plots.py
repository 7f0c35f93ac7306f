"""The daemons' benchmarks' plots: each takes the measured results and the PNG to write."""

from __future__ import annotations

from pathlib import Path

from benchmarks._common import pyplot


def soak(
    events: list[tuple[float, str, float]], samples: list[dict[str, float]], png: Path
) -> None:
    """The honest clients' latencies (``events``: time, kind, seconds), and both daemons' CPU and
    RSS over time (``samples``)."""
    plt = pyplot()

    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    kinds = ("sidecar register", "sidecar report", "allocator decision")
    for kind in (*kinds, "operator sidecar", "operator allocator"):
        xs = [(t, d * 1e3) for t, k, d in events if k == kind]
        if xs:
            axes[0].plot(*zip(*xs, strict=True), ".", ms=2, label=kind)
    axes[0].set_ylabel("honest latency (ms)")
    axes[0].set_yscale("log")
    axes[0].legend()
    t = [s["t"] for s in samples]
    for name in ("sidecar", "allocator"):
        axes[1].plot(t, [s[f"{name} cpu %"] for s in samples], label=name)
        axes[2].plot(t, [s[f"{name} rss MB"] for s in samples], label=name)
    axes[1].set_ylabel("daemon CPU (% of a core)")
    axes[2].set_ylabel("daemon RSS (MB)")
    axes[2].set_xlabel("time (s), hostile clients throughout")
    for ax in axes[1:]:
        ax.legend()
    fig.suptitle("soak: honest and hostile clients on both daemons")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def state_files(results: dict[str, dict[str, float]], png: Path) -> None:
    """Per daemon and year (pruned, unpruned): the state file's size and the start-up time."""
    plt = pyplot()
    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].bar(names, [results[n]["mb"] for n in names], color="#9ab")
    axes[0].set_ylabel("state file (MB)")
    axes[1].bar(names, [max(results[n]["start_s"]) for n in names], color="#c93")
    axes[1].set_ylabel("start to SERVING, worst of 2 (s)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=20, labelsize=8)
    fig.suptitle("the state files after a year of use", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
