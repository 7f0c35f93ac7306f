"""Running emulated jobs on this node, with or without a sidecar: for the demo and benchmarks.

Each job is its own process (``python -m dloader.apps.testbed``), as on a real shared node; the
sidecar is a real ``dloader-sidecar`` process on a Unix socket with its SQLite state.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Arrival", "JobPlan", "Sidecar", "run_jobs", "score", "sidecar_process"]

JobPlan = tuple[str, int | str, float, int | None]
"""(profile, start workers or "auto", arrival second, samples or None for a fixed time)."""


@dataclass(frozen=True)
class Arrival:
    """A job of :func:`run_jobs`, with more said than a :data:`JobPlan`."""

    profile: str
    workers: int | str
    at: float = 0.0
    """Its arrival, seconds after the first."""
    samples: int | None = None
    seconds: float | None = None
    """How long it trains (default: ``run_jobs``'s ``seconds``); ignored with ``samples``."""
    label: str | None = None
    """Its key in the results (default: the profile; two jobs of one profile need labels)."""
    extra: tuple[str, ...] = ()
    """More ``dloader.apps.testbed`` arguments for this job (e.g. ``--slowdown-at 30``)."""


@dataclass(frozen=True)
class Sidecar:
    """A running sidecar process."""

    target: str
    """Its ``unix://`` address."""
    pid: int


@contextlib.contextmanager
def sidecar_process(
    folder: Path,
    *,
    policy: str,
    worker_budget: int,
    period_s: float = 2.0,
    log_level: str = "INFO",
    memory_budget: str | None = None,
    extra: Sequence[str] = (),
    cpus: Collection[int] | None = None,
) -> Iterator[Sidecar]:
    """A running ``dloader-sidecar`` (its log in ``folder/sidecar.log``); stopped with SIGTERM.
    ``memory_budget``: its ``--memory-budget`` (default: the sidecar's); ``extra``: more of its
    arguments (``--allocator ...``); ``cpus``: pin it to these CPUs once started (a node of
    that many cores on this machine)."""
    folder.mkdir(parents=True, exist_ok=True)
    sock = folder / "sidecar.sock"
    cmd = [
        sys.executable,
        "-m",
        "dloader.sidecar.cli",
        "--socket",
        str(sock),
        "--state-dir",
        str(folder / "state"),
        "--policy",
        policy,
        "--period",
        str(period_s),
        "--worker-budget",
        str(worker_budget),
        "--log-level",
        log_level,
    ]
    if memory_budget is not None:
        cmd += ["--memory-budget", memory_budget]
    with open(folder / "sidecar.log", "w") as log:
        daemon = subprocess.Popen([*cmd, *extra], stderr=log)
        try:
            if cpus is not None:
                os.sched_setaffinity(daemon.pid, set(cpus))
            deadline = time.monotonic() + 30
            while not sock.exists():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the sidecar did not start; see {folder / 'sidecar.log'}")
                time.sleep(0.1)
            yield Sidecar(f"unix://{sock}", daemon.pid)
        finally:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                daemon.kill()


def _job_command(
    plan: Arrival,
    out: Path,
    seconds: float | None,
    sidecar: str | None,
    extra: Sequence[str],
) -> list[str]:
    """The testbed command line of one job, which exits with this process."""
    cmd = [sys.executable, "-m", "dloader.apps.testbed", "--profile", plan.profile]
    cmd += ["--workers", str(plan.workers), "--out", str(out), "--parent", str(os.getpid())]
    cmd += (
        ["--samples", str(plan.samples)]
        if plan.samples
        else ["--seconds", str(plan.seconds if plan.seconds is not None else seconds)]
    )
    if sidecar:
        cmd += ["--sidecar", sidecar]
    return [*cmd, *extra, *plan.extra]


def run_jobs(
    jobs: Sequence[JobPlan | Arrival],
    folder: Path,
    *,
    seconds: float | None = None,
    sidecar: str | None = None,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Runs the jobs (each arriving at its second) to completion; returns their timelines, by
    label. ``extra``: more ``dloader.apps.testbed`` arguments for every job (``--jpegs 200``).
    The files the jobs read are generated and read into the page cache first
    (:func:`dloader.apps.testbed.warm`), so that each run of a comparison starts alike.
    Stopped (an exception, a signal that ends this process) or with a job failed, it stops the
    jobs it started; a job also exits by itself when this process is gone (``--parent``)."""
    plans = [j if isinstance(j, Arrival) else Arrival(*j) for j in jobs]
    labels = [j.label or j.profile for j in plans]
    if len(set(labels)) < len(labels):
        raise ValueError(f"jobs {labels}: two jobs of one profile need labels of their own")
    folder.mkdir(parents=True, exist_ok=True)
    _warm(plans, extra)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs: list[subprocess.Popen[bytes]] = []
    outs: dict[str, Path] = {}
    t0 = time.monotonic()
    try:
        for plan, label in sorted(zip(plans, labels, strict=True), key=lambda x: x[0].at):
            time.sleep(max(plan.at - (time.monotonic() - t0), 0.0))
            out = outs[label] = folder / f"{label}-{time.monotonic_ns()}.json"
            cmd = _job_command(plan, out, seconds, sidecar, extra)
            procs.append(
                subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            )
        for p in procs:
            if p.wait(timeout=3600) != 0:
                raise RuntimeError(f"job {p.args!r} failed with exit code {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
    return {name: json.loads(path.read_text()) for name, path in outs.items()}


def _warm(plans: Sequence[Arrival], extra: Sequence[str]) -> None:
    """Each profile's files (:func:`dloader.apps.testbed.warm`) at the ``--jpegs`` its job is
    given (the last one, as the testbed's parser reads it)."""
    from dloader.apps import pipelines, testbed

    done = set()
    for plan in plans:
        profile = testbed.PROFILES.get(plan.profile)
        jpegs = last_value([*extra, *plan.extra], "--jpegs")
        key = (plan.profile, jpegs)
        if profile is None or key in done:
            continue  # an unknown profile: the testbed says so
        done.add(key)
        if jpegs is not None and not jpegs.isdigit():
            raise ValueError(f"--jpegs {jpegs!r}: expected a whole number of files")
        testbed.warm(profile, int(jpegs) if jpegs is not None else pipelines.JPEGS)


def last_value(args: Sequence[str], option: str) -> str | None:
    """The value the last ``option`` in ``args`` is given (``--opt V`` or ``--opt=V``), as
    argparse reads it; None where it is not given."""
    found = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg[len(option) + 1 :]
    return found


def score(results: dict[str, Any], start: float, end: float) -> tuple[float, dict[str, Any]]:
    """Sum over jobs of throughput / accelerator limit over ``[start, end)`` seconds of each
    job's run, and per job: samples/s, normalised, idle share, the usual worker count."""
    per = {}
    for name, r in results.items():
        rows = [x for x in r["timeline"] if start <= x[0] < end]
        tput = sum(x[1] for x in rows) / (end - start) if rows else 0.0
        idle = sum(x[2] for x in rows) / (end - start) if rows else 0.0
        per[name] = {
            "samples_per_s": tput,
            "normalized": tput / r["limit"],
            "idle": min(idle, 1.0),
            # the count held longest in the window (jobs ending early free workers at the end)
            "workers": Counter(x[3] for x in rows).most_common(1)[0][0] if rows else None,
        }
    return sum(p["normalized"] for p in per.values()), per
