"""dloader.apps.scenarios: mixes drawn from a seed are reproducible, varied and runnable."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest
import torch

from dloader.apps.scenarios import (
    HUNGRY_PROFILES,
    MIX_PROFILES,
    TRAINER_PROFILES,
    NodeMix,
    ScenarioJob,
    cost_split,
    division_room,
    draw_mixes,
)
from dloader.apps.testbed import PROFILES, Profile, cpu_per_sample_ms, main, run_job


def test_the_same_seed_draws_the_same_mixes_and_a_mix_does_not_depend_on_how_many() -> None:
    assert draw_mixes(3, 5) == draw_mixes(3, 5)
    assert draw_mixes(3, 8)[:5] == draw_mixes(3, 5)
    assert draw_mixes(3, 5) != draw_mixes(4, 5)


def test_forty_mixes_cover_what_the_generator_promises() -> None:
    mixes = draw_mixes(11, 40, length=30.0)
    sizes = {len(m.jobs) for m in mixes}
    assert sizes <= {2, 3, 4, 5} and len(sizes) >= 3
    assert {j.profile for m in mixes for j in m.jobs} == set(MIX_PROFILES)
    assert 0.3 <= sum(m.dynamic for m in mixes) / 40 <= 0.8
    assert any(m.changes for m in mixes) and not all(m.changes for m in mixes)
    for m in mixes:
        for j in m.jobs:
            assert 0 <= j.at < j.until <= m.length
            assert 0.5 <= j.step_scale <= 2.0 and j.workers in (1, 2, 4, 8)
            if PROFILES[j.profile].pipeline != "emulated":  # real data: only the step varies
                assert j.io_scale == j.cpu_scale == 1.0 and j.change_at is None
            if j.change_at is not None:
                assert j.at < j.change_at < j.until and j.change_factor in (0.5, 2.0)
        assert m.phases(), m  # someone always runs


def test_contention_mixes_put_trainers_that_need_a_core_among_cpu_bound_jobs() -> None:
    mixes = draw_mixes(11, 30, length=60.0, contention=True)
    assert mixes == draw_mixes(11, 30, length=60.0, contention=True)
    assert mixes[:3] != draw_mixes(11, 3, length=60.0)  # a stream of their own
    assert 0.15 <= sum(m.dynamic for m in mixes) / 30 <= 0.55
    for m in mixes:
        assert m.contention and "contention" in m.describe() and not m.changes
        trainers = [j for j in m.jobs if j.profile in TRAINER_PROFILES]
        hungry = [j for j in m.jobs if j.profile in HUNGRY_PROFILES]
        assert 1 <= len(trainers) <= 2 and 1 <= len(hungry) <= 3
        assert len(trainers) + len(hungry) == len(m.jobs)
        assert all(j.at == 0 for j in trainers) and m.phases()
        for j in trainers:
            assert j.costs.main_cpu_ms > 0 and "trainer" in j.describe()


def test_a_trainers_own_cpu_work_is_part_of_its_step_and_of_its_limit() -> None:
    p = Profile("t", 0.0, 0.0, 10, step_base_ms=1.0, step_per_sample_ms=0.0, main_cpu_ms=2.0)
    assert p.trainer_s(10) == pytest.approx(0.02) and p.step_s(10) == pytest.approx(0.001)
    assert p.limit() == pytest.approx(10 / 0.021)
    assert p.scaled(step=2.0).main_cpu_ms == 4.0  # the whole step scales
    # the training process spends that CPU (thread time, not a sleep) on every batch
    cpu0 = time.process_time()
    r = run_job([torch.zeros(10, 3)] * 5, p, max_steps=5)
    assert r.steps == 5 and time.process_time() - cpu0 >= 5 * 0.02


def test_phases_follow_arrivals_and_departures() -> None:
    a = ScenarioJob("a", "io_heavy", 4, 0.0, 30.0)
    b = ScenarioJob("b", "cpu_heavy", 2, 0.0, 20.0)
    c = ScenarioJob("c", "gpu_bound", 1, 10.0, 30.0)
    mix = NodeMix(0, 0, 30.0, (a, b, c))
    assert mix.dynamic
    assert mix.phases() == [("a", "b"), ("a", "b", "c"), ("a", "c")]
    assert mix.within({"a": 6, "b": 4, "c": 2}, 12)
    assert not mix.within({"a": 6, "b": 5, "c": 2}, 12)  # 13 while all three run
    assert mix.within({"a": 10, "b": 1, "c": 1}, 12)
    assert not mix.within({"a": 10, "b": 1, "c": 0}, 12)  # every job runs a worker


def test_a_job_runs_with_its_variation_on_the_testbeds_command_line() -> None:
    j = ScenarioJob("j1-io", "io_heavy", 4, 5.0, 30.0, 0.5, 2.0, 1.5, 15.0, 2.0)
    arrival = j.arrival(7)
    assert (arrival.workers, arrival.at, arrival.seconds, arrival.label) == (7, 5.0, 25.0, "j1-io")
    extra = list(arrival.extra)
    assert extra[extra.index("--io-scale") + 1] == "0.5"
    assert extra[extra.index("--step-scale") + 1] == "1.5"
    assert extra[extra.index("--slowdown-at") + 1] == "10"  # its own clock starts on arrival
    assert j.costs.limit() == pytest.approx(PROFILES["io_heavy"].limit() / 1.5)
    real = ScenarioJob("j2", "image_jpeg", 2, 0.0, 30.0, step_scale=2.0).arrival()
    assert "--io-scale" not in real.extra  # the testbed refuses it for real data


def test_the_cost_split_gives_io_bound_jobs_workers_and_cpu_bound_jobs_few() -> None:
    io = ScenarioJob("io", "io_heavy", 4, 0.0, 30.0)
    cpu = ScenarioJob("cpu", "cpu_heavy", 4, 0.0, 30.0)
    split = cost_split(NodeMix(0, 0, 30.0, (io, cpu)), cores=2.0, budget=16)
    assert split["io"] >= 8 and split["cpu"] <= 4 and sum(split.values()) <= 16
    for m in draw_mixes(5, 10):
        assert m.within(cost_split(m, 2.0, 12), 12)


def test_the_room_is_what_giving_cores_to_the_cheapest_limit_first_adds_to_an_even_split() -> None:
    """cpu_heavy needs 800/s x 3 ms = 2.4 cores for its limit. On 2 cores, jobs needing 1.2
    and 2.4: the best division gives the first its 1.2 and the second 0.8 (1 + 1/3); an even
    one gives each 1 (5/6 + 5/12)."""
    need = PROFILES["cpu_heavy"].limit() * 3.0 / 1000
    assert need == pytest.approx(2.4)
    half = ScenarioJob("a", "cpu_heavy", 1, 0.0, 30.0, cpu_scale=0.5)
    full = ScenarioJob("b", "cpu_heavy", 1, 0.0, 30.0)
    assert division_room(NodeMix(0, 0, 30.0, (half, full)), 2.0) == pytest.approx(
        (1 + 0.8 / 2.4) / (1 / 1.2 + 1 / 2.4)
    )
    # needs that fit the cores, or the same worth per core: nothing to divide
    assert division_room(NodeMix(0, 0, 30.0, (half, full)), 4.0) == pytest.approx(1.0)
    assert division_room(NodeMix(0, 0, 30.0, (full, replace(full, label="c"))), 2.0) == 1.0
    # the second job at half the cost from half-way: the room is the first half's, halved
    changed = replace(full, change_at=15.0, change_factor=0.5)
    first = (1 + 0.8 / 2.4) * 15 + (1 + 0.8 / 1.2) * 15
    assert division_room(NodeMix(0, 0, 30.0, (half, changed)), 2.0) == pytest.approx(
        first / ((1 / 1.2 + 1 / 2.4) * 15 + (1 / 1.2 + 1 / 1.2) * 15)
    )


def test_the_room_reads_real_pipelines_costs_measured_here() -> None:
    fast = ScenarioJob("a", "image_jpeg", 1, 0.0, 30.0)
    slow = ScenarioJob("b", "image_jpeg", 1, 0.0, 30.0, step_scale=0.5)  # twice the limit
    mix = NodeMix(0, 0, 30.0, (fast, slow))
    assert division_room(mix, 2.0) > 1.05  # at the profile's 4.1 ms they need ~8 cores
    assert division_room(mix, 2.0, {"image_jpeg": 0.1}) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"cpu_ms\['image_jpeg'\]=-1: expected milliseconds"):
        division_room(mix, 2.0, {"image_jpeg": -1})
    with pytest.raises(ValueError, match="cores=0: expected a number > 0"):
        division_room(mix, 0)


@pytest.mark.integration
def test_cpu_per_sample_counts_the_workers_cpu_time() -> None:
    """An emulated sample spins 2 ms of its thread's CPU time: measured through a loader of one
    worker, it costs that and the hand-over (a speed-free bound: CPU time, not wall time)."""
    ms = cpu_per_sample_ms(Profile("spin", 0.0, 2.0, 8, 1.0, 0.0), seconds=0.5)
    assert 1.9 <= ms <= 8.0
    with pytest.raises(ValueError, match="seconds=0: expected a duration"):
        cpu_per_sample_ms(PROFILES["cpu_heavy"], seconds=0)


def test_bad_draws_are_refused() -> None:
    with pytest.raises(ValueError, match="n=0"):
        draw_mixes(1, 0)
    with pytest.raises(ValueError, match="length=5"):
        draw_mixes(1, 1, length=5)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--profile", "image_jpeg", "--io-scale", "2"], "only emulated profiles"),
        (["--profile", "io_heavy", "--step-scale", "0"], "--step-scale=0.0: expected > 0"),
        (["--profile", "io_heavy", "--slowdown-factor", "-1"], "--slowdown-factor"),
        (["--worker-nice", "20"], "--worker-nice=20: expected 0..19"),
    ],
)
def test_the_testbed_refuses_bad_variations(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--seconds", "1"])
    assert expected in capsys.readouterr().err


def _priority_after_nice(nice: int) -> int:
    from dloader.apps.testbed import _nice_worker

    _nice_worker(nice, 0)
    return os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.integration
def test_the_testbeds_worker_nice_is_set_in_the_worker_and_never_lowered() -> None:
    import concurrent.futures
    import multiprocessing

    base = os.getpriority(os.PRIO_PROCESS, 0)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        assert pool.submit(_priority_after_nice, 7).result(60) == max(base, 7)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        assert pool.submit(_priority_after_nice, 0).result(60) == base
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the trainer is left alone
