"""Loader worker memory: a dataset that holds its file paths in a Python list vs in a
``dloader.StringArray``, read by forked workers over part of an epoch.

Each forked worker shares its parent's pages until it writes one; reading a Python string
writes its reference count, so workers copy the list's pages as they read it: their private
memory (USS) grows over the epoch, once per worker. The table gives, per container and worker
count, the workers' USS and PSS at the end and the node's memory in use for the job
(trainer + workers, PSS: shared pages counted once); the plot shows mean worker USS over time.

    python benchmarks/loader/bench_memory.py                       # 3M paths, 4 and 16 workers
    python benchmarks/loader/bench_memory.py --paths 200000 --workers 2 --seconds 3   # quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dloader
from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots

MiB = 2**20


class PathDataset(Dataset[int]):
    """Returns the length of path ``i`` (as a real dataset would open it)."""

    def __init__(self, paths: Any) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


def make_paths(n: int) -> list[str]:
    return [
        f"/datasets/imagenet/train/n{i // 1300:08d}/n{i // 1300:08d}_{i:08d}.JPEG" for i in range(n)
    ]


def memory(pids: list[int]) -> tuple[list[int], int]:
    """USS of each pid, and their PSS together."""
    uss, pss = [], 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            full = psutil.Process(pid).memory_full_info()
            uss.append(full.uss)
            pss += full.pss
    return uss, pss


def run(paths: Any, workers: int, seconds: float, batch: int, every: float = 2.0) -> dict[str, Any]:
    ds = PathDataset(paths)
    sampler = random.Random(0).sample(range(len(ds)), len(ds))  # a shuffled epoch
    loader = dloader.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers)
    trace: list[tuple[float, float]] = []
    it = iter(loader)
    next(it)
    pids = [w.pid for w in loader.stats().workers if w.pid]
    start = time.monotonic()
    samples = 0
    last = -1.0
    uss: list[int] = []
    pss_workers = pss_all = 0
    for b in it:  # measured while the workers live (stops before the epoch ends)
        samples += len(b)
        now = time.monotonic() - start
        done = now >= seconds or samples >= 0.9 * len(ds)
        if now - last >= every or done:  # smaps_rollup of big processes is not free
            uss, pss_workers = memory(pids)
            _, pss_all = memory([os.getpid(), *pids])
            trace.append((now, sum(uss) / max(len(uss), 1) / MiB))
            last = now
        if done:
            break
    del it
    return {
        "samples": samples,
        "epoch_share": samples / len(ds),
        "worker_uss_mib": sum(uss) / max(len(uss), 1) / MiB,
        "workers_pss_mib": pss_workers / MiB,
        "job_pss_mib": pss_all / MiB,
        "trace": trace,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--paths", type=int, default=3_000_000, help="paths in the dataset")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 16], help="worker counts")
    p.add_argument("--seconds", type=float, default=20.0, help="reading time per run")
    p.add_argument("--batch", type=int, default=256)
    add_out_dir(p)
    args = p.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    me = psutil.Process()
    before = me.memory_full_info().uss
    names = make_paths(args.paths)
    held = me.memory_full_info().uss - before
    containers: dict[str, Any] = {"list": names}
    t0 = time.perf_counter()
    containers["StringArray"] = dloader.StringArray(names)
    built = time.perf_counter() - t0
    print(
        f"{args.paths:,} paths: the list holds {held / MiB:,.0f} MiB in the trainer, a "
        f"StringArray {containers['StringArray'].nbytes / MiB:,.0f} MiB (built in {built:.1f} s)",
        flush=True,
    )
    rows, results = [], {}
    for workers in args.workers:
        for name, paths in containers.items():
            print(f"  {name}, {workers} workers, {args.seconds:g} s ...", flush=True)
            r = run(paths, workers, args.seconds, args.batch)
            results[f"{name}/{workers}"] = r
            rows.append(
                [
                    name,
                    workers,
                    f"{r['epoch_share']:.1%}",
                    r["worker_uss_mib"],
                    r["workers_pss_mib"],
                    r["job_pss_mib"],
                ]
            )
    headers = [
        "paths held in",
        "workers",
        "epoch read",
        "USS per worker (MiB)",
        "workers' PSS (MiB)",
        "job PSS (MiB)",
    ]
    print(table(headers, rows))
    outs = outputs(args.out_dir)
    outs("bench_memory.json").write_text(
        json.dumps(
            {"machine": machine(), "paths": args.paths, "list_mib": held / MiB, "runs": results}
        )
    )
    plots.worker_memory(results, args.paths, outs("bench_memory.png"))
    print(f"wrote {outs('bench_memory.json')} and {outs('bench_memory.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
