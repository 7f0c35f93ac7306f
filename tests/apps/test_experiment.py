"""The experiment helpers behind the demo and benchmarks, and the demo itself, for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from dloader.apps.demo import single
from dloader.apps.experiment import run_jobs, score, sidecar_process

pytestmark = pytest.mark.integration


def test_jobs_run_with_a_sidecar_and_are_scored(tmp_path: Path) -> None:
    with sidecar_process(tmp_path / "s", policy="even", worker_budget=2, period_s=0.5) as sc:
        assert sc.target.startswith("unix://") and sc.pid > 0
        results = run_jobs(
            [("gpu_bound", 1, 0.0, 96), ("io_heavy", 1, 0.5, 96)], tmp_path, sidecar=sc.target
        )
    assert set(results) == {"gpu_bound", "io_heavy"}
    assert all(len(r["timeline"]) == 3 for r in results.values())  # 96 samples, batch 32
    total, per = score(results, 0.0, 60.0)
    assert total > 0 and per["gpu_bound"]["normalized"] > 0
    assert (tmp_path / "s" / "state" / "sidecar.db").exists()
    assert "registered" in (tmp_path / "s" / "sidecar.log").read_text()


def test_single_loader_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert single(["--seconds", "1", "--workers", "1", "--grow-to", "3"]) == 0
    out = capsys.readouterr().out
    assert "resize(3)" in out and "set_batch_size(48)" in out and "the throughput" in out
