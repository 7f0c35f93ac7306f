"""The daemons' state files after a year of use: their size, and how long a daemon takes to
start on one.

Two files per daemon are built row by row, with the stores' own schema:

* **pruned**: what a year leaves with the daemons' retention (``HISTORY_KEEP_S``, a week, and
  ``MAX_DECISIONS``): the jobs of the last week (``--jobs-per-day`` a day) with their models,
  and their decisions; for the sidecar also the live jobs' reports (1,000 each, as kept);
* **unpruned**: what a year left before retention: every job of the year, its model and
  decisions, and (sidecar) ``--reports-per-ended-job`` reports each.

For each file: its size, the time a real daemon takes from start to answering its health check
(``SERVING``), and the time of one ``prune()`` on a copy (the daemons prune at start, then
every 10 minutes, off the requests' path).

    python -m benchmarks.daemons.bench_state                  # about 2 minutes
    python -m benchmarks.daemons.bench_state --jobs-per-day 5 # a quicker look
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._common import add_out_dir, machine, outputs, table
from benchmarks.daemons import plots
from dloader._daemon.store import HISTORY_KEEP_S
from dloader._shared.cli import count
from dloader.allocator.store import AllocatorStore
from dloader.sidecar.store import SidecarStore

DAY_S = 86400.0
LIVE_JOBS = 64  # jobs running on the node when the sidecar restarts
REPORTS_PER_LIVE_JOB = 1000
DECISIONS_PER_JOB = 6


def _report(i: int) -> str:
    worker = {"pid": 1000 + i, "fetch_seconds": 0.1, "cpu_seconds": 0.05, "batches": 10}
    return json.dumps(
        {"samples_per_second": 300.0, "idle_share": 0.2, "workers": [worker] * 8, "i": i}
    )


def _model() -> str:
    obs = [
        {"num_workers": k, "cores": 2.0, "batch_size": 32, "samples_per_s": 100.0 * k}
        for k in range(1, 9)
    ]
    return json.dumps({"version": 2, "observations": obs, "params": [0.01] * 8})


def sidecar_file(path: Path, days: float, per_day: int, ended_reports: int, now: float) -> None:
    """A sidecar state file holding ``days`` of jobs (each ended, with a model and decisions;
    ``ended_reports`` reports each) and ``LIVE_JOBS`` live ones with their reports."""
    store = SidecarStore(path)
    db = store._db
    n = int(days * per_day)
    db.execute("BEGIN")
    jobs, models, decisions, reports = [], [], [], []
    for i in range(n + LIVE_JOBS):
        live = i >= n
        at = now - days * DAY_S + i * (days * DAY_S / max(n, 1)) if not live else now
        job_id = f"j{i:07d}"
        jobs.append(
            (job_id, f"job-{i}", secrets.token_hex(16), "{}", "[1]", "[]", 4, 32, at,
             int(live), "[]", 1000, None if live else at + 3600)
        )  # fmt: skip
        models.append((job_id, _model(), at))
        decisions += [
            (at + k, job_id, 4, 32, "[]", "4 workers: predicted 900 samples/s")
            for k in range(DECISIONS_PER_JOB)
        ]
        kept = REPORTS_PER_LIVE_JOB if live else ended_reports
        reports += [(job_id, at + k, _report(k)) for k in range(kept)]
    db.executemany(
        "INSERT INTO jobs (job_id, name, token, limits, pids, gpus, num_workers, batch_size, "
        "registered_at, active, starts, uid, ended_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        jobs,
    )
    db.executemany("INSERT INTO models VALUES (?, ?, ?)", models)
    db.executemany(
        "INSERT INTO decisions (at, job_id, num_workers, batch_size, cpus, reason) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        decisions,
    )
    db.executemany("INSERT INTO reports VALUES (?, ?, ?)", reports)
    db.execute("COMMIT")
    store.close()


def allocator_file(path: Path, days: float, per_day: int, now: float) -> None:
    """An allocator state file holding ``days`` of completed jobs (spec, model, decisions)."""
    store = AllocatorStore(path)
    db = store._db
    n = int(days * per_day)
    spec = b"\x0a" * 600  # a submitted spec with its measurements: a few hundred bytes
    db.execute("BEGIN")
    jobs, decisions = [], []
    for i in range(n):
        at = now - days * DAY_S + i * (days * DAY_S / max(n, 1))
        job_id = f"j{i:07d}"
        jobs.append((job_id, i + 1, spec, at, '{"n0": 4}', 256, at + 3600, 0, _model(),
                     secrets.token_hex(16), 1, "", "uid 1000"))  # fmt: skip
        decisions += [
            (at + k, i + 1, job_id, 4, '{"n0": 4}', 256, "goodput: 4 GPUs", 0)
            for k in range(DECISIONS_PER_JOB)
        ]
    db.executemany(
        "INSERT INTO jobs (job_id, seq, spec, submitted_at, placement, batch_size, completed_at, "
        "failed, model, token, generation, rendezvous, owner) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        jobs,
    )
    db.executemany(
        "INSERT INTO decisions (at, version, job_id, gpus, placement, batch_size, reason, "
        "dry_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        decisions,
    )
    db.execute("COMMIT")
    store.close()


def size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.glob("*.db*")) / 2**20


def start_seconds(module: str, state: Path, run: Path) -> float:
    """Seconds from starting the daemon on ``state`` to its health check answering SERVING."""
    sock = run / "d.sock"
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--socket", str(sock), "--state-dir", str(state)],
        stderr=subprocess.DEVNULL,
    )
    try:
        channel = grpc.insecure_channel(f"unix://{sock}")
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited with {proc.returncode} on {state}")
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - began
            except grpc.RpcError:
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)


def prune_seconds(kind: str, state: Path, now: float) -> tuple[float, int]:
    """One ``prune()`` on a copy of the file: seconds, rows deleted."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in state.glob("*.db*"):
            shutil.copy2(f, tmp)
        name = "sidecar.db" if kind == "sidecar" else "allocator.db"
        store = (SidecarStore if kind == "sidecar" else AllocatorStore)(Path(tmp) / name)
        began = time.monotonic()
        deleted = store.prune(now)
        took = time.monotonic() - began
        store.close()
    return took, deleted


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs-per-day", type=count, default=20, help="jobs a day on one node")
    p.add_argument(
        "--reports-per-ended-job",
        type=count,
        default=100,
        help="reports each ended job left in the unpruned sidecar file (before retention "
        "it kept up to 1,000)",
    )
    add_out_dir(p)
    args = p.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    now = time.time()
    keep_days = HISTORY_KEEP_S / DAY_S
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dloader-state-") as tmp:
        root = Path(tmp)
        builds = {
            ("sidecar", "pruned"): lambda d: sidecar_file(
                d / "sidecar.db", keep_days, args.jobs_per_day, 0, now
            ),
            ("sidecar", "unpruned"): lambda d: sidecar_file(
                d / "sidecar.db", 365, args.jobs_per_day, args.reports_per_ended_job, now
            ),
            ("allocator", "pruned"): lambda d: allocator_file(
                d / "allocator.db", keep_days, args.jobs_per_day, now
            ),
            ("allocator", "unpruned"): lambda d: allocator_file(
                d / "allocator.db", 365, args.jobs_per_day, now
            ),
        }
        for (kind, which), build in builds.items():
            state = root / f"{kind}-{which}" / "state"
            state.mkdir(parents=True, mode=0o700)
            print(f"  building the {which} {kind} file ...", file=sys.stderr, flush=True)
            build(state)
            mb = size_mb(state)
            module = f"dloader.{kind}.cli"
            starts = [start_seconds(module, state, root / f"{kind}-{which}" / "run")]
            starts.append(start_seconds(module, state, root / f"{kind}-{which}" / "run"))
            pruned_s, deleted = prune_seconds(kind, state, now)
            results[f"{kind} {which}"] = {
                "mb": mb,
                "start_s": starts,
                "prune_s": pruned_s,
                "deleted": deleted,
            }
            rows.append([kind, which, mb, min(starts), max(starts), pruned_s, deleted])
    print(
        table(
            ["daemon", "a year of use", "file MB", "start s (best)", "start s (worst)",
             "prune s", "rows pruned"],
            rows,
        )
    )  # fmt: skip
    outs = outputs(args.out_dir)
    outs("bench_state.json").write_text(
        json.dumps({"machine": machine(), "jobs_per_day": args.jobs_per_day, **results}, indent=1)
    )
    plots.state_files(results, outs("bench_state.png"))
    print(f"wrote {outs('bench_state.json')} and {outs('bench_state.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
