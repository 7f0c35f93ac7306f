"""Live resize and batch-size change under a running emulated training job.

The testbed's io_heavy job (docs/architecture.md) trains for ``--seconds``; a background thread (as
the sidecar agent would) changes the loader at fixed times: grow 2 -> 12 workers, change the batch
size 32 -> 48, shrink 12 -> 4, grow 4 -> 8. Two ways of making each change are compared, each with
the ``fork`` and ``spawn`` start methods:

* ``live``: ``loader.resize()`` / ``loader.set_batch_size()`` mid-epoch (dloader);
* ``rebuild``: what a torch user can do instead: drop the iterator, build a new loader with the
  new settings and resume it from ``state_dict()`` (position kept, workers restarted).

Reported per change: time from the call to the first batch fetched by a new worker, the worst
data-wait in the 2 s before and after, and throughput / idle share in 4 s windows before and
after. A PNG shows throughput and idle over time with the changes marked.

    python -m benchmarks.loader.bench_resize              # ~2.5 min
    python -m benchmarks.loader.bench_resize --seconds 16 # shorter
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

import dloader
from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots
from dloader.apps.testbed import PROFILES, EmulatedDataset

PROFILE = PROFILES["io_heavy"]


@dataclass
class Event:
    at_s: float  # planned time since start
    kind: str  # "workers" or "batch"
    value: int
    called_s: float = -1.0
    applied_s: float = -1.0  # rebuild: when the new loader was in place
    first_new_batch_s: float = -1.0  # live grow: first batch fetched by a new worker


@dataclass
class Run:
    mode: str
    context: str
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (t, n, wait)
    events: list[Event] = field(default_factory=list)


def grows(events: list[Event]) -> set[int]:
    """Indexes of the events that add workers (only those have a "first new batch")."""
    out, workers = set(), 2
    for i, ev in enumerate(events):
        if ev.kind == "workers":
            if ev.value > workers:
                out.add(i)
            workers = ev.value
    return out


def plan(seconds: float) -> list[Event]:
    f = seconds / 32.0
    return [
        Event(6 * f, "workers", 12),
        Event(13 * f, "batch", 48),
        Event(19 * f, "workers", 4),
        Event(25 * f, "workers", 8),
    ]


def make_loader(ctx: str, workers: int, batch: int) -> dloader.DataLoader[Any]:
    ds = EmulatedDataset.from_profile(PROFILE, 10**7)
    return dloader.DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=ctx if workers else None,
    )


def run_live(ctx: str, seconds: float) -> Run:
    run = Run("live", ctx, events=plan(seconds))
    loader = make_loader(ctx, 2, PROFILE.batch_size)
    torch.manual_seed(0)
    it = iter(loader)
    next(it)  # workers up before the clock starts, as in steady training
    start = time.perf_counter()
    growing = grows(run.events)
    known: dict[int, set[int | None]] = {}  # per grow: the PIDs alive when it was called

    def agent() -> None:
        for ev in run.events:
            time.sleep(max(ev.at_s - (time.perf_counter() - start), 0))
            i = run.events.index(ev)
            if i in growing:  # the PIDs alive just before the call: any other PID is new
                known[i] = {w.pid for w in loader.stats().workers}
            ev.called_s = time.perf_counter() - start
            if ev.kind == "workers":
                loader.resize(ev.value)
            else:
                loader.set_batch_size(ev.value)
            ev.applied_s = ev.called_s

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    while True:
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        n = len(batch)
        time.sleep(PROFILE.step_s(n))
        now = time.perf_counter() - start
        run.timeline.append((now, n, t1 - t0))
        # First batch fetched by a worker started by a grow (a PID not alive at the call).
        for i in growing:
            ev = run.events[i]
            if ev.called_s < 0 or ev.first_new_batch_s >= 0 or i not in known:
                continue
            if any(w.pid not in known[i] and w.batches > 0 for w in loader.stats().workers):
                ev.first_new_batch_s = now
        if now >= seconds:
            break
    thread.join()
    it.close()
    return run


def run_rebuild(ctx: str, seconds: float) -> Run:
    run = Run("rebuild", ctx, events=plan(seconds))
    workers, batch = 2, PROFILE.batch_size
    loader = make_loader(ctx, workers, batch)
    torch.manual_seed(0)
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    requests: list[Event] = []
    lock = threading.Lock()
    growing = grows(run.events)

    def agent() -> None:
        for ev in run.events:
            time.sleep(max(ev.at_s - (time.perf_counter() - start), 0))
            ev.called_s = time.perf_counter() - start
            with lock:
                requests.append(ev)

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    while True:
        with lock:
            todo, requests[:] = list(requests), []
        t0 = time.perf_counter()  # the rebuild is time the trainer waits for data
        for ev in todo:  # between steps, as a training loop would
            state = loader.state_dict()
            it.close()
            if ev.kind == "workers":
                workers = ev.value
            else:
                batch = ev.value
            loader = make_loader(ctx, workers, batch)
            loader.load_state_dict(state)
            it = iter(loader)
            ev.applied_s = time.perf_counter() - start
        b = next(it)
        t1 = time.perf_counter()
        n = len(b)
        time.sleep(PROFILE.step_s(n))
        now = time.perf_counter() - start
        run.timeline.append((now, n, t1 - t0))
        for ev in todo:
            if run.events.index(ev) in growing:
                ev.first_new_batch_s = now - PROFILE.step_s(n)
        if now >= seconds:
            break
    thread.join()
    it.close()
    return run


def window(run: Run, a: float, b: float) -> tuple[float, float, float]:
    rows = [r for r in run.timeline if a <= r[0] < b]
    if not rows or b <= a:
        return 0.0, 0.0, 0.0
    # A wait longer than the window (a blocked rebuild) is capped at the whole window.
    return (
        sum(r[1] for r in rows) / (b - a),
        min(sum(r[2] for r in rows) / (b - a), 1.0),
        max(r[2] for r in rows),
    )


def timeline(run: Run, seconds: float) -> dict[str, Any]:
    """A run's samples/s and idle share in half-second bins, and its changes, for the plot."""
    bins = [i * 0.5 for i in range(int(seconds / 0.5))]
    return {
        "title": f"{run.mode} ({run.context})",
        "bins": bins,
        "tput": [window(run, a, a + 0.5)[0] for a in bins],
        "idle": [window(run, a, a + 0.5)[1] for a in bins],
        "events": [(ev.called_s, f"{ev.kind}={ev.value}") for ev in run.events],
    }


def summarise(runs: list[Run]) -> list[list[Any]]:
    rows = []
    for run in runs:
        for ev in run.events:
            t = ev.called_s
            before = window(run, t - 4, t)
            after = window(run, t, t + 4)
            worst_before = window(run, t - 2, t)[2]
            worst_after = window(run, t, t + 2)[2]
            first = (ev.first_new_batch_s - t) if ev.first_new_batch_s >= 0 else float("nan")
            rows.append(
                [
                    run.mode,
                    run.context,
                    f"{ev.kind}->{ev.value}",
                    first * 1000,
                    worst_before * 1000,
                    worst_after * 1000,
                    before[0],
                    after[0],
                    before[1],
                    after[1],
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_resize", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--seconds", type=float, default=32.0, help="length of each run (default: %(default)s)"
    )
    parser.add_argument(
        "--contexts", default="fork,spawn", help="start methods to compare (default: %(default)s)"
    )
    add_out_dir(parser)
    args = parser.parse_args(argv)
    if args.seconds < 8:
        parser.error(f"--seconds={args.seconds} must be >= 8")
    contexts = args.contexts.split(",")
    for c in contexts:
        if c not in ("fork", "spawn", "forkserver"):
            parser.error(f"--contexts: unknown start method {c!r}")
    warnings.filterwarnings("ignore")
    print(f"machine: {machine()}", flush=True)
    runs = []
    for ctx in contexts:
        for mode, fn in (("live", run_live), ("rebuild", run_rebuild)):
            print(f"  running {mode} ({ctx}), {args.seconds:g} s ...", file=sys.stderr, flush=True)
            runs.append(fn(ctx, args.seconds))
    rows = summarise(runs)
    print(
        table(
            [
                "mode",
                "start",
                "change",
                "first batch from new worker ms",
                "worst wait 2s before ms",
                "worst wait 2s after ms",
                "samples/s before",
                "samples/s after",
                "idle before",
                "idle after",
            ],
            rows,
        )
    )
    outs = outputs(args.out_dir)
    outs("bench_resize.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2))
    plots.resize_timeline(
        [timeline(run, args.seconds) for run in runs], PROFILE.limit(), outs("bench_resize.png")
    )
    print(f"wrote {outs('bench_resize.json')} and {outs('bench_resize.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
