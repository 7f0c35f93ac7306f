"""One emulated training job as its own process, for the sidecar benchmark.

    python -m benchmarks.sidecar_job --profile io_heavy --workers 4 --seconds 40 \\
        --out job.json [--sidecar unix:///path.sock]

Writes a JSON timeline: per step (seconds since start, samples, wait seconds, workers).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import dloader
from dloader.testbed import PROFILES, EmulatedDataset, run_job


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sidecar_job")
    p.add_argument("--profile", choices=sorted(PROFILES), required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sidecar", default=None)
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    profile = PROFILES[args.profile]
    loader = dloader.DataLoader(
        EmulatedDataset.from_profile(profile, 10**6),
        batch_size=profile.batch_size,
        shuffle=True,
        num_workers=args.workers,
        sidecar=args.sidecar,
        job_name=args.profile,
        stats_window_s=2.0,  # reports cover 2 s: the sidecar learns from settled windows sooner
    )
    timeline: list[tuple[float, int, float, int]] = []
    last_wait = [0.0]

    def on_step(step: int, now: float) -> None:
        s = loader.stats()
        timeline.append(
            (now, profile.batch_size, s.wait_total_s - last_wait[0], loader.num_workers)
        )
        last_wait[0] = s.wait_total_s

    run_job(loader, profile, seconds=args.seconds, on_step=on_step)
    if loader.sidecar_agent is not None:
        loader.sidecar_agent.stop()
    with open(args.out, "w") as f:
        json.dump({"profile": args.profile, "limit": profile.limit(), "timeline": timeline}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
