"""benchmarks/sidecar/bench_sidecar_overhead.py at a small size (2 jobs, 10 s): a real sidecar
serves them; the CPU shares, model updates and Report latency are measured and written, with a
plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sidecar import bench_sidecar_overhead as bench


def test_each_job_count_has_its_target() -> None:
    assert [bench.target(n) for n in (1, 10, 11, 50, 51)] == [0.02, 0.02, 0.05, 0.05, None]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bench_sidecar_overhead_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--jobs", "2", "--seconds", "10", "--latency-calls", "20", "--out-dir", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_overhead.json").read_text())
    assert data["jobs"] == 2
    assert set(data["cpu_share"]) == {
        "whole run",
        "first half (arrivals, exploration)",
        "second half (steady)",
    }
    assert all(0 < v < 1 for v in data["cpu_share"].values()), data["cpu_share"]
    assert data["model_updates"] > 0
    assert 0 < data["p50_ms"] <= data["p99_ms"]
    assert (tmp_path / "bench_sidecar_overhead.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "machine:" in out and "target: < 2% of one core at 2 jobs" in out
