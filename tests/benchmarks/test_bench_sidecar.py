"""benchmarks/sidecar/bench_sidecar.py on the real-pipeline mix at a small size (200 JPEGs, runs of
seconds): every run completes, the table, summary and plot are written, and each job of the mix
moved samples in each run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sidecar import bench_sidecar


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)  # a static search of ~15 runs
def test_bench_sidecar_real_mix_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "real", "--quick", "--jpegs", "200", "--out-dir", str(tmp_path)]
    argv += ["--seconds", "14", "--window", "6", "--static-seconds", "6"]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_real.json").read_text())
    names = [row[0] for row in data["rows"]]
    assert names[:3] == ["no sidecar (4 each)", "even, budget 12", "adaptive, budget 12"]
    assert names[3].startswith("static best of ") and ", budget 12: " in names[3]
    split = names[3].rsplit(": ", 1)[1]  # the searched split is run again, then the sidecar
    assert names[4:] == [f"static {split} again (1), budget 12", "adaptive again (1), budget 12"]
    for name, total, per in data["rows"]:
        assert set(per) == {"image_jpeg", "text_pack", "remote_read"}, name
        assert all(p["samples_per_s"] > 0 for p in per.values()), (name, per)
        assert 0 < total <= 3.3, (name, total)
    summary = data["summary"]["12"]
    assert set(summary["prediction_error"]) == {"image_jpeg", "text_pack", "remote_read"}
    assert summary["adaptive_vs_even_same_budget"] > 0
    assert len(summary["static_again"]) == len(summary["adaptive_again"]) == 1
    adaptive = (data["rows"][2][1] + data["rows"][5][1]) / 2
    assert summary["adaptive_vs_static_again"] == pytest.approx(adaptive / data["rows"][4][1])
    assert (tmp_path / "bench_sidecar_real.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "adaptive / the better of" in out and "machine:" in out


def test_phase_scores_split_a_scenario_by_its_jobs_start() -> None:
    """Two jobs of limit 10: ``a`` from 0 s, 10 samples a second; ``b`` from 2 s on (its own
    clock starts there), 20 a second; phases of 2 s: a alone, then both."""
    a = {"started": 100.0, "limit": 10.0, "timeline": [[t + 0.5, 10, 0.0, 1] for t in range(4)]}
    b = {"started": 102.0, "limit": 10.0, "timeline": [[t + 0.5, 20, 0.0, 1] for t in range(2)]}
    assert bench_sidecar.phase_scores({"a": a, "b": b}, 2.0, phases=2) == pytest.approx([1.0, 3.0])


def test_phase_split_is_the_count_each_job_held_longest_in_the_phase() -> None:
    """``a`` runs 3 workers for 1 s then 5 for 3 s (phase 2 s: 3 and 5 tie for 1 s each in
    the first, the first seen wins); ``b`` starts at 2 s with 2 workers."""
    a = {"started": 0.0, "timeline": [[t + 0.5, 1, 0.0, 3 if t < 1 else 5] for t in range(4)]}
    b = {"started": 2.0, "timeline": [[t + 0.5, 1, 0.0, 2] for t in range(2)]}
    assert bench_sidecar.phase_split({"a": a, "b": b}, 2.0, 0) == {"a": 3}
    assert bench_sidecar.phase_split({"a": a, "b": b}, 2.0, 1) == {"a": 5, "b": 2}


def test_a_bad_seed_split_stops_the_benchmark_before_it_runs() -> None:
    with pytest.raises(SystemExit):
        bench_sidecar.main(["--mix", "real", "--seed", "1/1"])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1200)  # a static search of ~15 whole-scenario runs, one per phase
def test_bench_sidecar_dynamic_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "dynamic", "--quick", "--phase", "3", "--phase-oracle"]
    argv += ["--out-dir", str(tmp_path)]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_dynamic.json").read_text())
    assert {"no sidecar (4 each)", "even", "adaptive"} <= set(data["scores"])
    static = [n for n in data["scores"] if n.startswith("static best of ")]
    assert len(static) == 1
    for name, s in data["scores"].items():
        assert set(s["per"]) == {"io_a", "cpu_heavy", "gpu_bound", "io_b"}, name
        assert all(v > 0 for v in s["per"].values()), (name, s)
    k = data["summary"]["static_best"]
    assert (
        max(k["io_a"] + k["cpu_heavy"] + k["gpu_bound"], k["io_a"] + k["gpu_bound"] + k["io_b"])
        <= 12
    )
    searches = data["summary"]["phase_searches"]
    assert [set(x["split"]) for x in searches] == [
        {"io_a", "cpu_heavy", "gpu_bound"},
        {"io_a", "gpu_bound", "io_b"},
        {"io_a", "gpu_bound", "io_b"},
    ]
    assert all(sum(x["split"].values()) <= 12 and x["score"] > 0 for x in searches)
    assert (tmp_path / "bench_sidecar_dynamic.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "adaptive / the best static split" in out
    assert "each phase's own best split, switched to at once" in out


def test_prediction_error_is_for_the_count_the_scored_window_ran(tmp_path: Path) -> None:
    """The error compares the measured rate with the last prediction logged for the count the
    job ran in the scored window, not with the last prediction logged: as the other jobs leave
    at the end, the sidecar gives the last one more workers (a real run's log, shortened)."""
    core = "INFO dloader.sidecar.core: job"
    log = tmp_path / "sidecar.log"
    log.write_text(
        f"{core} d79961 (remote_read) registered: pids [19502], 4 workers\n"
        f"{core} 4d0d7a (text_pack) registered: pids [19501], 4 workers\n"
        f"{core} d79961: 8 workers (8 workers: predicted 742 samples/s) [model: 742 samples/s]\n"
        f"{core} d79961: 9 workers (probing (4d0d7a=2, d79961=9)) [model: 698 samples/s]\n"
        f"{core} 4d0d7a: 2 workers (2 workers: node sum 1.803) [model: 1,582 samples/s]\n"
        f"{core} 4d0d7a (text_pack) deregistered\n"
        f"{core} d79961: 12 workers (12 workers: predicted 868 samples/s) [model: 868 samples/s]\n"
    )
    per = {
        "remote_read": {"workers": 9, "samples_per_s": 717.0},
        "text_pack": {"workers": 2, "samples_per_s": 1768.0},
        "image_jpeg": {"workers": 1, "samples_per_s": 416.0},  # no prediction logged
    }
    errors = bench_sidecar.prediction_errors(log, per)
    assert errors["remote_read"] == pytest.approx(1 - 698 / 717)
    assert errors["text_pack"] == pytest.approx(1 - 1582 / 1768)
    assert errors["image_jpeg"] is None
