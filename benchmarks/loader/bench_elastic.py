"""Cost of resuming an epoch under a new world size.

A job stops halfway through an epoch of N samples with W ranks and restarts with W' ranks. For
rank 0 of the new world, measured in a fresh process: the time from building the sampler and
loader (and loading the saved state) to the first batch, and the peak memory this adds.

* ``dloader``: ``ElasticDistributedSampler`` + ``dloader.DataLoader.load_state_dict`` (the
  sampler jumps to the resume point; no index list);
* ``naive``: torch's ``DistributedSampler`` (which materialises a shuffled list of all N
  indices every epoch) skipped forward by iterating it, as a resumable loader without an
  elastic sampler must. Across a world-size change it is not even correct (the ranks' strides
  change): it is here for its cost only.

    python -m benchmarks.loader.bench_elastic                 # ~2 min; 100M needs ~6 GB for naive
    python -m benchmarks.loader.bench_elastic --sizes 1e6,1e7 --no-naive-above 1e7
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots

CHANGES = [(2, 3), (8, 5), (16, 64)]


class Indices:
    """A dataset whose sample ``i`` is ``i`` (no data cost: only the resume is measured)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, n: int, w_old: int, w_new: int) -> dict[str, Any]:
    import torch
    from torch.utils.data import DistributedSampler

    import dloader

    ds = Indices(n)
    # The state rank 0 of the old world saved at 50% of the epoch (lockstep: same on all ranks).
    old = dloader.ElasticDistributedSampler(ds, num_replicas=w_old, rank=0, seed=0)
    per_rank = n // 2 // w_old
    state = {
        "version": 1,
        "dataset_kind": "map",
        "epoch": 1,
        "samples_yielded": per_rank,
        "batches_yielded": per_rank // 32,
        "batch_size": 32,
        "num_workers": 0,
        "sampler": {"kind": "stateful", "state": old.state_dict()},
        "dataset_len": n,
        "exhausted": False,
    }
    torch.tensor([0])  # torch's lazy start-up is not the resume's
    base = _rss_mb()
    t0 = time.perf_counter()
    if kind == "dloader":
        sampler = dloader.ElasticDistributedSampler(ds, num_replicas=w_new, rank=0, seed=0)
        loader = dloader.DataLoader(ds, batch_size=32, sampler=sampler)
        loader.load_state_dict(state)
        first = next(iter(loader))
    else:
        tsampler = DistributedSampler(ds, num_replicas=w_new, rank=0, seed=0)
        it = iter(tsampler)
        skip = n // 2 // w_new
        next(itertools.islice(it, skip, skip), None)  # consume `skip` indices
        first = torch.tensor(list(itertools.islice(it, 32)))
    elapsed = time.perf_counter() - t0
    assert len(first) == 32
    return {"seconds": elapsed, "extra_rss_mb": max(_rss_mb() - base, 0.0)}


def run_child(kind: str, n: int, w_old: int, w_new: int) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.loader.bench_elastic",
            "--child",
            kind,
            str(n),
            str(w_old),
            str(w_new),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_elastic",
        description="Cost of resuming an epoch under a new world size: dloader vs a naive skip.",
    )
    parser.add_argument(
        "--sizes", default="1e6,1e7,1e8", help="dataset sizes (default: %(default)s)"
    )
    parser.add_argument(
        "--no-naive-above",
        type=float,
        default=1e8,
        help="skip the naive baseline above this size (default: %(default)g)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    add_out_dir(parser)
    args = parser.parse_args(argv)
    if args.child:
        kind, n, w_old, w_new = args.child
        print(json.dumps(child(kind, int(n), int(w_old), int(w_new))))
        return 0
    try:
        sizes = [int(float(s)) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes={args.sizes!r} must be comma-separated numbers")
    print(f"machine: {machine()}", flush=True)
    rows = []
    for n in sizes:
        for w_old, w_new in CHANGES:
            for kind in ("dloader", "naive"):
                if kind == "naive" and (n > args.no_naive_above or (w_old, w_new) != CHANGES[0]):
                    continue  # the naive cost hardly depends on the world sizes: measure once
                r = run_child(kind, n, w_old, w_new)
                rows.append({"kind": kind, "n": n, "w_old": w_old, "w_new": w_new, **r})
                print(
                    f"  {kind} N={n:,} {w_old}->{w_new}: {r['seconds'] * 1000:.1f} ms, "
                    f"+{r['extra_rss_mb']:.0f} MB",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        table(
            ["resume", "N", "world", "time to first batch ms", "extra peak RSS MB"],
            [
                [
                    r["kind"],
                    f"{r['n']:,}",
                    f"{r['w_old']}->{r['w_new']}",
                    r["seconds"] * 1000,
                    r["extra_rss_mb"],
                ]
                for r in rows
            ],
        )
    )
    outs = outputs(args.out_dir)
    outs("bench_elastic.json").write_text(
        json.dumps({"machine": machine(), "rows": rows}, indent=1)
    )
    plots.resume_cost(rows, outs("bench_elastic.png"))
    print(f"wrote {outs('bench_elastic.json')} and {outs('bench_elastic.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
