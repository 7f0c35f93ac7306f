"""benchmarks/allocator/bench_synergy.py: the window's mean JCT is over the jobs it names, and a
small run (one load, two draws, the FIFO arms) writes its table, JSON and plot with each
ratio the two arms' window JCTs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.allocator import bench_synergy
from dloader.allocator.simulator import SimJobResult


def _job(name: str, jct: float | None) -> SimJobResult:
    return SimJobResult(name, "ncf", 0.0, 0.0, jct, jct, 0, 0, 0.0, 1, 64)


def test_window_jct_counts_the_jobs_by_arrival_index() -> None:
    jobs = [_job("ncf-9", 100.0), _job("bert-10", 10.0), _job("ncf-11", 20.0), _job("a-12", 1e9)]
    assert bench_synergy.window_jct(jobs, (10, 12)) == pytest.approx(15.0)
    assert math.isnan(bench_synergy.window_jct([*jobs, _job("x-10", None)], (10, 12)))
    assert math.isnan(bench_synergy.window_jct(jobs, (20, 30)))


@pytest.mark.parametrize(
    "bad", [["--window", "30:50", "--jobs", "40"], ["--loads", "0"], ["--orders", "srtf"]]
)
def test_bad_arguments_are_named(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bench_synergy.main(bad)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--window 30:50" in err or "--loads" in err


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_bench_synergy_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--loads", "9", "--jobs", "40", "--window", "10:30", "--seeds", "2", "--seed", "3",
        "--orders", "fifo", "--processes", "1", "--out-dir", str(tmp_path),
    ]  # fmt: skip
    assert bench_synergy.main(argv) == 0
    data = json.loads((tmp_path / "bench_synergy.json").read_text())
    assert set(data["runs"]) == {
        f"9/{s}/{arm}" for s in (3, 4) for arm in ("synergy-fifo", "synergy-fifo-proportional")
    }
    (row,) = data["results"]
    for k, s in enumerate((3, 4)):
        tune = data["runs"][f"9/{s}/synergy-fifo"]["window_jct_s"]
        fair = data["runs"][f"9/{s}/synergy-fifo-proportional"]["window_jct_s"]
        assert row["ratio"][k] == pytest.approx(fair / tune)
        assert row["tune_h"][k] == pytest.approx(tune / 3600)
    assert (tmp_path / "bench_synergy.png").stat().st_size > 0
    assert "Synergy-TUNE against GPU-proportional cores" in capsys.readouterr().out


def test_queue_jct_is_first_come_first_served_on_the_gpus() -> None:
    # Two GPUs: the third job waits for the first to end at 5 s; the fourth finds one free.
    jct = bench_synergy.queue_jct(np.array([0.0, 0.0, 0.0, 10.0]), np.array([5, 10, 3, 1.0]), 2)
    assert jct.tolist() == [5.0, 10.0, 8.0, 1.0]


@pytest.mark.timeout(300)
def test_the_twins_fifo_arms_are_the_queue_they_reduce_to() -> None:
    """Fidelity: on one-GPU jobs the twin's FIFO with GPU-proportional cores is the pure
    first-come, first-served queue of the jobs' lengths (up to its 300-s rounds), and FIFO-TUNE
    is bounded below by the queue with every job at its profile's ideal speed-up and reaches
    it but for the cores a node cannot give all its jobs."""
    window = (40, 120)
    work = bench_synergy.draw(9.0, 11, 150, False)
    ref = bench_synergy.queue_reference(work, window)
    assert 0.8 < ref["ideal_load"] < ref["proportional_load"]
    got = {
        arm: bench_synergy.simulate(9.0, 11, arm, 150, window, False)[3]["window_jct_s"] / 3600
        for arm in ("synergy-fifo-proportional", "synergy-fifo")
    }
    assert got["synergy-fifo-proportional"] == pytest.approx(ref["proportional_queue_h"], rel=0.02)
    assert 0.99 * ref["ideal_queue_h"] <= got["synergy-fifo"] <= 1.05 * ref["ideal_queue_h"]
    assert got["synergy-fifo"] < 0.99 * got["synergy-fifo-proportional"]


@pytest.mark.integration
def test_queue_only_gives_each_draws_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--queue-only", "--jobs", "300", "--window", "100:200", "--seeds", "3", "--seed", "5",
            "--out-dir", str(tmp_path)]  # fmt: skip
    assert bench_synergy.main(argv) == 0
    data = json.loads((tmp_path / "bench_synergy.json").read_text())
    assert set(data["queue"]) == {"9/5", "9/6", "9/7"}
    work = bench_synergy.draw(9.0, 6, 300, False)
    assert data["queue"]["9/6"] == pytest.approx(bench_synergy.queue_reference(work, (100, 200)))
    assert "pure FIFO queue of each draw" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_synergy.main([*argv, "--multi-gpu"])
    assert "drop --multi-gpu" in capsys.readouterr().err
