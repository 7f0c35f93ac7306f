"""Accuracy and cost of the predictor's models.

1. Scaling model on the Pollux traces: per application, fit on 5 placements (1 GPU, a full node,
   2 nodes x 2, 4 nodes x 1, 4 nodes x 4; all their measured local batch sizes) and predict
   every other row of ``placements.csv``: median and p90 absolute percentage error of step time
   (target: median <= 10%). Also with only 5 single points, and on ``scalability.csv``.
2. Statistical efficiency: iterations needed to reach each validated run's final progress at
   its batch size, predicted from the gradient-noise statistics (of the same run, and of the
   base-batch run: a real prediction), vs the iterations the trace records.
3. Loader model on the emulated testbed: each testbed profile (docs/architecture.md) is
   measured alone on this node at 0..16 workers (dloader's own telemetry as the observations); the
   model sees only the allocations its cold-start exploration plan picks (at most 5) and predicts
   the rest (target: median error <= 15%; its best allocation within 5% of the measured best). The
   predicted best is the fewest workers predicted within 5% of the predicted maximum.
4. Fitting cost: one ``LoaderModel.update`` with 1,000 observations (target < 50 ms).

    python -m benchmarks.predictor.bench_predictor          # ~4 min (measures the testbed)
    python -m benchmarks.predictor.bench_predictor --measurements F
                                                            # reuse a saved measurement file
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.predictor import plots
from dloader.allocator.traces import PACKAGED_TRACES
from dloader.predictor import (
    GradientNoise,
    LoaderModel,
    LoaderObservation,
    ScalingModel,
    exploration_plan,
)
from dloader.predictor.pollux import (
    APPLICATIONS,
    read_placements,
    read_scalability,
    read_validation,
    validated_batch_sizes,
)

TRACES = PACKAGED_TRACES  # shipped with the package
TRAIN_PLACEMENTS = ("1", "4", "22", "1111", "4444")
CORES = 2


def ape(pred: float, real: float) -> float:
    return abs(pred / real - 1.0)


# ---------------------------------------------------------------------------------- scaling


def scaling_section(traces: Path) -> tuple[list[list[Any]], dict[str, Any]]:
    rows, scatter = [], {}
    for app in APPLICATIONS:
        data = read_placements(traces / app)
        train = [p for name, p in data if name in TRAIN_PLACEMENTS]
        test = [p for name, p in data if name not in TRAIN_PLACEMENTS]
        t0 = time.perf_counter()
        model = ScalingModel.fit(train)
        fit_ms = (time.perf_counter() - t0) * 1000
        errs = [ape(model.step_time(p.nodes, p.replicas, p.local_bsz), p.step_time) for p in test]
        # Harsher: five single measurements, one per training placement (middle batch size).
        five = []
        for name in TRAIN_PLACEMENTS:
            pts = sorted((p for n, p in data if n == name), key=lambda p: p.local_bsz)
            five.append(pts[len(pts) // 2])
        small = ScalingModel.fit(five)
        errs5 = [ape(small.step_time(p.nodes, p.replicas, p.local_bsz), p.step_time) for p in test]
        big = read_scalability(traces / app)
        errs_big = [
            ape(model.step_time(p.nodes, p.replicas, p.local_bsz), p.step_time) for p in big
        ]
        rows.append(
            [
                app,
                len(train),
                len(test),
                100 * statistics.median(errs),
                100 * float(np.percentile(errs, 90)),
                100 * statistics.median(errs5),
                len(big),
                100 * statistics.median(errs_big),
                max(p.replicas for p in big),
                fit_ms,
            ]
        )
        scatter[app] = [
            (p.step_time, model.step_time(p.nodes, p.replicas, p.local_bsz)) for p in test
        ]
    return rows, scatter


# ---------------------------------------------------------------------------------- efficiency


def _phi(row: Any, m0: int, fallback: float) -> float:
    return m0 * row.grad_var / row.grad_sqr if row.grad_sqr > 0 else fallback


def efficiency_section(traces: Path) -> list[list[Any]]:
    rows = []
    for app in APPLICATIONS:
        sizes = validated_batch_sizes(traces / app)
        m0 = sizes[0]
        base = read_validation(traces / app, m0)
        base_prog = np.array([r.progress for r in base])
        base_phi, last = [], 1.0
        for r in base:
            last = _phi(r, m0, last)
            base_phi.append(last)
        same_err, cross_err = [], []
        for b in sizes[1:]:
            run = read_validation(traces / app, b)
            prev, it_same, it_cross, phi = 0.0, 0.0, 0.0, 1.0
            for r in run:
                phi = _phi(r, m0, phi)
                step = r.progress - prev
                it_same += step / GradientNoise(m0, 1.0, phi / m0).progress_per_step(b)
                cross_phi = float(np.interp(r.progress, base_prog, base_phi))
                it_cross += step / GradientNoise(m0, 1.0, cross_phi / m0).progress_per_step(b)
                prev = r.progress
            same_err.append(ape(it_same, run[-1].iteration))
            cross_err.append(ape(it_cross, run[-1].iteration))
        rows.append(
            [
                app,
                m0,
                ",".join(map(str, sizes[1:])),
                100 * statistics.median(same_err),
                100 * statistics.median(cross_err),
                100 * max(cross_err),
            ]
        )
    return rows


# ---------------------------------------------------------------------------------- loader


def measure(profile_name: str, workers: int, seconds: float) -> dict[str, Any]:
    """Runs one emulated job alone with ``workers`` workers; its loader's stats at the end."""
    import dloader
    from dloader.apps.testbed import PROFILES, EmulatedDataset, run_job

    profile = PROFILES[profile_name]
    loader = dloader.DataLoader(
        EmulatedDataset.from_profile(profile, 10**6),
        batch_size=profile.batch_size,
        shuffle=True,
        num_workers=workers,
        stats_window_s=seconds,
    )
    snap: list[Any] = []

    def mark(step: int, now: float) -> None:
        snap[:] = [loader.stats()]  # while the workers are still there

    run_job(loader, profile, seconds=seconds + 1.0, on_step=mark)
    s = snap[0]
    ws = [w for w in s.workers if w.batches > 0]
    return {
        "num_workers": workers,
        "cores": CORES,
        "batch_size": profile.batch_size,
        "samples_per_s": s.samples_per_second,
        "idle_share": s.idle_share,
        "step_s": s.step_seconds,
        "fetch_s": statistics.mean(w.fetch_seconds for w in ws) if ws else None,
        "cpu_s": statistics.mean(w.cpu_seconds for w in ws) if ws else None,
    }


def measure_all(seconds: float, max_workers: int) -> dict[str, list[dict[str, Any]]]:
    from dloader.apps.testbed import PROFILES

    out: dict[str, list[dict[str, Any]]] = {}
    total = len(PROFILES) * (max_workers + 1)
    done = 0
    for name in PROFILES:
        out[name] = []
        for k in range(max_workers + 1):
            out[name].append(measure(name, k, seconds))
            done += 1
            print(
                f"  [{done}/{total}] {name} workers={k}: "
                f"{out[name][-1]['samples_per_s']:.0f} samples/s",
                file=sys.stderr,
                flush=True,
            )
    return out


def loader_section(measured: dict[str, list[dict[str, Any]]]) -> tuple[list[list[Any]], dict]:
    rows, curves = [], {}
    for name, series in measured.items():
        by_k = {m["num_workers"]: LoaderObservation(**m) for m in series}
        max_workers = max(by_k)
        seen: list[LoaderObservation] = []
        k0 = min(CORES, max_workers)  # the job starts where torch's advice puts it
        seen.append(by_k[k0])
        while len(seen) < 5:
            k = exploration_plan(seen, cores=CORES, max_workers=max_workers)
            if k is None:
                break
            seen.append(by_k[k])
        model = LoaderModel()
        model.update(*seen)
        ks = sorted(by_k)
        real = [by_k[k].samples_per_s for k in ks]
        pred = [model.predict(k, CORES, by_k[k].batch_size).samples_per_s for k in ks]
        errs = [ape(p, r) for p, r in zip(pred, real, strict=True)]
        # The allocation an allocator would pick: the fewest workers predicted within 5% of the
        # predicted maximum (a monotone model's argmax is the largest k by construction).
        top = max(pred)
        k_best = next(k for k, p in zip(ks, pred, strict=True) if p >= 0.95 * top)
        measured_best = max(real)
        rows.append(
            [
                name,
                ",".join(str(o.num_workers) for o in seen),
                100 * statistics.median(errs),
                100 * max(errs),
                k_best,
                by_k[k_best].samples_per_s,
                ks[int(np.argmax(real))],
                measured_best,
                100 * by_k[k_best].samples_per_s / measured_best,
            ]
        )
        curves[name] = {"ks": ks, "real": real, "pred": pred, "seen": [o.num_workers for o in seen]}
    return rows, curves


def fitting_cost() -> float:
    rng = np.random.default_rng(0)
    obs = []
    for _ in range(1000):
        k = int(rng.integers(0, 17))
        t = 1600 * min(1.0, (k + 0.2) / 14) * float(rng.uniform(0.9, 1.1))
        obs.append(
            LoaderObservation(
                k,
                2,
                32,
                t,
                max(0.0, 1 - t / 1600),
                32 / t,
                0.27 if k else None,
                0.01 if k else None,
            )
        )
    model = LoaderModel()
    model.update(*obs[:999])
    times = []
    for o in obs[999:] * 20:
        t0 = time.perf_counter()
        model.update(o)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


# ---------------------------------------------------------------------------------- output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.predictor.bench_predictor",
        description="Accuracy and cost of the predictor's models.",
    )
    parser.add_argument(
        "--traces",
        type=Path,
        default=TRACES,
        help="Pollux traces folder (default: the one shipped with the package)",
    )
    parser.add_argument(
        "--measurements",
        type=Path,
        default=None,
        help="reuse testbed measurements saved by an earlier run (JSON)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="measured seconds per testbed run (default: %(default)s)",
    )
    parser.add_argument(
        "--max-workers",
        type=int,
        default=16,
        help="largest worker count measured (default: %(default)s)",
    )
    add_out_dir(parser)
    args = parser.parse_args(argv)
    outs = outputs(args.out_dir)
    if not args.traces.is_dir():
        parser.error(f"--traces={args.traces} is not a folder")
    warnings.filterwarnings("ignore")
    print(f"machine: {machine()}", flush=True)

    rows, scatter = scaling_section(args.traces)
    print(
        f"\n## Scaling model: step time on unseen placements (fit on {', '.join(TRAIN_PLACEMENTS)})"
    )
    print(
        table(
            [
                "app",
                "train points",
                "test points",
                "median APE %",
                "p90 APE %",
                "median APE % (5 points)",
                "scalability points",
                "median APE % (scalability)",
                "max GPUs there",
                "fit ms",
            ],
            rows,
        )
    )

    print("\n## Statistical efficiency: predicted vs recorded iterations to each run's end")
    print(
        table(
            [
                "app",
                "base batch",
                "batches checked",
                "median err % (same-run stats)",
                "median err % (base-run stats)",
                "max err % (base-run stats)",
            ],
            efficiency_section(args.traces),
        )
    )

    if args.measurements:
        measured = json.loads(args.measurements.read_text())
    else:
        measured = measure_all(args.seconds, args.max_workers)
        path = outs("bench_predictor_measurements.json")
        path.write_text(json.dumps(measured, indent=1))
        print(f"\n(testbed measurements saved to {path})")
    lrows, curves = loader_section(measured)
    print("\n## Loader model on the emulated testbed (2 cores, one job at a time)")
    print(
        table(
            [
                "profile",
                "observed workers",
                "median err %",
                "max err %",
                "predicted best k",
                "its measured samples/s",
                "measured best k",
                "measured best samples/s",
                "% of best",
            ],
            lrows,
        )
    )
    cost = fitting_cost()
    print(f"\nLoaderModel.update with 1,000 observations: {cost:.1f} ms (median of 20)")
    plots.model_errors(scatter, curves, outs("bench_predictor.png"))
    summary = {"machine": machine(), "scaling": rows, "loader": lrows, "fit_ms": cost}
    outs("bench_predictor.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {outs('bench_predictor.png')} and {outs('bench_predictor.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
