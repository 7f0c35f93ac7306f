"""benchmarks/sidecar/bench_sidecar.py on the real-pipeline mix at a small size (200 JPEGs, runs of
seconds): every run completes, the table, summary and plot are written, and each job of the mix
moved samples in each run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.sidecar import bench_sidecar, generated
from benchmarks.sidecar.records import state_file
from dloader._shared.node_messages import JobLimits
from dloader.apps.scenarios import NodeMix, ScenarioJob
from dloader.sidecar.node_policy import PolicyEvent
from dloader.sidecar.store import SidecarStore, StoredJob


def sidecar_run(
    folder: Path,
    jobs: list[tuple[str, str, float]],
    events: list[tuple[float, str, str, int, float | None]],
) -> Path:
    """The state file a sidecar run in ``folder`` leaves: ``jobs`` (id, name, registered at)
    and the policy's ``events`` (at, kind, job id, workers, samples/s), through the store."""
    path = state_file(folder)
    path.parent.mkdir(parents=True)
    store = SidecarStore(path)
    for job_id, name, at in jobs:
        store.add_job(StoredJob(job_id, name, "t", JobLimits(), [1], [], 4, 32, at))
    for at, kind, job_id, workers, rate in events:
        store.add_events([PolicyEvent(kind, job_id, workers, rate)], at=at)
    store.close()
    return folder


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)  # a static search of 5 runs
def test_bench_sidecar_real_mix_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "real", "--quick", "--jpegs", "200", "--out-dir", str(tmp_path)]
    argv += ["--seconds", "14", "--window", "6", "--static-seconds", "6", "--search-runs", "5"]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_real.json").read_text())
    names = [row[0] for row in data["rows"]]
    assert names[:4] == [
        "no sidecar (4 each)", bench_sidecar.AUTO, "even, budget 12", "adaptive, budget 12"
    ]  # fmt: skip
    assert names[4].startswith("static best of ") and ", budget 12: " in names[4]
    split = names[4].rsplit(": ", 1)[1]  # the searched split is run again, then the sidecar
    assert names[5:] == [f"static {split} again (1), budget 12", "adaptive again (1), budget 12"]
    for name, total, per in data["rows"]:
        assert set(per) == {"image_jpeg", "text_pack", "remote_read"}, name
        assert all(p["samples_per_s"] > 0 for p in per.values()), (name, per)
        assert 0 < total <= 3.3, (name, total)
    summary = data["summary"]["12"]
    assert set(summary["prediction_error"]) == {"image_jpeg", "text_pack", "remote_read"}
    assert summary["adaptive_vs_even_same_budget"] > 0
    assert summary["adaptive_vs_auto"] == pytest.approx(data["rows"][3][1] / data["rows"][1][1])
    assert len(summary["static_again"]) == len(summary["adaptive_again"]) == 1
    adaptive = (data["rows"][3][1] + data["rows"][6][1]) / 2
    assert summary["adaptive_vs_static_again"] == pytest.approx(adaptive / data["rows"][5][1])
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
@pytest.mark.timeout(900)  # 4 arms, a static search of 3 runs, and 3 per phase
def test_bench_sidecar_dynamic_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "dynamic", "--quick", "--phase", "3", "--phase-oracle", "--search-runs", "3"]
    argv += ["--out-dir", str(tmp_path)]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_dynamic.json").read_text())
    assert {"no sidecar (4 each)", bench_sidecar.AUTO, "even", "adaptive"} <= set(data["scores"])
    assert data["summary"]["adaptive_vs_auto"] > 0 and data["summary"]["adaptive_12_vs_auto"] > 0
    assert bench_sidecar.DEFAULT in data["scores"] and data["summary"]["default_budget"] >= 12
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
    """The error compares the measured rate with the last prediction recorded for the count
    the job ran in the scored window, not with the last prediction recorded: as the other jobs
    leave at the end, the sidecar gives the last one more workers (a real run's, shortened)."""
    run = sidecar_run(
        tmp_path,
        [("d79961", "remote_read", 0.0), ("4d0d7a", "text_pack", 0.0)],
        [
            (1.0, "directed", "d79961", 8, 742.0),
            (2.0, "directed", "d79961", 9, 698.0),
            (2.0, "directed", "4d0d7a", 2, 1582.0),
            (2.0, "expected", "4d0d7a", 2, 1500.0),  # an expectation, not a directive
            (9.0, "directed", "d79961", 12, 868.0),
            (9.0, "directed", "4d0d7a", 3, None),  # exploring: no prediction
        ],
    )
    per = {
        "remote_read": {"workers": 9, "samples_per_s": 717.0},
        "text_pack": {"workers": 2, "samples_per_s": 1768.0},
        "image_jpeg": {"workers": 1, "samples_per_s": 416.0},  # no prediction logged
    }
    errors = bench_sidecar.prediction_errors(run, per)
    assert errors["remote_read"] == pytest.approx(1 - 698 / 717)
    assert errors["text_pack"] == pytest.approx(1 - 1582 / 1768)
    assert errors["image_jpeg"] is None


# ---------------------------------------------------------------- --generated N


def _job(started: float, limit: float, steps: list[tuple[float, int, int]]) -> dict[str, Any]:
    return {"started": started, "limit": limit, "timeline": [[t, n, 0.0, k] for t, n, k in steps]}


def test_block_scores_align_jobs_in_scenario_time() -> None:
    """``a`` from 0 s, ``b`` arriving at 5 s (its own clock starts there): blocks of 5 s."""
    a = ScenarioJob("a", "io_heavy", 1, 0.0, 10.0)
    b = ScenarioJob("b", "io_heavy", 1, 5.0, 10.0)
    mix = NodeMix(0, 0, 10.0, (a, b))
    results = {
        "a": _job(100.0, 10.0, [(1.0, 50, 1), (6.0, 50, 1)]),
        "b": _job(105.0, 5.0, [(1.0, 25, 1), (9.0, 99, 1)]),  # 9 s in: past the scenario
    }
    assert generated.block_scores(results, mix, block=5.0) == pytest.approx([1.0, 2.0])


def test_the_report_gives_the_adaptive_arm_of_a_guided_run_its_own_ratios() -> None:
    """A guided run's mixes carry the adaptive arm's ratios too: the summary gives their median
    and worst; a mix from an older part (no such ratios) is left out of them, not an error."""

    def mix(name: str, sidecar: float, adaptive: float | None) -> dict[str, Any]:
        r = {"whole": (sidecar, sidecar - 0.1, sidecar + 0.1)}
        r["steady"] = r["whole"]
        a = {"whole": (adaptive, 0.0, 2.0), "steady": (adaptive, 0.0, 2.0)}
        return {
            "mix": name, "dynamic": False, "changes": False, "jobs": 2, "static_split": {},
            "prediction_error": {}, "first_s": [], "placed_s": [],
            "ratios": {"auto": r},
            **({"adaptive_ratios": {"auto": a}} if adaptive is not None else {}),
        }  # fmt: skip

    out = generated.report([mix("s/0", 0.9, 1.2), mix("s/1", 0.95, 0.98), mix("s/2", 1.0, None)])
    assert "sidecar / auto (steady): median 0.950, worst 0.900 (n=3)" in out
    # each of those intervals reaches 0.98; one that lies wholly below it is counted
    assert "0 of 3 below 0.98 beyond their interval" in out
    low = generated.report([mix("s/0", 0.85, None), mix("s/1", 0.95, None)])
    assert "sidecar / auto (whole): median 0.900, worst 0.850 (n=2); 1 of 2 below 0.98" in low
    assert "adaptive sidecar / auto (steady): median 1.090, worst 0.980 (n=2)" in out
    assert "adaptive sidecar / naive" not in out
    assert "adaptive sidecar" not in generated.report([mix("s/2", 1.0, None)])
    assert "mixes with room" not in out  # older results: no room, no such lines
    roomy = [{**mix("s/0", 1.1, None), "room": 1.2}, {**mix("s/1", 0.99, None), "room": 1.0}]
    roomy.append({**mix("s/2", 1.01, None), "room": 1.0})
    out = generated.report(roomy)
    assert "mixes with room >= 1.05: sidecar / auto (steady): median 1.100" in out
    assert "mixes with room < 1.05: sidecar / auto (steady): median 1.000, worst 0.990 (n=2)" in out


def test_held_split_and_the_cut_to_a_budget() -> None:
    results = {
        "a": _job(0.0, 1.0, [(1.0, 1, 4), (2.0, 1, 9), (3.0, 1, 9)]),
        "b": _job(0.0, 1.0, [(1.0, 1, 2)]),
    }
    assert generated.held_split(results) == {"a": 9, "b": 2}
    jobs = tuple(ScenarioJob(name, "io_heavy", 1, 0, 30.0) for name in "ab")
    mix = NodeMix(0, 0, 30.0, jobs)
    assert generated.within_budget({"a": 9, "b": 2}, mix, 8) == {"a": 6, "b": 2}


def test_the_steady_part_leaves_out_the_blocks_after_each_event() -> None:
    """Events at 0 (start), 40 (an arrival), 60 (a cost change), 90 (a departure): with 20 s
    to settle, the 5-s blocks from 20, 80 and 110 s on are steady (the change at 60 leaves
    blocks 60-75 unsettled; 90 leaves 90-105)."""
    a = ScenarioJob("a", "io_heavy", 1, 0.0, 90.0, change_at=60.0, change_factor=2.0)
    b = ScenarioJob("b", "io_heavy", 1, 40.0, 120.0)
    mix = NodeMix(0, 0, 120.0, (a, b))
    assert mix.events() == [0.0, 40.0, 60.0, 90.0]
    steady = generated.steady_blocks(mix, 24, 20.0)
    starts = [5 * i for i in range(24) if steady[i]]
    assert starts == [20, 25, 30, 35, 80, 85, 110, 115]


def test_the_count_auto_settled_on_is_the_one_held_most_in_the_second_half() -> None:
    # 2 workers for the first 6 s (exploring), then 5, with a 1-s probe at 6
    steps = [(float(t), 1, 2 if t < 6 else 6 if t == 6 else 5) for t in range(10)]
    assert generated.settled_count(_job(0.0, 1.0, steps)) == 5
    with pytest.raises(RuntimeError, match="ran no step"):
        generated.settled_count(_job(0.0, 1.0, []))


def test_the_ratio_interval_holds_the_ratio_and_narrows_with_agreeing_blocks() -> None:
    rng = np.random.default_rng(0)
    a = np.array([[1.0, 1.1, 0.9, 1.0], [1.0, 1.1, 0.9, 1.0]])
    b = a * 0.8  # every block, every run: the ratio is certain
    v, lo, hi = generated.ratio_ci(a, b, rng, n=500)
    assert v == pytest.approx(1.25) and lo == pytest.approx(1.25) and hi == pytest.approx(1.25)
    noisy = b * np.array([[1.3, 0.7, 1.2, 0.8], [0.9, 1.1, 1.0, 1.0]])
    v, lo, hi = generated.ratio_ci(a, noisy, rng, n=500)
    assert lo < v < hi and hi - lo > 0.1


def test_the_records_give_placements_and_each_splits_expectations(tmp_path: Path) -> None:
    """A shortened real run: j1 placed by its model 0.8 s after registering, j2 directed by
    its exploration first (0.5 s) and placed later; each change of the split records every
    job's expectation; each is compared with what the job measured from 2 s after the change to
    the next."""
    t = 1_790_000_000.0
    run = sidecar_run(
        tmp_path,
        [("aaa", "j1", t), ("bbb", "j2", t)],
        [
            (t + 0.5, "directed", "bbb", 4, None),
            (t + 0.8, "placed", "aaa", 4, None),
            (t + 1.0, "expected", "aaa", 4, 100.0),
            (t + 1.0, "expected", "bbb", 4, 50.0),
            (t + 2.1, "placed", "bbb", 2, None),
            (t + 2.1, "directed", "bbb", 2, 40.0),
            (t + 7.0, "expected", "aaa", 4, 120.0),
            (t + 7.0, "expected", "bbb", 2, 40.0),
        ],
    )
    parsed = generated.read_run(run)
    assert parsed["first"] == pytest.approx({"j1": 0.8, "j2": 0.5})
    assert parsed["placed"] == pytest.approx({"j1": 0.8, "j2": 2.1})
    # from each job's first batch: j1's came 0.3 s after it registered, j2's 0.2 s before
    batches = {"j1": _job(t - 1.0, 100.0, [(1.3, 8, 4)]), "j2": _job(t, 50.0, [(-0.2, 8, 4)])}
    assert sorted(generated.after_first_batch(parsed["first_at"], batches)) == pytest.approx(
        [0.5, 0.7]
    )
    t0 = parsed["expects"][0][0]
    assert [v for _, v in parsed["expects"]] == [{"j1": 100, "j2": 50}, {"j1": 120, "j2": 40}]
    # j1 measured 80/s from 2 s to 6 s (predicted 100: 25% off), then 120/s from 8 s to the
    # last step of its timeline (12.9 s: 120/s, 0% off): the median of the two
    j1 = _job(t0, 500.0, [(2.0 + i / 10, 8, 4) for i in range(40)])
    j1["timeline"] += [[8.0 + i / 10, 12, 0.0, 4] for i in range(50)]
    errors = generated.prediction_errors(parsed["expects"], {"j1": j1})
    assert errors["j1"] == pytest.approx((0.25 + 0.0) / 2)


def test_bad_generated_arguments_stop_the_benchmark_before_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv, expected in (
        (["--generated", "0"], "--generated 0: expected at least 1 mix"),
        (["--generated", "2", "--length", "5"], "--length 5: expected seconds within"),
        (["--generated", "2", "--repeats", "0"], "--repeats 0: expected at least 1"),
        (["--generated", "2", "--alone-s", "5"], "--alone-s 5: expected 0 (no alone arm)"),
        (["--generated", "2", "--only", "0,2"], "--only 0,2: expected indices within [0, 2)"),
        (["--generated", "2", "--only", "x"], "--only 'x': expected mix indices"),
        (["--generated", "2", "--settle", "200"], "--settle 200: expected seconds within"),
        (["--generated", "2", "--ablation", "cache"], "--ablation cache: expected groups of"),
    ):
        with pytest.raises(SystemExit):
            bench_sidecar.main(argv)
        assert expected in capsys.readouterr().err


@pytest.mark.integration
def test_bench_sidecar_rooms_runs_nothing_but_the_cost_measurement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--generated", "3", "--gen-seed", "7", "--rooms", "--jpegs", "200"]
    assert bench_sidecar.main([*argv, "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_sidecar_rooms_general.json").read_text())
    assert data["seed"] == 7 and len(data["rooms"]) == 3 and min(data["rooms"]) >= 1.0
    assert (tmp_path / "bench_sidecar_rooms_general.png").stat().st_size > 0
    out, err = capsys.readouterr()
    assert "| 7/0 " in out and "3 general mixes of seed 7 on" in out and "nothing to divide" in out
    assert "run 1" not in out + err  # no job ran


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_bench_sidecar_generated_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One drawn mix of 12 s: the sidecar, naive, "auto", each job alone (10 s) then together
    at those counts, a static search of 2 runs and its fresh rerun; the table, the summary
    lines, the JSON and the plot; then the part combined."""
    argv = ["--generated", "1", "--gen-seed", "7", "--length", "12", "--repeats", "1"]
    argv += ["--static-runs", "2", "--alone-s", "10", "--settle", "5", "--jpegs", "200"]
    assert bench_sidecar.main([*argv, "--out-dir", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench_sidecar_generated.json").read_text())
    assert data["seed"] == 7 and len(data["mixes"]) == 1
    (mix,) = data["mixes"]
    runs = {arm: len(v) for arm, v in mix["scores"].items()}
    assert runs == {"sidecar": 1, "naive": 1, "auto": 1, "alone": 1, "ceiling": 1}
    assert mix["static_runs"] <= 2 and set(mix["alone_split"]) == set(mix["static_split"])
    assert all(s > 0 for kind in mix["scores"].values() for s in kind)
    assert set(mix["ratios"]) == {"naive", "auto", "alone", "ceiling"}
    for arm, parts in mix["ratios"].items():
        assert set(parts) == {"whole", "steady"}
        for v, lo, hi in parts.values():
            assert lo <= v <= hi, (arm, parts)
    assert mix["first_s"], "no job was placed by the sidecar"
    assert mix["room"] >= 1.0 and set(data["cpu_ms_here"]) <= {
        "image_jpeg",
        "text_pack",
        "remote_read",
    }
    assert (tmp_path / "bench_sidecar_generated.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "seed 7 (reproduce: --generated 1 --gen-seed 7 --length 12)" in out
    assert "sidecar / auto (steady): median" in out and "(target: median >= 1.05" in out
    assert "first placement after registering" in out
    assert "first placement after the job's first batch" in out and mix["first_batch_s"]
    combined = tmp_path / "combined"
    part = tmp_path / "bench_sidecar_generated.json"
    assert bench_sidecar.main(["--combine", str(part), "--out-dir", str(combined)]) == 0
    assert json.loads((combined / "bench_sidecar_generated.json").read_text())["mixes"] == [mix]
    assert "sidecar / auto (steady): median" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_bench_sidecar_contention_ablation_small(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One contention mix of 12 s, the sidecar guided, with the ablation's arms: each job
    "auto" with its workers niced by hand, the sidecar without trainers first, and the sidecar
    adaptive."""
    argv = ["--generated", "1", "--contention", "--ablation", "--gen-seed", "7", "--length", "12"]
    argv += ["--repeats", "1", "--static-runs", "0", "--alone-s", "0", "--settle", "5"]
    argv += ["--policy", "guided", "--jpegs", "200", "--out-dir", str(tmp_path)]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_generated_contention_guided.json").read_text())
    (mix,) = data["mixes"]
    assert data["contention"] and mix["contention"] and "host_heavy" in mix["describe"]
    arms = {"naive", "auto", "auto_nice", "sidecar_nice0", "adaptive"}
    assert set(mix["scores"]) == {"sidecar", *arms} and mix["policy"] == "guided"
    assert all(s > 0 for kind in mix["scores"].values() for s in kind)
    assert set(mix["ratios"]) == arms
    out = capsys.readouterr().out
    assert "--contention --ablation nice,spares --policy guided" in out
    assert "sidecar / auto_nice (steady): median" in out
    assert "sidecar / adaptive (steady): median" in out
    # the adaptive arm against the others as well, from the same runs
    assert set(mix["adaptive_ratios"]) == arms - {"adaptive"}
    assert "adaptive sidecar / auto (steady): median" in out
