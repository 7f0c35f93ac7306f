"""benchmarks/sidecar/bench_makespan.py at a tenth of its size: both policies run every job to its
sample count under a real sidecar, and the table, JSON and plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sidecar import bench_makespan


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bench_makespan_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workload", "b", "--scale", "0.1", "--out-dir", str(tmp_path)]
    assert bench_makespan.main(argv) == 0
    data = json.loads((tmp_path / "bench_makespan.json").read_text())
    assert set(data["makespan"]) == {"b/even", "b/adaptive"}
    # the last job arrives at 2 s and trains 5,000 samples: no run can end sooner
    assert all(m > 2.0 for m in data["makespan"].values())
    assert data["ratio"]["b"] == pytest.approx(
        data["makespan"]["b/adaptive"] / data["makespan"]["b/even"]
    )
    assert (tmp_path / "bench_makespan.png").stat().st_size > 0
    assert "workload b: adaptive makespan / even" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "named"), [(["--scale", "0"], "--scale 0"), (["--budget", "2"], "--budget")]
)
def test_bench_makespan_names_bad_arguments(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        bench_makespan.main(argv)
    assert named in capsys.readouterr().err
