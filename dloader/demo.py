"""``dloader-demo``: an emulated training job whose loader is resized live.

It trains the io_heavy job of the testbed (8 ms of I/O per sample, an accelerator that could do
1,600 samples/s) with a fixed, CPU-count-sized pool of workers, then grows the pool mid-epoch and
raises the batch size, all without restarting, and prints throughput and accelerator-idle share
before and after, measured by the loader's own telemetry. No GPU needed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

from rich.console import Console
from rich.table import Table

from dloader import DataLoader
from dloader.testbed import PROFILES, EmulatedDataset

__all__ = ["main"]


def _phase(loader: DataLoader[object], it: object, seconds: float, step_s: object) -> tuple:
    """Trains for ``seconds``; returns (samples/s, idle share, samples seen)."""
    start = time.perf_counter()
    samples = wait = 0.0
    while (elapsed := time.perf_counter() - start) < seconds:
        t0 = time.perf_counter()
        batch = next(it)  # type: ignore[call-overload]
        wait += time.perf_counter() - t0
        samples += len(batch)
        time.sleep(step_s(len(batch)))  # type: ignore[operator]
    return samples / elapsed, wait / elapsed, int(samples)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-demo``."""
    parser = argparse.ArgumentParser(
        prog="dloader-demo",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="length of each phase (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="workers before the resize (default: the usable CPU count)",
    )
    parser.add_argument(
        "--grow-to", type=int, default=12, help="workers after the resize (default: %(default)s)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=48,
        help="batch size after the change (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    before = args.workers if args.workers is not None else len(os.sched_getaffinity(0))
    for name, value, low in (
        ("--seconds", args.seconds, 1),
        ("--workers", before, 0),
        ("--grow-to", args.grow_to, 0),
        ("--batch-size", args.batch_size, 1),
    ):
        if value < low:
            parser.error(f"{name}={value} must be >= {low}")
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    # Piped output (CI logs) gets rich's 80 columns; the table needs a little more.
    console = Console(width=None if sys.stdout.isatty() else 110)
    profile = PROFILES["io_heavy"]
    loader = DataLoader(
        EmulatedDataset.from_profile(profile, 10**6),
        batch_size=profile.batch_size,
        shuffle=True,
        num_workers=before,
    )
    console.print(
        f"[bold]dloader demo[/]: emulated job '{profile.name}' (io {profile.io_ms} ms + "
        f"cpu {profile.cpu_ms} ms per sample; accelerator step "
        f"{profile.step_base_ms:g} + {profile.step_per_sample_ms:g}*b ms)"
    )
    it = iter(loader)
    next(it)  # start the workers before measuring
    rows = []
    phases = [
        ("start", None),
        (f"resize({args.grow_to})", lambda: loader.resize(args.grow_to)),
        (f"set_batch_size({args.batch_size})", lambda: loader.set_batch_size(args.batch_size)),
    ]
    for label, change in phases:
        if change is not None:
            change()
        bs = loader.batch_size or 1
        with console.status(f"training: {label} ({args.seconds:g} s)..."):
            tput, idle, _ = _phase(loader, it, args.seconds, profile.step_s)
        s = loader.stats()
        rows.append((label, loader.num_workers, bs, tput, profile.limit(bs), idle, s.idle_share))
    state = loader.state_dict()
    it.close()

    table = Table(
        title="throughput and accelerator idle, per phase",
        caption="limit: the accelerator's samples/s at that batch; idle: share of "
        "time the trainer waited for data (measured here / by loader.stats())",
    )
    table.add_column("phase", justify="left", no_wrap=True)
    for col in ("workers", "batch", "samples/s", "limit", "of limit", "idle", "stats idle"):
        table.add_column(col, justify="right", no_wrap=True)
    for label, workers, bs, tput, limit, idle, stat_idle in rows:
        table.add_row(
            label,
            str(workers),
            str(bs),
            f"{tput:,.0f}",
            f"{limit:,.0f}",
            f"{tput / limit:.0%}",
            f"{idle:.0%}",
            f"{stat_idle:.0%}",
        )
    console.print(table)
    console.print(
        f"No restart, no sample lost or repeated: the epoch is at sample "
        f"{state['samples_yielded']:,} and its state_dict() is "
        f"{len(repr(state))} characters."
    )
    first, last = rows[0], rows[-1]
    console.print(
        f"[bold green]{last[3] / first[3]:.1f}x[/] the throughput; accelerator idle "
        f"{first[5]:.0%} -> {last[5]:.0%}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
