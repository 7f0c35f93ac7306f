"""Pinned memory off the trainer's thread, measured without a GPU: the receiver thread against
pinning in the trainer's thread.

On an H100 (docs/benchmarks.md, "On a GPU") dloader pinned each batch in the trainer's thread
and delivered 0.59x torch's samples/s at 14 workers. Pinning needs a GPU driver, so here a
stand-in does what costs the trainer: a copy of every tensor of the batch (19 MB for 32
3 x 224 x 224 float images; the copy also first-touches the worker's shared memory, as pinning
does). Two loaders, each a fresh process, alternating, for each emulated step time:

* ``in trainer``: ``pin_memory=False`` and the trainer copies each batch itself after ``next()``
  (what dloader did before: receive and pin at delivery, in the trainer's thread);
* ``receiver``: ``pin_memory=True`` with the stand-in as the pinning function (the hardware
  boundary): the receiver thread reads and "pins" each batch as it arrives, as torch's
  pin-memory thread does.

    python -m benchmarks.loader.bench_pin                  # ~2 min
    python -m benchmarks.loader.bench_pin --steps-ms 10 --repeats 1

Prints the table, writes ``bench_pin.json`` and ``bench_pin.png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import torch
from torch.utils.data import Dataset

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots

MODES = ("in trainer", "receiver")


class _Images(Dataset[Any]):
    def __init__(self) -> None:
        self.x = torch.randn(3, 224, 224)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> Any:
        return self.x.clone(), i


def _copy(data: Any, device: Any = None) -> Any:
    """The stand-in for pinning: a copy of every tensor."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, (list, tuple)):
        return type(data)(_copy(d) for d in data)
    return data


def child(mode: str, step_s: float, batches: int, workers: int) -> dict[str, float]:
    """One loader in this process: samples/s and the trainer's wait share over ``batches``."""
    import dloader
    from dloader._engine import iterator as _iter

    receiver = mode == "receiver"
    if receiver:
        _iter.LoaderIterator._check_pin_memory = lambda self, loader: True  # type: ignore[method-assign]
        _iter._pin_memory = _copy
    loader = dloader.DataLoader(_Images(), batch_size=32, num_workers=workers, pin_memory=receiver)
    it = iter(loader)
    for _ in range(10):  # warm up
        next(it)
    wait, start = 0.0, time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        batch = next(it)
        if not receiver:
            batch = _copy(batch)
        wait += time.perf_counter() - t
        time.sleep(step_s)
    elapsed = time.perf_counter() - start
    return {"samples_per_s": batches * 32 / elapsed, "wait": wait / elapsed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_pin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps-ms", default="5,10", help="emulated step times, ms (default 5,10)")
    p.add_argument("--batches", type=int, default=150, help="timed batches per run (150)")
    p.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds (default 3)")
    add_out_dir(p)
    p.add_argument("--child", nargs=2, metavar=("MODE", "STEP_S"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        mode, step = args.child
        print(json.dumps(child(mode, float(step), args.batches, args.workers)))
        return 0
    try:
        steps = [float(x) / 1000 for x in args.steps_ms.split(",") if x]
    except ValueError:
        p.error(f"--steps-ms={args.steps_ms!r}: expected milliseconds separated by commas")
    if not steps or min(steps) < 0 or args.batches < 1 or args.repeats < 1 or args.workers < 1:
        p.error("expected steps >= 0 ms, --batches, --repeats and --workers >= 1")
    print(f"machine: {machine()}", flush=True)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for r in range(args.repeats):
        for step in steps:
            for mode in MODES:
                print(f"  round {r + 1}: {mode}, step {step * 1000:g} ms ...", file=sys.stderr)
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks.loader.bench_pin",
                    "--child",
                    mode,
                    str(step),
                ]
                cmd += ["--batches", str(args.batches), "--workers", str(args.workers)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                runs.setdefault(f"{step * 1000:g}", {}).setdefault(mode, []).append(
                    json.loads(out.splitlines()[-1])
                )
    rows, summary = [], {}
    for step, by_mode in runs.items():
        mean = {m: sum(x["samples_per_s"] for x in v) / len(v) for m, v in by_mode.items()}
        wait = {m: sum(x["wait"] for x in v) / len(v) for m, v in by_mode.items()}
        summary[step] = mean["receiver"] / mean["in trainer"]
        rows.append(
            [
                f"{step} ms",
                mean["in trainer"],
                f"{wait['in trainer']:.0%}",
                mean["receiver"],
                f"{wait['receiver']:.0%}",
                summary[step],
            ]
        )
    print(
        table(
            [
                "step",
                "in trainer samples/s",
                "wait",
                "receiver samples/s",
                "wait",
                "receiver / in trainer",
            ],
            rows,
        )
    )
    outs = outputs(args.out_dir)
    outs("bench_pin.json").write_text(
        json.dumps({"machine": machine(), "runs": runs, "ratio": summary}, indent=1)
    )
    plots.pinning(runs, outs("bench_pin.png"))
    print(f"wrote {outs('bench_pin.json')} and {outs('bench_pin.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
