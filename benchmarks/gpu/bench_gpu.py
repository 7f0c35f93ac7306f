"""Real training jobs on this node's GPU, with and without dloader's tuning (needs CUDA).

The testbed's real pipelines train real models (``--device cuda``,
:mod:`dloader.apps.gpu_step`): ``image_jpeg`` (JPEG decode and augmentation) trains ResNet-18,
``text_pack`` (tokenise and pack) trains a small transformer. Each job is its own process.

1. **One job** (``image_jpeg``, ``pin_memory=True``): at each worker count of ``--counts``,
   torch's own DataLoader and ``dloader.DataLoader`` at the same count, one after the other
   (dloader / torch at the same count: the loader's own cost; target >= 1.00), then
   ``dloader.DataLoader(num_workers="auto")`` run as long and scored over the same window, so
   its search's cost counts, against the best fixed torch count (the hand-tuned baseline).
2. **Two jobs sharing the GPU** (``image_jpeg`` + ``text_pack``): every static split of
   ``--splits`` (the searched static split: the best of them), then both jobs under a real
   ``dloader-sidecar`` (adaptive policy, ``--budget`` workers) starting at 4 workers each.
   Score: each job's samples/s over its best in any run of this section, summed (2.0 = both
   at their best at once). While the sidecar runs, ``dloaderctl status`` and ``jobs`` are
   saved (the sidecar's NVML view).

For each run: samples/s over the scored window, the trainer's data-wait share, and the GPU's
utilisation as NVML reports it (sampled every 0.25 s by this process over the same window).

    python -m benchmarks.gpu.bench_gpu                      # ~5 min on a 16-core GPU node
    python -m benchmarks.gpu.bench_gpu --seconds 15 --counts 2,8 --splits 10/4

Prints the tables and writes ``bench_gpu.json`` and ``bench_gpu.png`` into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.gpu import plots
from dloader.apps.experiment import Arrival, run_jobs, score, sidecar_process
from dloader.apps.probe import gpu_utilisation

PAIR = ("image_jpeg", "text_pack")


def measured(
    args: argparse.Namespace,
    jobs: list[Arrival],
    folder: Path,
    seconds: float,
    warmup: float,
    sidecar: str | None = None,
) -> dict[str, Any]:
    """Runs ``jobs`` on ``args.device``; per job samples/s, data-wait share and workers over
    ``[warmup, seconds)``, and the GPU's mean NVML utilisation over that window."""
    with gpu_utilisation(0, 0.25) as util:
        t0 = time.monotonic()
        extra = ["--device", args.device]
        res = run_jobs(jobs, folder, seconds=seconds, sidecar=sidecar, extra=extra)
    # each job's clock starts a few seconds after t0 (import, CUDA, model): score its own window
    _, per = score(res, warmup, seconds)
    window = [u for t, u in util if t0 + warmup + 3 <= t <= t0 + seconds]
    return {
        "jobs": {
            k: {
                "samples_per_s": v["samples_per_s"],
                "wait": v["idle"],
                "workers": v["workers"],
                "tuner": res[k].get("tuner"),
                "search_s": res[k].get("search_s"),
                "changes": _changes(res[k]["timeline"]),
            }
            for k, v in per.items()
        },
        "gpu_util": sum(window) / len(window) if window else None,
    }


def _changes(timeline: list[Any]) -> list[tuple[float, int]]:
    """(second, worker count) at each change of the count."""
    out: list[tuple[float, int]] = []
    for t, _, _, k in timeline:
        if not out or out[-1][1] != k:
            out.append((round(t, 1), k))
    return out


def _fmt_util(u: float | None) -> str:
    return "n/a" if u is None else f"{u:.0%}"


def single(args: argparse.Namespace, tmp: Path, out: dict[str, Any]) -> None:
    runs = out.setdefault("single", {})
    for n in args.counts:
        for loader in ("torch", "dloader"):
            print(f"[single] {loader} DataLoader, {n} workers, {args.seconds:g} s ...", flush=True)
            jobs = [Arrival("image_jpeg", n, extra=("--loader", loader))]
            folder = tmp / f"{loader}{n}"
            runs[f"{loader} {n}"] = measured(args, jobs, folder, args.seconds, args.warmup)
    print(f"[single] dloader auto, {args.seconds:g} s ...", flush=True)
    runs["dloader auto"] = measured(
        args, [Arrival("image_jpeg", "auto")], tmp / "auto", args.seconds, args.warmup
    )
    rows = [
        [
            k,
            v["jobs"]["image_jpeg"]["samples_per_s"],
            v["jobs"]["image_jpeg"]["wait"],
            v["jobs"]["image_jpeg"]["workers"],
            _fmt_util(v["gpu_util"]),
        ]
        for k, v in runs.items()
    ]
    best = max((k for k in runs if k.startswith("torch")), key=lambda k: rows_rate(runs, k))
    out["single_auto_vs_best"] = rows_rate(runs, "dloader auto") / rows_rate(runs, best)
    out["same_count"] = {
        n: rows_rate(runs, f"dloader {n}") / max(rows_rate(runs, f"torch {n}"), 1e-9)
        for n in args.counts
    }
    print(table(["image_jpeg (ResNet-18)", "samples/s", "data wait", "workers", "GPU util"], rows))
    same = ", ".join(f"{n}: {r:.3f}" for n, r in out["same_count"].items())
    print(f"dloader / torch at the same worker count, pinned (target >= 1.00): {same}")
    print(f"auto / best fixed ({best}): {out['single_auto_vs_best']:.3f}\n", flush=True)


def rows_rate(runs: dict[str, Any], key: str) -> float:
    return float(runs[key]["jobs"]["image_jpeg"]["samples_per_s"])


def pair(args: argparse.Namespace, tmp: Path, out: dict[str, Any]) -> None:
    runs = out.setdefault("pair", {})
    for a, b in args.splits:
        print(f"[pair] static {a}/{b}, {args.seconds:g} s ...", flush=True)
        jobs = [Arrival(PAIR[0], a), Arrival(PAIR[1], b)]
        runs[f"static {a}/{b}"] = measured(
            args, jobs, tmp / f"static{a}-{b}", args.seconds, args.warmup
        )
    secs = args.sidecar_seconds
    print(f"[pair] sidecar (adaptive, {args.budget} workers), {secs:g} s ...", flush=True)
    folder = tmp / "sidecar"
    with sidecar_process(folder, policy="adaptive", worker_budget=args.budget) as sc:
        ctl = [sys.executable, "-m", "dloader.sidecar.ctl", "--socket", sc.target[len("unix://") :]]

        def snapshot() -> None:
            time.sleep(secs / 2)
            with open(args.out_dir / "bench_gpu_sidecar_view.txt", "w") as f:
                for cmd in (["status"], ["jobs", "--json"]):
                    r = subprocess.run(ctl + cmd, capture_output=True, text=True, timeout=20)
                    f.write(f"$ dloaderctl {' '.join(cmd)}\n{r.stdout}{r.stderr}\n")

        view = threading.Thread(target=snapshot, daemon=True)
        view.start()
        jobs = [Arrival(PAIR[0], 4), Arrival(PAIR[1], 4)]
        runs["sidecar"] = measured(
            args, jobs, folder, secs, secs - (args.seconds - args.warmup), sc.target
        )
        view.join(timeout=30)
    log = folder / "sidecar.log"
    if log.exists():
        (args.out_dir / "bench_gpu_sidecar.log").write_text(log.read_text()[-200_000:])
    best = {j: max(r["jobs"][j]["samples_per_s"] for r in runs.values()) for j in PAIR}
    rows = []
    for k, r in runs.items():
        s = sum(r["jobs"][j]["samples_per_s"] / best[j] for j in PAIR if best[j] > 0)
        r["score"] = s
        rows.append(
            [k]
            + [r["jobs"][j]["samples_per_s"] for j in PAIR]
            + [f"{r['jobs'][j]['wait']:.0%}" for j in PAIR]
            + [
                f"{r['jobs'][PAIR[0]]['workers']}/{r['jobs'][PAIR[1]]['workers']}",
                s,
                _fmt_util(r["gpu_util"]),
            ]
        )
    statics = [k for k in runs if k.startswith("static")]
    if statics:
        top = max(statics, key=lambda k: runs[k]["score"])
        out["sidecar_vs_best_static"] = runs["sidecar"]["score"] / runs[top]["score"]
    headers = [
        "image_jpeg + text_pack",
        "image/s",
        "text/s",
        "image wait",
        "text wait",
        "workers",
        "score",
        "GPU util",
    ]
    print(table(headers, rows))
    if statics:
        print(f"sidecar / best static ({top}): {out['sidecar_vs_best_static']:.3f}\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.bench_gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=25.0, help="each static run (default 25)")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds not scored (default 8)")
    p.add_argument(
        "--sidecar-seconds",
        type=float,
        default=45.0,
        help="the sidecar run; scored over its last seconds - warmup (default 45)",
    )
    p.add_argument("--counts", default="3,6,10,14", help="torch worker counts (default 3,6,10,14)")
    p.add_argument("--splits", default="11/3,8/6,5/9", help="static splits (default 11/3,8/6,5/9)")
    p.add_argument("--budget", type=int, default=14, help="the sidecar's worker budget (14)")
    p.add_argument("--sections", default="single,pair", help="single, pair or both")
    p.add_argument(
        "--device",
        choices=["cuda", "emulated"],
        default="cuda",
        help="cuda (default), or emulated: the same runs with the testbed's emulated step, to "
        "try this harness on a machine without a GPU (its numbers say nothing about GPUs)",
    )
    add_out_dir(p)
    args = p.parse_args(argv)
    try:
        args.counts = [int(x) for x in args.counts.split(",") if x]
        args.splits = [tuple(int(x) for x in s.split("/")) for s in args.splits.split(",") if s]
        for split in args.splits:
            if len(split) != 2 or min(split) < 1:
                raise ValueError(f"{'/'.join(map(str, split))} is not two counts >= 1")
    except ValueError as exc:
        p.error(f"--counts takes counts (3,6), --splits takes splits (11/3,8/6): {exc}")
    if not 0 <= args.warmup < args.seconds <= args.sidecar_seconds:
        p.error("expected 0 <= --warmup < --seconds <= --sidecar-seconds")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench_gpu needs a CUDA GPU, and torch sees none here (--device emulated runs the "
            "harness without one)",
            file=sys.stderr,
        )
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "emulated accelerator"
    out: dict[str, Any] = {
        "machine": f"{machine()}; {gpu}",
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    print(out["machine"], flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        for section, fn in (("single", single), ("pair", pair)):
            if section in args.sections:
                try:
                    fn(args, Path(tmp), out)
                except Exception as exc:  # keep what the other section measured
                    out[f"{section}_error"] = repr(exc)
                    print(f"[{section}] failed: {exc!r}", file=sys.stderr, flush=True)
                (args.out_dir / "bench_gpu.json").write_text(json.dumps(out, indent=1))
    plots.training_runs(out, outputs(args.out_dir)("bench_gpu.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
