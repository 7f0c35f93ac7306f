"""Remote loader workers (Ray) where a node's cores cannot feed its accelerator: this machine cut
into "nodes" by CPU sets.

The trainer and its local workers are pinned to core 0; a local Ray cluster
(``dloader.apps.raycluster``) has its head on core 0 and one worker node of 1 CPU pinned to core
1. Each pipeline runs with the same local worker count twice, in fresh processes, alternating:

* ``local``: the local workers alone (on the trainer's one core);
* ``+1 remote``: the same, plus one remote worker on the other core (``RayWorkers(1)``).

Scored on a steady window after the remote worker has come up (samples/s of the training loop,
an emulated accelerator step per batch). Then what a remote batch costs: batches of 4 KB to
16 MB from one remote worker to an idle trainer: throughput, and the CPU the local node spends
per batch receiving it (the helper process, which unpickles Ray's copy and writes it to the
trainer's shared memory, and the trainer): the batch size below which moving a CPU-bound
pipeline's batch costs the local node more than loading it there.

    python -m benchmarks.loader.bench_remote                   # ~12 min on 2 cores
    python -m benchmarks.loader.bench_remote --profiles cpu_heavy --repeats 1 --seconds 10

Prints the tables, writes ``bench_remote.json`` and ``bench_remote.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.loader import plots

ARMS = ("local", "+1 remote")
TARGETS = {"cpu_heavy": 1.7, "image_jpeg": 1.7, "image_jpeg_u8": 1.7, "io_heavy": 0.97}
SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)


class _Payload:
    """Each sample: ``size`` bytes (uint8), costless to make."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> Any:
        import torch

        return torch.full((self.size,), i % 251, dtype=torch.uint8)


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process, pinned to core 0 (its workers inherit it)."""
    os.sched_setaffinity(0, {args.core})
    import dloader
    from dloader.apps.testbed import PROFILES, make_dataset

    remote = int(args.remote)
    spec = (
        dloader.RayWorkers(remote, address=args.address, resources={"pool": 1}) if remote else None
    )
    if args.payload:
        dataset: Any = _Payload(args.payload)
        batch, step_s = 1, 0.0
    else:
        prof = PROFILES[args.profile]
        dataset = make_dataset(prof, 10**7)
        batch, step_s = prof.batch_size, prof.step_s(prof.batch_size)
    loader = dloader.DataLoader(
        dataset,
        batch_size=batch,
        num_workers=args.local,
        remote=spec,
        prefetch_factor=4 if args.local else None,
    )
    it = iter(loader)
    started = time.monotonic()
    while time.monotonic() - started < args.warmup or (
        remote and not any(w.remote and w.batches > 4 for w in loader.stats().workers)
    ):
        next(it)
        time.sleep(step_s)
        if time.monotonic() - started > 300:
            raise RuntimeError("the remote worker did not come up in 300 s")
    helper = getattr(it, "_helper", None)
    me = os.getpid()
    cpu0 = _cpu_s(me) + (_cpu_s(helper.pid) if helper is not None else 0.0)
    samples = batches = 0
    t0 = time.perf_counter()
    remote0 = sum(w.batches for w in loader.stats().workers if w.remote)
    while time.perf_counter() - t0 < args.seconds:
        b = next(it)
        samples += len(b) if not isinstance(b, (list, tuple)) else len(b[0])
        batches += 1
        time.sleep(step_s)
    elapsed = time.perf_counter() - t0
    cpu = _cpu_s(me) + (_cpu_s(helper.pid) if helper is not None else 0.0) - cpu0
    remote_batches = sum(w.batches for w in loader.stats().workers if w.remote) - remote0
    return {
        "samples_per_s": samples / elapsed,
        "batches_per_s": batches / elapsed,
        "remote_share": remote_batches / max(batches, 1),
        "local_cpu_ms_per_batch": 1000 * cpu / max(batches, 1),
    }


def _ratios(
    runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> tuple[list[list[Any]], dict[str, Any]]:
    """The table's rows and, per profile, the ratio of the means and of each round."""
    from dloader.apps.testbed import PROFILES

    rows, ratios = [], {}
    for prof, by_arm in runs.items():
        mean = {a: statistics.mean(x["samples_per_s"] for x in v) for a, v in by_arm.items()}
        ratio = mean["+1 remote"] / mean["local"]
        per_round = [
            b["samples_per_s"] / a["samples_per_s"]
            for a, b in zip(by_arm["local"], by_arm["+1 remote"], strict=True)
        ]
        ratios[prof] = {"ratio": ratio, "rounds": per_round}
        share = statistics.mean(x["remote_share"] for x in by_arm["+1 remote"])
        target = TARGETS.get(prof)
        rows.append(
            [
                prof,
                PROFILES[prof].limit(),
                mean["local"],
                mean["+1 remote"],
                f"{share:.0%}",
                f"**{ratio:.2f}x** ({', '.join(f'{x:.2f}' for x in per_round)})",
                f">= {target}" if target else "",
            ]
        )
    return rows, ratios


def _run(args: argparse.Namespace, address: str, **kw: Any) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.loader.bench_remote", "--child", "--address", address]
    cmd += ["--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    for k, v in kw.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.loader.bench_remote",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profiles",
        default="cpu_heavy,image_jpeg,image_jpeg_u8,io_heavy",
        help="testbed profiles (default cpu_heavy,image_jpeg,image_jpeg_u8,io_heavy)",
    )
    p.add_argument("--local", type=int, default=2, help="local workers in both arms (default 2)")
    p.add_argument("--seconds", type=float, default=20.0, help="scored seconds per run (20)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before scoring (5)")
    p.add_argument("--repeats", type=int, default=2, help="alternating rounds (default 2)")
    p.add_argument("--no-sizes", action="store_true", help="skip the per-batch cost runs")
    add_out_dir(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    p.add_argument("--profile", default="cpu_heavy", help=argparse.SUPPRESS)
    p.add_argument("--remote", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--payload", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--core", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        p.error("needs 2 usable cores: one for the trainer's node, one for the remote node")
    profiles = [x for x in args.profiles.split(",") if x]
    if args.repeats < 1 or args.seconds <= 0 or args.local < 1:
        p.error("expected --repeats >= 1, --seconds > 0 and --local >= 1")
    from dloader.apps.raycluster import LocalRayCluster
    from dloader.apps.testbed import PROFILES

    unknown = [x for x in profiles if x not in PROFILES]
    if unknown:
        p.error(f"--profiles: unknown {unknown}; expected some of {sorted(PROFILES)}")
    out = outputs(args.out_dir)
    print(f"machine: {machine()}", flush=True)
    print(f"nodes: trainer + {args.local} local workers + Ray head on core {cores[0]}; "
          f"remote node of 1 CPU on core {cores[1]}", flush=True)  # fmt: skip
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    sizes: dict[int, dict[str, Any]] = {}
    with LocalRayCluster([cores[0]], log=out("bench_remote_ray.log")) as cluster:
        cluster.add_node("pool", 1, [cores[1]], {"pool": 1})
        for r in range(args.repeats):
            for prof in profiles:
                for arm in ARMS:
                    print(f"  round {r + 1}: {prof}, {arm} ...", file=sys.stderr, flush=True)
                    res = _run(
                        args, cluster.address, profile=prof, local=args.local,
                        remote=int(arm != "local"), core=cores[0],
                    )  # fmt: skip
                    runs.setdefault(prof, {}).setdefault(arm, []).append(res)
        rows, ratios = _ratios(runs)
        print()
        headers = ["profile", "limit", "local", "+1 remote", "remote share", "ratio", "target"]
        print(table(headers, rows), flush=True)
        if not args.no_sizes:
            for size in SIZES:
                print(f"  a remote batch of {size:,} bytes ...", file=sys.stderr, flush=True)
                sizes[size] = _run(
                    args, cluster.address, payload=size, local=0, remote=1, core=cores[0]
                )
    size_rows = []
    for size, res in sizes.items():
        size_rows.append(
            [
                f"{size:,}",
                res["batches_per_s"],
                res["batches_per_s"] * size / 2**20,
                res["local_cpu_ms_per_batch"],
            ]
        )
    fixed = per_mb = None
    if len(sizes) >= 2:
        xs = [s / 2**20 for s in sizes]
        ys = [sizes[s]["local_cpu_ms_per_batch"] for s in sizes]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        per_mb = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mx) ** 2 for x in xs
        )
        fixed = my - per_mb * mx
        print()
        print(
            table(
                ["batch bytes", "batches/s", "MB/s", "local CPU ms per batch"],
                size_rows,
            )
        )
        print(
            f"\nlocal CPU per remote batch ~= {fixed:.2f} ms + {per_mb:.2f} ms per MB. A pipeline "
            "costing c ms of CPU per sample of s MB saves c - s x that per sample moved: moving "
            f"pays above a batch of {fixed:.2f} / (c - {per_mb:.2f} s) samples (e.g. 3 ms and "
            f"0.15 MB a sample: {fixed / max(3 - per_mb * 0.15, 1e-9):.1f} samples), and never "
            f"where c <= {per_mb:.2f} s."
        )
    result = {
        "machine": machine(),
        "runs": runs,
        "ratios": ratios,
        "sizes": {str(k): v for k, v in sizes.items()},
        "fixed_ms": fixed,
        "ms_per_mb": per_mb,
    }
    out("bench_remote.json").write_text(json.dumps(result, indent=2))
    plots.remote(runs, sizes, out("bench_remote.png"))
    print(f"\nwrote {out('bench_remote.json')} and {out('bench_remote.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
