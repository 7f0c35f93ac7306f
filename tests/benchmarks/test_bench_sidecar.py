"""benchmarks/bench_sidecar.py on the real-pipeline mix at a small size (200 JPEGs, runs of
seconds): every run completes, the table, summary and plot are written, and each job of the mix
moved samples in each run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_sidecar


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


@pytest.mark.parametrize("budget", [11, 10])
def test_coordinate_search_finds_the_best_allowed_split(budget: int) -> None:
    """On a separable score peaking at io=8, cpu=2, gpu=1, the search from the even split finds
    a best split within the budget (at 10 workers: io 7 or cpu 1, off the ladder or below the
    peak, which only a transfer of workers between jobs reaches), evaluating each split once."""
    peak = {"io": 8, "cpu": 2, "gpu": 1}
    calls: list[tuple[tuple[str, int], ...]] = []

    def evaluate(split: dict[str, int]) -> float:
        calls.append(tuple(sorted(split.items())))
        return -float(sum((split[j] - peak[j]) ** 2 for j in peak))

    best, split = bench_sidecar.coordinate_search(
        evaluate, {"io": 3, "cpu": 3, "gpu": 3}, lambda s: sum(s.values()) <= budget
    )
    optimum = -float(max(sum(peak.values()) - budget, 0))  # one worker short costs 1
    assert best == optimum == evaluate(split) and sum(split.values()) <= budget
    assert len(calls[:-1]) == len(set(calls[:-1]))  # each split once


def test_coordinate_search_starts_from_a_better_seed() -> None:
    """Two peaks: a local search from one worker on a ladder that stops at 3 climbs the near
    one (io 2, score -1); seeded with the far one (io 9, score 0, off its ladder), it keeps
    that."""

    def evaluate(split: dict[str, int]) -> float:
        io = split["io"]
        return -float(min(abs(io - 9), 1 + abs(io - 2)))

    ladder = (1, 2, 3)
    near, _ = bench_sidecar.coordinate_search(evaluate, {"io": 1}, lambda s: True, ladder, 3)
    far, split = bench_sidecar.coordinate_search(
        evaluate, {"io": 1}, lambda s: True, ladder, 3, seeds=[{"io": 9}]
    )
    assert near == -1.0 and far == 0.0 and split == {"io": 9}


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


def test_seed_splits_are_parsed_or_refused_by_name() -> None:
    jobs = ("image_jpeg", "text_pack", "remote_read")
    assert bench_sidecar.parse_split("1/1/17", jobs) == dict(zip(jobs, (1, 1, 17), strict=True))
    for bad in ("1/1", "1/x/17", "0/1/17", ""):
        with pytest.raises(ValueError, match="image_jpeg/text_pack/remote_read"):
            bench_sidecar.parse_split(bad, jobs)
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
