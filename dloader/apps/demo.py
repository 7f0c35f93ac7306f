"""``dloader-demo``: what dloader does on a shared node, on emulated jobs (no GPU needed).

Default: three emulated training jobs (I/O-bound, CPU-bound, accelerator-bound; see
docs/architecture.md) share this node, first as people usually configure them (4 loader workers
each, no sidecar), then joined to an adaptive ``dloader-sidecar`` on embedded defaults (a Unix
socket in a temporary folder, its SQLite state under ``.dloader-demo/``). The sidecar explores,
models each job and re-divides the workers; the demo prints per-job throughput and accelerator idle,
before and after.

``--single``: one job whose loader is resized and re-batched live, without a restart.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dloader import DataLoader
from dloader._shared.cli import finite
from dloader.apps.testbed import PROFILES, EmulatedDataset

__all__ = ["main", "node", "single"]


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


def single(argv: list[str]) -> int:
    """One job whose loader is resized live (``dloader-demo --single``)."""
    parser = argparse.ArgumentParser(
        prog="dloader-demo --single",
        description="One emulated io_heavy job: a fixed worker pool, then resize() and "
        "set_batch_size() mid-epoch, with throughput and idle before and after.",
    )
    parser.add_argument(
        "--seconds", type=finite, default=8.0, help="length of each phase (default: %(default)s)"
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


def node(argv: list[str]) -> int:
    """Three jobs on this node: 4 workers each vs the adaptive sidecar (the default demo)."""
    parser = argparse.ArgumentParser(
        prog="dloader-demo",
        description="Three emulated jobs share this node: 4 loader workers each (no sidecar), "
        "then with the adaptive dloader-sidecar. Use --single for the one-loader resize demo.",
    )
    parser.add_argument(
        "--seconds", type=finite, default=45.0, help="length of each phase (default: %(default)s)"
    )
    parser.add_argument(
        "--state-dir",
        default=".dloader-demo",
        help="the sidecar's SQLite state (default: %(default)s)",
    )
    parser.add_argument(
        "--worker-budget",
        type=int,
        default=24,
        help="the sidecar's node worker budget (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.seconds < 20:
        parser.error(f"--seconds={args.seconds} must be >= 20 (the sidecar explores first)")
    from dloader.apps.experiment import score

    console = Console(width=None if sys.stdout.isatty() else 110)
    jobs = [("io_heavy", 4, 0.0, None), ("cpu_heavy", 4, 0.0, None), ("gpu_bound", 4, 0.0, None)]
    console.print(
        "[bold]dloader demo[/]: three emulated jobs share this node "
        f"({len(os.sched_getaffinity(0))} cores): io_heavy (8 ms I/O per sample), "
        "cpu_heavy (3 ms CPU per sample), gpu_bound (a slow accelerator)"
    )
    folder = Path(args.state_dir).resolve()
    tmp = run_folder()
    try:
        before, after = _phases(jobs, args, tmp, folder, console)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # also on Ctrl-C and SIGTERM
    window = (args.seconds * 0.4, args.seconds)  # scored: the end of each phase
    total_b, per_b = score(before, *window)
    total_a, per_a = score(after, *window)
    table = Table(
        title=f"the last {window[1] - window[0]:g} s of each phase",
        caption="share of limit: samples/s over the job's accelerator limit; idle: "
        "share of time the accelerator waited for data",
    )
    table.add_column("job", no_wrap=True)
    for col in (
        "workers before",
        "share of limit",
        "idle",
        "workers after",
        "share of limit",
        "idle",
    ):
        table.add_column(col, justify="right", no_wrap=True)
    for name, *_ in jobs:
        b, a = per_b[name], per_a[name]
        table.add_row(
            name,
            str(b["workers"]),
            f"{b['normalized']:.0%}",
            f"{b['idle']:.0%}",
            str(a["workers"]),
            f"{a['normalized']:.0%}",
            f"{a['idle']:.0%}",
        )
    table.add_row("[bold]sum", "", f"[bold]{total_b:.2f}", "", "", f"[bold]{total_a:.2f}", "")
    console.print(table)
    console.print(
        f"[bold green]{total_a / total_b:.2f}x[/] the useful throughput of the node "
        f"with the sidecar (sum of each job's throughput / its accelerator limit). "
        f"The sidecar's decisions are in {folder / 'state' / 'sidecar.log'}; its "
        f"state (jobs, models, decisions) in {folder / 'state' / 'sidecar.db'}."
    )
    return 0


def _phases(
    jobs: list[tuple[str, int, float, None]],
    args: argparse.Namespace,
    tmp: Path,
    folder: Path,
    console: Console,
) -> tuple[Any, Any]:
    """Runs both phases in ``tmp``; the sidecar's state and log are kept in ``folder``."""
    from dloader.apps.experiment import run_jobs, sidecar_process

    with console.status(f"before: 4 workers each, no sidecar ({args.seconds:g} s) ..."):
        before = run_jobs(jobs, tmp / "before", seconds=args.seconds)
    with (
        console.status(
            f"after: with the adaptive sidecar at unix://{tmp}/sidecar/sidecar.sock,"
            f" state in {folder} ({args.seconds:g} s) ..."
        ),
        sidecar_process(tmp / "sidecar", policy="adaptive", worker_budget=args.worker_budget) as sc,
    ):
        after = run_jobs(jobs, tmp / "after", seconds=args.seconds, sidecar=sc.target)
    (folder / "state").mkdir(parents=True, exist_ok=True)
    for name in ("state/sidecar.db", "sidecar.log"):
        shutil.copy2(tmp / "sidecar" / name, folder / "state" / Path(name).name)
    return before, after


_RUN_PREFIX = "dloader-demo-"


def run_folder() -> Path:
    """A new temporary folder for one demo run (its sockets and the jobs' output), holding the
    run's PID; first removes the folders of this user's earlier runs whose process is gone (a
    demo killed with SIGKILL cannot remove its own)."""
    base = Path(tempfile.gettempdir())
    for old in base.glob(f"{_RUN_PREFIX}*"):
        try:
            if old.stat().st_uid != os.getuid() or old.is_symlink():
                continue
            pid = int((old / "pid").read_text())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=_RUN_PREFIX))
    (tmp / "pid").write_text(str(os.getpid()))
    return tmp


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dloader-demo``. SIGTERM ends it as Ctrl-C does: the jobs and the
    sidecar it started are stopped on the way out (and its jobs also watch it: a demo killed
    outright leaves none running)."""
    signal.signal(signal.SIGTERM, _terminated)
    args = list(sys.argv[1:] if argv is None else argv)
    if "--single" in args:
        args.remove("--single")
        return single(args)
    return node(args)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
