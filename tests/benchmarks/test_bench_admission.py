"""benchmarks/allocator/bench_admission.py on one small Philly draw run twice (two jitter
seeds): both arms run every scenario, the ratios carry their interval, and the table, JSON and
plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.allocator import bench_admission


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_bench_admission_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--workloads", "", "--philly", "1", "--seed", "7", "--jobs", "20", "--jitter-seeds", "2",
        "--peers", "", "--processes", "1", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert bench_admission.main(argv) == 0
    data = json.loads((tmp_path / "bench_admission.json").read_text())
    assert {(r["jitter"], r["arm"]) for r in data["runs"]} == {
        (k, a) for k in (0, 1) for a in ("fifo", "las@900")
    }
    assert all(r["jobs_completed"] == r["jobs"] == 20 for r in data["runs"])
    ratio = data["ratios"]["las@900 / fifo: avg JCT"]
    lo, hi = ratio["interval"]
    assert lo <= ratio["median"] <= hi and ratio["worst"] > 0
    runs = {(r["jitter"], r["arm"]): r["avg_jct_s"] for r in data["runs"]}
    assert sorted(ratio["per_workload"]["philly-7"]) == sorted(
        runs[k, "las@900"] / runs[k, "fifo"] for k in (0, 1)
    )
    assert (tmp_path / "bench_admission.png").stat().st_size > 0
    assert "las@900 / fifo" in capsys.readouterr().out
