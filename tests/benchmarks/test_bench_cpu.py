"""benchmarks/allocator/bench_cpu.py at a small size: the policies run side by side with CPUs,
the pooled same-cores bound beside them, the tables with ratios (median, interval, worst), the
reach and the Synergy validation print, the JSON and the plot are written (every job declaring
its length); bad arguments name the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.allocator import bench_cpu


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)  # 82 s in CI
def test_bench_cpu_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--workloads", "3", "--cores-per-gpu", "3", "--philly", "1",
        "--philly-cores-per-gpu", "3",
        "--policies", "goodput-dp,goodput-dp-cpu-blind,synergy,goodput-dp-lend",
        "--no-mix", "--seed", "5", "--processes", "2", "--jitter-seeds", "1",
        "--declared-lengths", "0",
    ]  # fmt: skip
    assert bench_cpu.main([*argv, "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_cpu.json").read_text())
    assert data["seed"] == 5 and data["declared_lengths"] == 0.0
    runs = {(r["workload"], r["policy"]): r for r in data["runs"]}
    arms = ("goodput-dp", "goodput-dp-cpu-blind", "synergy", "goodput-dp-lend", "goodput-dp@pooled")
    for policy in arms:
        for label in ("pollux-3", "philly-5"):
            r = runs[label, policy]
            assert r["jobs_completed"] == r["jobs"] == 160
            assert 0 < r["cpu_utilisation"] <= 1
            assert r["jitter"] == 0
    assert set(data["ratios"]["Pollux workloads, 3 cores/GPU"]) == {
        "goodput-dp-cpu-blind",
        "synergy",
        "goodput-dp-lend",
        "goodput-dp@pooled",  # how far from the bound
    }
    reach = data["reach"]["Pollux workloads, 3 cores/GPU"]
    assert set(reach) == {"goodput-dp", "goodput-dp-lend"}  # the CPU-aware arms
    for r in reach.values():
        assert 0 < r["headroom"] < 1  # the pooled cores feed more than each node's own
    assert (tmp_path / "bench_cpu.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "seeds 5..5" in out and "95% interval" in out
    assert "goodput-dp's reach from goodput-dp-cpu-blind to the pooled bound" in out
    assert "goodput-dp-lend's reach" in out


def test_bad_arguments_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in (
        (["--workloads", "9"], "--workloads='9'"),
        (["--cores-per-gpu", "0"], "--cores-per-gpu='0'"),
        (["--policies", "pollux"], "goodput-dp first"),
        (["--jitter-seeds", "0"], "--jitter-seeds=0"),
        (["--jitter-s", "-1"], "--jitter-s=-1"),
        (["--declared-lengths", "9"], "--declared-lengths=9.0"),
    ):
        with pytest.raises(SystemExit):
            bench_cpu.main(argv)
        assert says in capsys.readouterr().err
