"""The node policy (pure): even split, adaptive allocation within budgets, cold start,
hysteresis."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from dloader.predictor import LoaderModel, LoaderObservation
from dloader.sidecar.node_policy import (
    MEASURE_CHANGED,
    MEASURE_STALE_S,
    MEASURE_WINDOWS,
    PROBE_WINDOWS,
    WINDOW_SPREAD,
    Budget,
    JobView,
    Measurements,
    NodePolicy,
    Split,
    cpu_shares,
    curve_moved,
    decide,
    expected,
    heavier,
    measured_guard,
    probe,
    split_of,
    trainer_weight,
    undecided,
)
from dloader.sidecar.node_policy.allocation import curve
from tests.predictor.test_loader_model import CPU_HEAVY, IO_HEAVY, truth

GPU_BOUND = dict(t_io=0.001, t_cpu=0.0005, a0=0.04, a1=0.005)


def fitted(profile: dict[str, float], ks: tuple[int, ...] = (1, 2, 4, 8, 16)) -> LoaderModel:
    model = LoaderModel()
    model.update(*(truth(k, 2, 32, **profile) for k in ks))
    return model


def test_even_split_within_limits() -> None:
    jobs = [
        JobView("a", 32, 4),
        JobView("b", 32, 4, max_workers=2),
        JobView("c", 32, 4, min_workers=9),
    ]
    d = decide("even", jobs, Budget(workers=12, cores=2))
    assert {k: v.num_workers for k, v in d.items()} == {"a": 4, "b": 2, "c": 9}
    assert "even split" in d["a"].reason


def test_guided_sets_each_jobs_ceiling_the_even_split_cut_to_the_memory_budget() -> None:
    jobs = [
        JobView("a", 32, 4, worker_memory_bytes=100.0),
        JobView("b", 32, 4, max_workers=2, worker_memory_bytes=100.0),
        JobView("c", 32, 4, worker_memory_bytes=300.0),
    ]
    d = decide("guided", jobs, Budget(workers=30, cores=2))
    assert {k: v.num_workers for k, v in d.items()} == {"a": 10, "b": 2, "c": 10}
    assert d["a"].reason.startswith("tunes itself up to 10 workers (even split")
    d = decide("guided", jobs, Budget(workers=30, cores=2, memory_bytes=2_000.0))
    # the biggest workers are cut first: c's 300-byte workers go until the ceilings fit
    assert {k: v.num_workers for k, v in d.items()} == {"a": 10, "b": 2, "c": 2}
    assert d["c"].memory_limited and "to fit the memory budget" in d["c"].reason


def test_adaptive_gives_workers_where_they_help() -> None:
    jobs = [
        JobView("io", 32, 4, model=fitted(IO_HEAVY)),
        JobView("cpu", 32, 4, model=fitted(CPU_HEAVY)),
        JobView("gpu", 32, 4, model=fitted(GPU_BOUND, (1, 2, 4))),
    ]
    d = decide("adaptive", jobs, Budget(workers=24, cores=2))
    k = {j: v.num_workers for j, v in d.items()}
    assert k["gpu"] == 1  # already at its accelerator limit with one worker
    assert k["io"] >= 10  # I/O-bound: far beyond the core count
    assert 1 <= k["cpu"] <= 4  # CPU-bound: what the cores left allow
    assert sum(k.values()) <= 24
    cpu = sum(d[j].candidates[k[j]].cpu_cores for j in k)
    # The CPU budget is shared like the OS shares cores: only the last worker added may be
    # partly unpaid, so demand exceeds the budget by less than one marginal worker.
    marginal = max(d[j].candidates[k[j]].cpu_cores - d[j].candidates[k[j] - 1].cpu_cores for j in k)
    assert cpu <= 2.0 + marginal + 1e-9
    assert d["io"].candidates and "node sum" in d["io"].reason


def test_adaptive_finds_the_best_static_shape_with_room() -> None:
    """With workers to spare, the split a grid search found best (docs/architecture.md): many
    I/O workers, two CPU workers (sharing what the cores have left), one for the GPU-bound job."""
    jobs = [
        JobView("io", 32, 4, model=fitted(IO_HEAVY)),
        JobView("cpu", 32, 4, model=fitted(CPU_HEAVY)),
        JobView("gpu", 32, 4, model=fitted(GPU_BOUND, (1, 2, 4))),
    ]
    k = {j: v.num_workers for j, v in decide("adaptive", jobs, Budget(24, 2), hysteresis=0).items()}
    assert k["io"] >= 12 and k["cpu"] == 2 and k["gpu"] == 1


def test_adaptive_respects_budgets_and_floors() -> None:
    jobs = [
        JobView("io", 32, 1, model=fitted(IO_HEAVY)),
        JobView("io2", 32, 1, model=fitted(IO_HEAVY), max_workers=3),
    ]
    d = decide("adaptive", jobs, Budget(workers=5, cores=2))
    assert d["io2"].num_workers <= 3
    assert d["io"].num_workers + d["io2"].num_workers <= 5
    assert min(v.num_workers for v in d.values()) >= 1  # nobody starved


def untimed(o: LoaderObservation) -> LoaderObservation:
    """The observation as a loader without worker timings would report it."""
    return LoaderObservation(**{**o.__dict__, "fetch_s": None, "cpu_s": None})


def test_cold_jobs_explore_first() -> None:
    d = decide("adaptive", [JobView("new", 32, 2, model=LoaderModel())], Budget(16, 2))
    assert d["new"].num_workers == 1 and "exploring" in d["new"].reason
    model = LoaderModel()
    model.update(untimed(truth(1, 2, 32, **IO_HEAVY)))
    d = decide("adaptive", [JobView("new", 32, 1, model=model)], Budget(16, 2))
    assert d["new"].num_workers == 2 and "exploring" in d["new"].reason


def test_one_timed_window_places_the_job() -> None:
    # the workers' timings of one window give each worker's I/O and CPU per sample: an
    # I/O-bound loader goes straight to many workers instead of doubling its way there
    model = LoaderModel()
    model.update(truth(1, 2, 32, **IO_HEAVY))
    d = decide("adaptive", [JobView("new", 32, 1, model=model)], Budget(24, 2))
    assert d["new"].num_workers >= 12 and "exploring" not in d["new"].reason


def test_hysteresis_keeps_a_near_optimal_allocation() -> None:
    model = fitted(IO_HEAVY)
    best = decide("adaptive", [JobView("io", 32, 2, model=model)], Budget(24, 2))["io"]
    near = best.num_workers - 1
    again = decide(
        "adaptive", [JobView("io", 32, near, model=model)], Budget(24, 2), hysteresis=0.5
    )["io"]
    assert again.num_workers == near and "kept" in again.reason


def test_bad_policy_and_budget() -> None:
    with pytest.raises(ValueError, match="policy: 'greedy' is not one of"):
        decide("greedy", [], Budget(4, 2))
    with pytest.raises(ValueError, match="cores > 0"):
        decide("even", [], Budget(4, 0))


def test_exploration_starts_from_the_jobs_own_worker_count() -> None:
    # A running job is not cut to 1 worker to be measured: it is observed where it is first.
    d = decide(
        "adaptive", [JobView("new", 32, 4, model=LoaderModel(), initial_workers=4)], Budget(16, 2)
    )
    assert d["new"].num_workers == 4 and "exploring" in d["new"].reason
    model = LoaderModel()
    model.update(untimed(truth(4, 2, 32, **IO_HEAVY)))
    d = decide("adaptive", [JobView("new", 32, 4, model=model, initial_workers=4)], Budget(16, 2))
    assert d["new"].num_workers == 8


def test_cpu_shares_water_fill_by_thread() -> None:
    assert cpu_shares([0.5, 0.5], [4, 1], 2.0) == [0.5, 0.5]  # demands fit
    # 2 cores, 4 threads: the light consumer gets its 0.2, the others split the rest 3:1
    got = cpu_shares([0.2, 3.0, 3.0], [1, 3, 1], 2.0)
    assert got[0] == pytest.approx(0.2)
    assert got[1] == pytest.approx(1.8 * 3 / 4) and got[2] == pytest.approx(1.8 / 4)
    assert sum(got) == pytest.approx(2.0)
    assert cpu_shares([0.0, 1.0], [1, 1], 1.0) == [0.0, 1.0]


def test_cpu_shares_match_the_sequential_water_fill() -> None:
    """The shares (computed for many allocations at once) equal, to the last bit, the plain
    one-consumer-at-a-time water fill they stand for."""

    def sequential(demands: list[float], workers: list[int], cores: float) -> list[float]:
        out, weights = [0.0] * len(demands), [max(w, 1) for w in workers]
        todo = sorted(
            (i for i, d in enumerate(demands) if d > 0), key=lambda i: demands[i] / weights[i]
        )
        left, weight = cores, sum(weights[i] for i in todo)
        for pos, i in enumerate(todo):
            if demands[i] * weight <= left * weights[i]:
                out[i], left, weight = demands[i], left - demands[i], weight - weights[i]
                continue
            for j in todo[pos:]:
                out[j] = left / weight * weights[j]
            break
        return out

    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 12)
        demands = [rng.choice([0.0, rng.uniform(0, 3), 0.5]) for _ in range(n)]
        workers = [rng.randint(0, 16) for _ in range(n)]
        cores = rng.choice([1.0, 2.0, 3.5, 16.0])
        assert cpu_shares(demands, workers, cores) == sequential(demands, workers, cores)


def test_a_decision_waits_for_the_curve_to_move() -> None:
    """A model update re-decides only once the job's curve moved by more than CURVE_MOVE since
    the decision it runs under; small moves add up against that decision's curve."""
    model = fitted(IO_HEAVY)
    job = JobView("a", 32, 4, model=model)
    budget = Budget(16, 2)
    decided = decide("adaptive", [job], budget)["a"].candidates
    assert not curve_moved(job, budget, decided)
    assert curve_moved(job, budget, ())  # nothing decided yet
    model.update(truth(4, 2, 32, **IO_HEAVY))  # one more window as predicted: noise
    assert not curve_moved(job, budget, decided)
    slower = dict(IO_HEAVY, t_io=IO_HEAVY["t_io"] * 1.5)
    model.update(*(truth(k, 2, 32, **slower) for k in (1, 2, 4, 8, 16)))
    assert curve_moved(job, budget, decided)


def test_training_process_cpu_counts_against_the_cores() -> None:
    """The training processes need CPU too (0.3 ms per sample here): the policy hands out fewer
    workers once their CPU would come out of the trainers' share."""
    io, cpu = fitted(IO_HEAVY), fitted(CPU_HEAVY)

    def workers(main_cpu: float) -> dict[str, int]:
        jobs = [
            JobView("io", 32, 1, model=io, main_cpu_per_sample=main_cpu),
            JobView("cpu", 32, 1, model=cpu, main_cpu_per_sample=main_cpu),
        ]
        d = decide("adaptive", jobs, Budget(24, 2), hysteresis=0, hedge=1.0)  # no spares
        return {j: v.num_workers for j, v in d.items()}

    blind, aware = workers(0.0), workers(0.0003)
    assert blind == {"io": 19, "cpu": 2}
    assert sum(aware.values()) < sum(blind.values()) and aware["io"] >= 10


def test_niced_workers_leave_a_training_process_the_core_it_needs() -> None:
    """With every job's workers niced (a trainer weighs 9.3 workers at nice 10), a trainer that
    needs most of a core gets it from the neighbours' CPU-bound workers, as the kernel gives it:
    the model expects the job at its own pace, where at equal weights it expects it starved."""
    host, cpu = fitted(GPU_BOUND), fitted(CPU_HEAVY)
    jobs = [
        JobView("host", 32, 2, model=host, main_cpu_per_sample=0.004),  # ~0.75 core at ~190/s
        JobView("cpu", 32, 8, model=cpu),
    ]
    counts = {"host": 2, "cpu": 8}
    equal = expected(jobs, Budget(24, 2), counts)
    niced = expected(jobs, Budget(24, 2, trainer_weight=trainer_weight(10)), counts)
    alone = expected(jobs[:1], Budget(24, 2), {"host": 2})["host"]
    assert equal["host"] < 0.5 * alone  # one thread among nine CPU-bound ones
    assert niced["host"] == pytest.approx(alone, rel=0.02)
    assert niced["cpu"] < equal["cpu"]  # the cores it got came from the workers
    assert trainer_weight(0) == 1.0 and trainer_weight(10) == pytest.approx(1024 / 110)
    with pytest.raises(ValueError, match="worker_nice=20"):
        trainer_weight(20)


def test_releasing_idle_workers_skips_the_hysteresis() -> None:
    jobs = [
        JobView("io", 32, 16, model=fitted(IO_HEAVY), max_workers=16),
        JobView("gpu", 32, 6, model=fitted(GPU_BOUND, (1, 2, 4))),  # 5 more than it needs
    ]
    d = decide("adaptive", jobs, Budget(24, 2), hysteresis=0.5)
    assert d["gpu"].num_workers == 1 and d["io"].num_workers == 16


def test_workers_on_a_rising_curve_are_not_released() -> None:
    # The greedy stops adding workers to io at 19 (the next adds < min_gain); at 20 the job
    # is predicted 0.4% better than at 19: that is a loss, so the 20th worker stays (small
    # releases, decision after decision, would add up to a real loss).
    # (without the spare workers of the hedge, which keep more)
    jobs = [JobView("io", 32, 20, model=fitted(IO_HEAVY))]
    strict = decide("adaptive", jobs, Budget(30, 2), hysteresis=0.5, hedge=1.0)
    assert strict["io"].num_workers == 20
    lenient = decide("adaptive", jobs, Budget(30, 2), hysteresis=0.5, release_loss=0.005, hedge=1.0)
    assert lenient["io"].num_workers == 19


def test_an_io_bound_job_keeps_the_workers_that_carry_a_slower_storage() -> None:
    """Spare workers (``HEDGE_COST``): an I/O-bound job gets the workers that carry its
    throughput were its storage 1.5x slower, a CPU-bound job none; the spares are kept once
    held, and the worker budget and the memory room still bound them."""
    io = fitted(IO_HEAVY)
    alone = decide("adaptive", [JobView("io", 32, 1, model=io)], Budget(60, 2), hedge=1.0)
    k = alone["io"].num_workers
    hedged = decide("adaptive", [JobView("io", 32, 1, model=io)], Budget(60, 2))["io"]
    h = hedged.num_workers
    assert h == math.ceil(k * (1.5 * 0.008 + 0.0003) / 0.0083 - 1e-9) > k
    # the storage 1.5x slower: the spares carry what the lean count carried before
    slower = {**IO_HEAVY, "t_io": 1.5 * IO_HEAVY["t_io"]}
    before = truth(k, 2, 32, **IO_HEAVY).samples_per_s
    assert truth(h, 2, 32, **slower).samples_per_s >= 0.98 * before
    assert truth(k, 2, 32, **slower).samples_per_s < 0.9 * before  # the lean count did not
    # the hedge is kept, never released as workers that add nothing
    kept = decide("adaptive", [JobView("io", 32, h, model=io)], Budget(60, 2))["io"]
    assert kept.num_workers == h and kept.reason.startswith("kept")
    # bounded by the budget and the memory room
    assert (
        decide("adaptive", [JobView("io", 32, 1, model=io)], Budget(k + 2, 2))["io"].num_workers
        == k + 2
    )
    each = JobView("io", 32, 1, model=io, worker_memory_bytes=MiB)
    room = decide("adaptive", [each], Budget(60, 2, memory_bytes=(k + 1) * MiB))["io"]
    assert room.num_workers == k + 1
    with pytest.raises(ValueError, match=r"spare=0\.5: expected within"):
        NodePolicy("adaptive", Budget(60, 2), spare=0.5)
    # CPU-bound workers: no spares
    cpu = fitted(CPU_HEAVY)
    lean = decide("adaptive", [JobView("c", 32, 1, model=cpu)], Budget(60, 2), hedge=1.0)
    assert decide("adaptive", [JobView("c", 32, 1, model=cpu)], Budget(60, 2)) == lean


MiB = 2**20


@pytest.mark.parametrize("policy", ["adaptive", "even"])
def test_memory_budget_is_never_passed(policy: str) -> None:
    """Workers of a job whose dataset they copy cost 200 MiB each: under a 1 GiB budget the
    node never holds more, and the I/O-bound job (the one that wants many) says memory, not
    CPU, limits it."""
    jobs = [
        JobView("io", 32, 4, model=fitted(IO_HEAVY), worker_memory_bytes=200 * MiB),
        JobView("cpu", 32, 4, model=fitted(CPU_HEAVY), worker_memory_bytes=20 * MiB),
        JobView("gpu", 32, 4, model=fitted(GPU_BOUND, (1, 2, 4)), worker_memory_bytes=300 * MiB),
    ]
    budget = Budget(workers=24, cores=2, memory_bytes=1024 * MiB)
    d = decide(policy, jobs, budget, hysteresis=0)
    k = {j: v.num_workers for j, v in d.items()}
    used = 200 * k["io"] + 20 * k["cpu"] + 300 * k["gpu"]
    assert used * MiB <= budget.memory_bytes, k
    assert min(k.values()) >= 1
    if policy == "adaptive":
        unlimited = decide("adaptive", jobs, Budget(24, 2), hysteresis=0)
        assert unlimited["io"].num_workers > k["io"]  # it wanted more
        assert d["io"].memory_limited and "limited by memory" in d["io"].reason
        assert not d["gpu"].memory_limited  # one worker is all it needs
    else:
        assert any(v.memory_limited for v in d.values())


def test_memory_shorter_than_one_worker_each_drops_to_min_workers() -> None:
    """Not even one worker per job fits: jobs that allow 0 load in the training process."""
    jobs = [
        JobView("a", 32, 2, model=fitted(IO_HEAVY), worker_memory_bytes=600 * MiB),
        JobView("b", 32, 2, min_workers=1, model=fitted(CPU_HEAVY), worker_memory_bytes=600 * MiB),
    ]
    d = decide("adaptive", jobs, Budget(workers=16, cores=2, memory_bytes=1000 * MiB))
    assert (d["a"].num_workers, d["b"].num_workers) == (0, 1)


def test_exploring_jobs_stay_within_memory() -> None:
    """A cold job explores only up to what memory leaves it."""
    hot = JobView("hot", 32, 6, model=fitted(IO_HEAVY), worker_memory_bytes=100 * MiB)
    cold = JobView("cold", 32, 1, initial_workers=8, worker_memory_bytes=100 * MiB)
    d = decide("adaptive", [hot, cold], Budget(workers=32, cores=2, memory_bytes=1000 * MiB))
    assert d["cold"].num_workers <= 4 and "exploring" in d["cold"].reason
    total = sum(v.num_workers for v in d.values())
    assert total * 100 * MiB <= 1000 * MiB


def growing_io_job(workers: int) -> JobView:
    """An I/O-bound job running ``workers`` workers that hold 20 MiB each now and may copy up
    to 250 MiB (their memory still grows)."""
    return JobView(
        "io",
        32,
        workers,
        model=fitted(IO_HEAVY),
        worker_memory_bytes=20 * MiB,
        worker_memory_bound=250 * MiB,
    )


@pytest.mark.parametrize("policy", ["adaptive", "even"])
def test_growing_workers_grow_only_to_what_their_bound_fits(policy: str) -> None:
    """Its two workers hold 20 MiB each now but may copy up to 250 MiB (their memory still
    grows): under 600 MiB the job may grow to 2 workers at most (3 x 250 would not fit), and it
    keeps what it runs (2 x 20 fits). Settled (no bound), the measured 20 MiB apply."""
    growing = growing_io_job(2)
    budget = Budget(workers=16, cores=2, memory_bytes=600 * MiB)
    d = decide(policy, [growing], budget, hysteresis=0)
    assert d["io"].num_workers == 2
    assert d["io"].memory_limited
    if policy == "adaptive":
        assert "what its growing workers may copy" in d["io"].reason
    settled = replace(growing, worker_memory_bound=0.0)
    assert decide(policy, [settled], budget, hysteresis=0)["io"].num_workers > 2
    # one worker now: it may grow to 2 (2 x 250 fits), not to 3
    assert decide(policy, [growing_io_job(1)], budget, hysteresis=0)["io"].num_workers == 2


def test_a_growing_job_keeps_the_workers_it_has() -> None:
    """The bound limits growth only: 8 workers at 20 MiB measured are not shed because each
    may yet copy 250 MiB (the measured cost decides what must go)."""
    d = decide("adaptive", [growing_io_job(8)], Budget(workers=16, cores=2, memory_bytes=600 * MiB))
    assert d["io"].num_workers == 8


def test_a_split_is_measured_once_every_job_has_its_windows() -> None:
    m = Measurements()
    split = split_of({"a": 2, "b": 3})
    limits = {"a": 100.0, "b": 200.0}
    m.add(split, "a", 50.0, now=0.0)
    m.add(split, "a", 70.0, now=1.0)
    m.add(split, "b", 100.0, now=2.0)
    assert m.score(split, limits, now=2.0) is None  # b has one window of MEASURE_WINDOWS
    m.add(split, "b", 100.0, now=3.0)
    assert m.score(split, limits, now=3.0) == pytest.approx(0.6 + 0.5)
    assert m.score(split, limits, now=3.0 + MEASURE_STALE_S + 1) is None  # stale
    assert m.score(split, {"a": 100.0}, now=3.0) is None  # b's limit unknown


def test_a_window_unlike_before_at_a_split_forgets_every_measurement() -> None:
    """A pipeline's cost doubles under a measured split: what every split measured under the
    old costs is forgotten at its first window, not compared with what comes after."""
    m = Measurements()
    here, there = split_of({"a": 2, "b": 3}), split_of({"a": 3, "b": 2})
    limits = {"a": 100.0, "b": 100.0}
    for split in (there, here):
        for job in ("a", "b"):
            for _ in range(MEASURE_WINDOWS):
                assert not m.add(split, job, 100.0, now=0.0)
    assert m.add(here, "a", 100.0 * (1 + MEASURE_CHANGED) * 0.98, now=1.0) is False  # noise
    assert m.score(there, limits, now=1.0) is not None
    assert m.add(here, "a", 55.0, now=2.0) is True  # io_a's cost doubled
    assert m.score(there, limits, now=2.0) is None and m.score(here, limits, now=2.0) is None
    assert m.samples == {here: {"a": [55.0]}}  # the new window starts anew
    assert not m.add(here, "a", 57.0, now=3.0)  # and the next is compared with it alone
    assert m.samples[here]["a"] == [55.0, 57.0]


def test_a_noisy_jobs_window_says_a_change_only_past_its_own_spread() -> None:
    """Packed text on a crowded node measured 240-450 samples/s in the windows of one split:
    a window 39% below their mean is its noise, not a change; half of a steady level is."""
    m = Measurements()
    here = split_of({"a": 1})
    for value in (448.0, 345.0):
        assert not m.add(here, "a", value, now=0.0)
    assert not m.add(here, "a", 242.0, now=1.0)  # 39% below the mean: within 3 spreads
    assert m.samples[here]["a"] == [448.0, 345.0, 242.0]
    steady = split_of({"b": 1})
    for value in (100.0, 104.0, 97.0):
        assert not m.add(steady, "b", value, now=2.0)
    assert m.add(steady, "b", 50.0, now=3.0)  # its cost doubled


def measured(
    scores: dict[Split, float], now: float = 0.0, windows: int = MEASURE_WINDOWS
) -> Measurements:
    """Each split measured at ``scores`` (every job at limit 1: its share of the score), over
    ``windows`` identical windows per job (the spread, then, is the prior's, shrinking as the
    windows add up: :meth:`Measurements.spread`)."""
    m = Measurements()
    for split, score in scores.items():
        for job, _ in split:
            for _ in range(windows):
                m.add(split, job, score / len(split), now)
    return m


def test_the_model_proposes_measurements_decide() -> None:
    here, there, other = (split_of({"a": 2, "b": k}) for k in (2, 3, 1))
    limits = {"a": 1.0, "b": 1.0}
    # a proposal measured worse is not taken; one measured within the margin, or not measured, is
    m = measured({here: 1.0, there: 0.9})
    chosen, why = measured_guard(here, there, None, m, limits, 0.0)
    assert chosen == here and "measured 1.000" in why and "0.900" in why
    assert (
        measured_guard(here, there, None, measured({here: 1.0, there: 0.99}), limits, 0)[0] == there
    )
    assert measured_guard(here, other, None, m, limits, 0.0) == (other, "")
    # the split left for this one measured better: back to it
    chosen, why = measured_guard(there, there, here, m, limits, 0.0)
    assert chosen == here and why.startswith("back to (a=2, b=2)")
    assert measured_guard(here, here, there, m, limits, 0.0) == (here, "")
    # another job set (one left): no going back to a split of other jobs
    alone = split_of({"a": 2})
    assert measured_guard(alone, alone, here, m, {"a": 1.0}, 0.0) == (alone, "")


def test_probing_tries_the_best_untried_near_tie() -> None:
    """Steady at a split: the neighbour the model ranks best among those not measured lately
    and predicted within PROBE_LOSS (on this full node, a CPU-bound worker less first, within
    RELEASE_LOSS); none when every such neighbour was measured."""
    jobs = [
        JobView("io", 32, 16, model=fitted(IO_HEAVY)),  # near its curve's flat part
        JobView("cpu", 32, 2, model=fitted(CPU_HEAVY)),
    ]
    budget = Budget(workers=18, cores=2)
    limits = {"io": 1.0, "cpu": 1.0}
    m = Measurements()
    tried = []
    while (p := probe(jobs, budget, m, limits, 0.0)) is not None:
        split, why = p.split, p.why
        assert split not in tried and "probing" in why
        counts = dict(split)
        assert sum(counts.values()) <= 18 and min(counts.values()) >= 1
        assert sum(abs(counts[j.job_id] - j.current_workers) for j in jobs) <= 2
        tried.append(split)
        m = measured({s: 1.0 for s in tried})
    # first, the node being full (2 cores), cpu's worker less, kept or moved to io (14%
    # predicted loss: within RELEASE_LOSS); then one io worker fewer, kept or moved to cpu
    # (< 1% predicted loss; the model ties cpu's 2 and 3 workers within 2e-6: either may come
    # first); not io 17 with cpu 2 (over the budget)
    assert tried[:2] == [split_of({"io": 17, "cpu": 1}), split_of({"io": 16, "cpu": 1})]
    assert sorted(tried[2:]) == [split_of({"io": 15, "cpu": 2}), split_of({"io": 15, "cpu": 3})]


def test_no_probe_adds_a_worker_to_a_job_at_its_accelerator_limit() -> None:
    """A job at its limit alone on a roomy node: its model ties one worker more with the
    current count (a near-tie), but that probe could not measure PROBE_GAIN better, so none is
    made; a loader-bound job beside it is still probed with one more."""
    gpu = JobView("gpu", 32, 2, model=fitted(GPU_BOUND))
    budget = Budget(workers=12, cores=16)
    m, limits = Measurements(), {"gpu": 1.0, "io": 1.0}
    node_alone = probe([gpu], budget, m, limits, 0.0)
    assert node_alone is None or dict(node_alone.split)["gpu"] < 2
    io = JobView("io", 32, 2, model=fitted(IO_HEAVY))
    both = probe([gpu, io], budget, m, limits, 0.0)
    assert both is not None and dict(both.split) == {"gpu": 2, "io": 3}


def test_no_probe_moves_a_worker_to_a_job_at_its_accelerator_limit() -> None:
    """The emulated mix at its best split on a full 2-core node: of every probe made until none
    is left, none moves a worker to gpu_bound (at its limit with one); the CPU-bound job's
    worker less is tried as itself, not parked there."""
    jobs = [
        JobView("gpu", 32, 1, model=fitted(GPU_BOUND)),
        JobView("cpu", 32, 2, model=fitted(CPU_HEAVY)),
        JobView("io", 32, 9, model=fitted(IO_HEAVY)),
    ]
    budget, limits = Budget(workers=12, cores=2), dict.fromkeys(["gpu", "cpu", "io"], 1.0)
    tried: list[Split] = []
    while (p := probe(jobs, budget, measured({s: 1.0 for s in tried}), limits, 0.0)) is not None:
        tried.append(p.split)
    assert tried and all(dict(s)["gpu"] == 1 for s in tried), tried
    assert split_of({"gpu": 1, "cpu": 1, "io": 9}) in tried


def test_a_measured_neighbour_answers_a_probe() -> None:
    """At 9/2/1 (io/cpu/gpu) on a full node, 10/1/1 measured: cpu_heavy at one worker. If it
    measured clearly worse, its estimate of 9/1/1 (its measurement plus the model's difference)
    falls short of what that lighter probe must measure to stay, and the probe is another; if
    it measured about the same, 9/1/1 is probed (the model alone ranks it first)."""
    jobs = [
        JobView("gpu", 32, 1, model=fitted(GPU_BOUND)),
        JobView("cpu", 32, 2, model=fitted(CPU_HEAVY)),
        JobView("io", 32, 9, model=fitted(IO_HEAVY)),
    ]
    budget, limits = Budget(workers=12, cores=2), dict.fromkeys(["gpu", "cpu", "io"], 1.0)
    here = split_of({"gpu": 1, "cpu": 2, "io": 9})
    tried = split_of({"gpu": 1, "cpu": 1, "io": 10})
    release = split_of({"gpu": 1, "cpu": 1, "io": 9})
    worse = probe(jobs, budget, measured({here: 2.22, tried: 2.10}), limits, 0.0)
    assert worse is not None and worse.split != release
    tie = probe(jobs, budget, measured({here: 2.22, tried: 2.20}), limits, 0.0)
    assert tie is not None and tie.split == release and tie.lighter
    # the current split's own measurement is no neighbour: alone, it skips nothing
    alone = probe(jobs, budget, measured({here: 2.22}), limits, 0.0)
    assert alone is not None and alone.split == tried


def test_on_a_full_node_a_probe_first_tries_a_cpu_bound_worker_less() -> None:
    """Two CPU-bound jobs at 3 workers each and an I/O-bound one: on 2 cores the node is
    full, and the first probe takes a worker from a CPU-bound job (the model's sharing
    overrates them there); on 16 cores it is not full, and the probe is the best near-tie."""
    jobs = [
        JobView("c1", 32, 3, model=fitted(CPU_HEAVY)),
        JobView("c2", 32, 3, model=fitted(CPU_HEAVY)),
        JobView("io", 32, 8, model=fitted(IO_HEAVY)),
    ]
    limits = dict.fromkeys(["c1", "c2", "io"], 1.0)
    full = probe(jobs, Budget(workers=20, cores=2), Measurements(), limits, 0.0)
    assert full is not None and full.lighter
    counts = dict(full.split)
    assert counts["c1"] + counts["c2"] == 5 and "a CPU-bound worker less on a full node" in full.why
    roomy = probe(jobs, Budget(workers=20, cores=16), Measurements(), limits, 0.0)
    assert roomy is not None and "full node" not in roomy.why and not roomy.lighter


def test_a_cpu_bound_worker_more_on_a_full_node_must_measure_better() -> None:
    """heavier(): a move that gives a CPU-bound job a worker more where the node's cores are
    taken (not on 16 cores, not an I/O-bound worker more); such a proposal, once measured, is
    taken only if it measured better by PROBE_GAIN (another, within MEASURE_MARGIN)."""
    jobs = [
        JobView("c1", 32, 3, model=fitted(CPU_HEAVY)),
        JobView("c2", 32, 3, model=fitted(CPU_HEAVY)),
        JobView("io", 32, 8, model=fitted(IO_HEAVY)),
    ]
    now = {"c1": 3, "c2": 3, "io": 8}
    full, roomy = Budget(workers=20, cores=2), Budget(workers=20, cores=16)
    assert heavier(jobs, full, now, {**now, "c1": 4, "io": 7})
    assert not heavier(jobs, roomy, now, {**now, "c1": 4, "io": 7})
    assert not heavier(jobs, full, now, {**now, "c1": 2, "io": 9})
    assert not heavier([JobView("new", 32, 3), *jobs[1:]], full, now, {**now, "c1": 4})
    here, there = split_of(now), split_of({**now, "c1": 4, "io": 7})
    limits = dict.fromkeys(now, 1.0)
    slightly = measured({here: 1.0, there: 1.005})
    chosen, why = measured_guard(here, there, None, slightly, limits, 0.0, heavier=True)
    assert chosen == here and why.startswith("kept: measured 1.000")
    assert measured_guard(here, there, None, slightly, limits, 0.0) == (there, "")
    clearly = measured({here: 1.0, there: 1.02}, windows=8)  # two windows could not tell 2%
    assert measured_guard(here, there, None, clearly, limits, 0.0, heavier=True) == (there, "")


def test_a_move_that_paid_is_probed_again_first() -> None:
    """After a probe that paid, the same move from the new split is tried first if it is a
    near-tie; one that no longer fits is not (the probe is the one made without)."""
    jobs = [
        JobView("io", 32, 16, model=fitted(IO_HEAVY)),
        JobView("cpu", 32, 2, model=fitted(CPU_HEAVY)),
    ]
    budget = Budget(workers=18, cores=2)
    limits = {"io": 1.0, "cpu": 1.0}

    def probed(again: dict[str, int] | None) -> tuple[dict[str, int], str]:
        p = probe(jobs, budget, Measurements(), limits, 0.0, again=again)
        assert p is not None
        return dict(p.split), p.why

    assert probed(None)[0] == {"io": 17, "cpu": 1}  # a CPU-bound worker less first (see above)
    counts, why = probed({"io": -1, "cpu": 1})  # a near-tie (see above)
    assert counts == {"io": 15, "cpu": 3} and why.endswith("(the move that just paid, once more)")
    assert probed({"io": 1, "cpu": 1}) == probed(None)  # 17 + 3: over the budget


def test_what_the_model_expects_of_a_split_shares_the_cores() -> None:
    """Two CPU-bound jobs at 4 workers each: on 16 cores each gets its curve; on 2 cores they
    share them, and each is expected to reach less (and not a job left out: none is)."""
    jobs = [JobView(j, 32, 4, model=fitted(CPU_HEAVY)) for j in ("c1", "c2")]
    counts = {"c1": 4, "c2": 4}
    roomy = expected(jobs, Budget(workers=8, cores=16), counts)
    full = expected(jobs, Budget(workers=8, cores=2), counts)
    curve = jobs[0].model.predict(4, 16, 32).samples_per_s  # type: ignore[union-attr]
    assert roomy == pytest.approx({"c1": curve, "c2": curve})
    assert set(full) == {"c1", "c2"} and all(full[j] < 0.7 * roomy[j] for j in full)
    assert expected([JobView("new", 32, 4)], Budget(workers=8, cores=2), {"new": 4}) == {}


def test_workers_that_are_not_all_runnable_claim_fewer_cores() -> None:
    """Two CPU-bound jobs on 1.5 cores, one at 8 workers and one at 1: counted all runnable, the
    one worker gets a ninth of what the workers share; where the 8 workers' activity says 4 of
    them are runnable (8 ** (2/3) = 4), it gets a fifth, and the 8 workers less."""
    jobs = [
        JobView("many", 32, 8, model=fitted(CPU_HEAVY)),
        JobView("one", 32, 1, model=fitted(CPU_HEAVY)),
    ]
    counts, budget = {"many": 8, "one": 1}, Budget(workers=9, cores=1.5)
    one = curve(jobs[1], budget, 1)[1]  # the one worker alone: its rate and its cores
    every = expected(jobs, budget, counts)
    fewer = expected([replace(jobs[0], worker_activity=2 / 3), jobs[1]], budget, counts)
    assert every["one"] == pytest.approx(one.predicted * 1.5 / 9 / one.cpu_cores)
    assert fewer["one"] == pytest.approx(one.predicted * 1.5 / 5 / one.cpu_cores)
    assert fewer["many"] < every["many"]


def test_a_probe_must_measure_better_to_stay() -> None:
    """A model's move stays unless measured worse by the margin; a probe goes back unless it
    measured better than the split it left by PROBE_GAIN."""
    before, probed = split_of({"a": 2, "b": 2}), split_of({"a": 3, "b": 1})
    limits = {"a": 1.0, "b": 1.0}
    level = measured({before: 1.0, probed: 1.0})
    assert measured_guard(probed, probed, before, level, limits, 0.0) == (probed, "")
    chosen, why = measured_guard(probed, probed, before, level, limits, 0.0, trial=True)
    assert chosen == before and why.endswith("(a probe that did not pay)")
    better = measured({before: 1.0, probed: 1.02}, windows=8)
    assert measured_guard(probed, probed, before, better, limits, 0.0, trial=True)[0] == probed
    # a lighter probe (a CPU-bound worker less on a full node) stays on a tie, not on a loss
    tie = measured_guard(probed, probed, before, level, limits, 0.0, trial=True, lighter=True)
    assert tie == (probed, "")
    worse = measured({before: 1.0, probed: 0.98}, windows=8)
    chosen, why = measured_guard(
        probed, probed, before, worse, limits, 0.0, trial=True, lighter=True
    )
    assert chosen == before and why.endswith("(a probe that did not pay)")


def test_a_noise_sized_difference_is_never_acted_on() -> None:
    """Windows that spread widely make a difference within ``NOISE_Z`` standard errors noise:
    a probe 5% better by its mean, over windows 20% apart, is not kept (the same 5% over steady
    windows is); a model's move 10% worse over windows 60% apart is not undone."""
    before, probed = split_of({"a": 2, "b": 2}), split_of({"a": 3, "b": 1})
    limits = {"a": 1.0, "b": 1.0}

    def windows(spread: float) -> Measurements:
        m = Measurements()
        for split, score in ((before, 1.0), (probed, 1.05)):
            for job, _ in split:
                for w in (1 - spread, 1 + spread, 1 - spread, 1 + spread):
                    m.add(split, job, score / 2 * w, 0.0)
        return m

    steady, noisy = windows(0.0), windows(0.1)
    assert noisy.error(probed, limits) > 0.03 and steady.error(probed, limits) < 0.006
    assert measured_guard(probed, probed, before, steady, limits, 0.0, trial=True)[0] == probed
    chosen, why = measured_guard(probed, probed, before, noisy, limits, 0.0, trial=True)
    assert chosen == before and "did not pay" in why
    # the model's own move, measured 10% worse than the split it left: undone only when clear
    worse = split_of({"a": 1, "b": 3})
    m2 = Measurements()
    for split, score in ((before, 1.0), (worse, 0.90)):
        for job, _ in split:
            for w in (0.7, 1.3):
                m2.add(split, job, score / 2 * w, 0.0)
    assert measured_guard(worse, worse, before, m2, limits, 0.0)[0] == worse  # 10%, in noise
    assert (
        measured_guard(worse, worse, before, measured({before: 1.0, worse: 0.9}), limits, 0)[0]
        == before
    )  # 10% over steady windows: back


def test_a_jobs_window_spread_is_pooled_over_the_splits_it_was_measured_at() -> None:
    """Two windows of one split give a spread of one degree of freedom (here 0; under half
    the truth 38% of the time): a job's spread is its windows' deviations from their split's
    mean pooled over every split, shrunk towards WINDOW_SPREAD while they are few."""
    a, b = split_of({"x": 1}), split_of({"x": 2})
    m = Measurements()
    assert m.spread("x") == pytest.approx(WINDOW_SPREAD)  # nothing measured: the prior
    for value in (90.0, 110.0, 90.0, 110.0):  # 10% either way at one split
        m.add(a, "x", value, 0.0)
    for _ in range(2):  # two equal windows at the other
        m.add(b, "x", 100.0, 0.0)
    # 4 x 0.01 of squares over 3 + 1 degrees of freedom, and the prior's 2 x 0.03^2 over 2
    assert m.spread("x") == pytest.approx(((0.04 + 2 * WINDOW_SPREAD**2) / 6) ** 0.5)
    assert m.error(b, {"x": 100.0}) == pytest.approx(m.spread("x") / 2**0.5)  # not 0
    assert m.windows(a) == 4 and m.windows(b) == 2 and m.windows(split_of({"y": 1})) == 0


def test_a_close_call_is_measured_longer_before_it_is_judged() -> None:
    """A probe 1% better than the split it left, over windows 5% apart: two windows each cannot
    tell whether it clears its bar (PROBE_GAIN), so it is undecided until PROBE_WINDOWS; one
    clearly short of the bar (15% worse) or clearly over it (10% better) is decided at once."""
    before, probed = split_of({"a": 2, "b": 2}), split_of({"a": 3, "b": 1})
    limits = {"a": 1.0, "b": 1.0}

    def windows(score: float, n: int) -> Measurements:
        m = Measurements()
        for split, level in ((before, 1.0), (probed, score)):
            for job, _ in split:
                for i in range(n):
                    m.add(split, job, level / 2 * (0.95 if i % 2 else 1.05), 0.0)
        return m

    close = windows(1.01, MEASURE_WINDOWS)
    assert measured_guard(probed, probed, before, close, limits, 0.0, trial=True)[0] == before
    assert undecided(probed, before, close, limits, 0.0)
    assert not undecided(probed, before, windows(1.01, PROBE_WINDOWS), limits, 0.0)
    assert not undecided(probed, before, windows(0.85, MEASURE_WINDOWS), limits, 0.0)
    clear = windows(1.10, MEASURE_WINDOWS)
    assert measured_guard(probed, probed, before, clear, limits, 0.0, trial=True)[0] == probed
    assert not undecided(probed, before, clear, limits, 0.0)
    # a lighter probe's bar is "no worse by PROBE_GAIN": 2% worse is a tie it keeps (not a
    # failure to look at again), 8% worse a close call, 15% worse clear
    assert not undecided(probed, before, windows(0.98, MEASURE_WINDOWS), limits, 0.0, lighter=True)
    assert undecided(probed, before, windows(0.92, MEASURE_WINDOWS), limits, 0.0, lighter=True)
    assert not undecided(probed, before, windows(0.85, MEASURE_WINDOWS), limits, 0.0, lighter=True)
    assert not undecided(probed, before, Measurements(), limits, 0.0)  # nothing measured


def test_a_workers_upkeep_is_part_of_its_cpu_demand() -> None:
    """Each worker's measured upkeep adds to the job's predicted CPU at every count: on a node
    whose cores are taken, an I/O-bound job's many workers are priced at what they take."""
    base = JobView("io", 32, 8, model=fitted(IO_HEAVY))
    costly = replace(base, worker_upkeep_cores=0.01)
    budget = Budget(workers=32, cores=2)
    plain = {c.num_workers: c.cpu_cores for c in curve(base, budget, 32)}
    priced = {c.num_workers: c.cpu_cores for c in curve(costly, budget, 32)}
    assert priced[0] == plain[0] == 0
    for k in (1, 8, 32):
        assert priced[k] == pytest.approx(plain[k] + 0.01 * k)
