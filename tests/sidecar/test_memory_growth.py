"""Memory from the first second: a real sidecar with a tight memory budget and a real job whose
forked workers copy their trainer's memory as they read (copy-on-read, ``_cow_job``). Their
private memory is sampled every second; any sample over the budget fails the test."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dloader.apps.experiment import sidecar_process

# 40 s of a real job under the sidecar: with the slow tests (the default run stays short)
pytestmark = [pytest.mark.integration, pytest.mark.slow]

MiB = 2**20
BUDGET = 600 * MiB
SECONDS = 40.0


def workers_uss(trainer: psutil.Process) -> tuple[int, int]:
    """How many processes the trainer has below it, and their USS together."""
    count = total = 0
    for child in trainer.children(recursive=True):
        try:
            total += child.memory_full_info().uss
            count += 1
        except psutil.Error:  # a worker that just ended
            continue
    return count, total


def test_no_sample_passes_the_memory_budget(tmp_path: Path) -> None:
    """A million paths: each worker comes to hold ~100 MiB privately, over ~30 s, though it
    starts at ~20 MiB. The adaptive policy wants many workers (2 ms per item); one that trusted
    a young worker's size would take the job to 16 and pass the budget within seconds. The
    sidecar must grow it only to what its workers may come to hold, and still grow it."""
    root = Path(__file__).resolve().parents[2]
    with sidecar_process(
        tmp_path / "s", policy="adaptive", worker_budget=16, memory_budget="600M"
    ) as sc:
        job = subprocess.Popen(
            [sys.executable, "-m", "tests.sidecar._cow_job", "1000000", str(SECONDS), sc.target],
            cwd=root,
            stderr=subprocess.DEVNULL,
        )
        trainer = psutil.Process(job.pid)
        samples: list[tuple[float, int, int]] = []
        t0 = time.monotonic()
        try:
            while job.poll() is None and time.monotonic() - t0 < SECONDS + 60:
                try:
                    samples.append((time.monotonic() - t0, *workers_uss(trainer)))
                except psutil.NoSuchProcess:
                    break
                time.sleep(1.0)
        finally:
            job.kill()
            job.wait()
    log = (tmp_path / "s" / "sidecar.log").read_text()
    over = [s for s in samples if s[2] > BUDGET]
    assert len(samples) >= SECONDS * 0.7, samples
    assert not over, f"over the {BUDGET / MiB:.0f} MiB budget: {over}"
    # not by keeping it at one worker: it grew (loader workers + the agent's process) ...
    assert max(n for _, n, _ in samples) >= 3, samples
    # ... as far as its growing workers' bound let it
    assert "what its growing workers may copy" in log, log
