"""benchmarks/allocator/bench_pollux.py at a small size: both policies run in the same simulator,
the side-by-side table, the validation table (oracle rows), the JSON and the plot are written; bad
arguments name the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.allocator import bench_pollux


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)  # 78 s in CI
def test_bench_pollux_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workloads", "1", "--loads", "1", "--generations", "2", "--processes", "1"]
    assert bench_pollux.main([*argv, "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_pollux.json").read_text())
    run = data["summary"]["workload-1/load-1"]
    for policy in ("goodput-dp", "pollux"):
        assert run[policy]["policy"] == policy
        assert run[policy]["jobs_completed"] == run[policy]["jobs"] == 160
    assert (tmp_path / "bench_pollux.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "avg ratio" in out and "Pollux published h" in out and "machine:" in out


def test_bad_arguments_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_pollux.main(["--workloads", "one"])
    assert "--workloads='one'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_pollux.main(["--workloads", "7"])
    assert "workloads are 1-4" in capsys.readouterr().err
