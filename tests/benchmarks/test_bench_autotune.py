"""benchmarks/loader/bench_autotune.py at a small size: every run completes, the tables, JSON and
plot are written, and the auto runs and the pair's static search produced what the note reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.loader import bench_autotune


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)  # about 100 s of timed runs, plus each run's process start-up
def test_bench_autotune_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--profiles", "gpu_bound", "--pairs", "gpu_bound+io_heavy", "--counts", "1,4"]
    argv += ["--fixed-seconds", "5", "--auto-seconds", "10", "--warmup", "1", "--repeats", "1"]
    argv += ["--out-dir", str(tmp_path)]
    assert bench_autotune.main(argv) == 0
    data = json.loads((tmp_path / "bench_autotune.json").read_text())
    assert set(data["alone"]) == {"gpu_bound"}  # io_heavy is in the pair only: one sweep
    for name, r in data["alone"].items():
        assert set(r["fixed"]) == {"1", "4"}, name
        assert r["auto"] > 0 and r["ratio"] > 0, (name, r)
        assert len(r["best_again_runs"]) == 1 and len(r["auto_runs"]) == 2, (name, r)
        assert r["ratio_again"] == pytest.approx(r["auto_runs"][1] / r["best_again"])
        assert r["tuner"].startswith("auto: "), r["tuner"]
        assert r["search_s"] is None or 0 < r["search_s"] <= 10, r["search_s"]
    pair = data["pairs"]["gpu_bound+io_heavy"]
    assert pair["splits_tried"] >= 2 and pair["static_score"] > 0 and pair["auto"] > 0
    assert pair["start"][0] == data["alone"]["gpu_bound"]["best_count"]
    assert pair["start"][1] in (1, 4)
    assert len(pair["auto_runs"]) == 1 and len(pair["static_again_runs"]) == 1
    assert pair["ratio_again"] == pytest.approx(pair["auto"] / pair["static_again"])
    assert (tmp_path / "bench_autotune.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "auto/best again" in out and "auto/static again" in out and "machine:" in out
    assert "search s" in out


def test_bad_arguments_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_autotune.main(["--profiles", "nope"])
    assert "profile 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_autotune.main(["--counts", "0,2"])
    assert "counts must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_autotune.main(["--profiles", "", "--pairs", ""])
    assert "nothing to run" in capsys.readouterr().err
