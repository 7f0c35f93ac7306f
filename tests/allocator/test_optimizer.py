"""The DP optimizer against brute force, its admission and restart rules, and node packing."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dloader.allocator import AllocatorError, Cluster, OptimizerJob, optimize, place
from dloader.allocator.optimizer import admit, candidate_counts


def scaling(peak: float, serial: float, bsz_half: float):
    """Amdahl-like samples/s: more GPUs help less, larger batches scale better."""

    def f(k: np.ndarray, b: np.ndarray) -> np.ndarray:
        k = np.asarray(k, float)
        b = np.asarray(b, float)
        return peak * k / (1 + serial * (k - 1) * bsz_half / b)

    return f


def noise(phi: float):
    return lambda b: (phi + 1.0) / (phi + np.asarray(b, float))


def brute_force(jobs, capacity, objective, horizon, power):
    """Best total utility by enumerating every count of every job (no DP, no tables)."""

    def util(u):
        return u if power == 1 else (math.log(u) if power == 0 else u**power / power)

    per_job = []
    for j in jobs:
        eff = (
            (lambda b: 1.0)
            if objective == "throughput" or j.efficiency is None
            else (lambda b, j=j: float(j.efficiency(np.array(b))))
        )
        ref = max(float(j.throughput(np.array(1.0), np.array(b))) * eff(b) for b in j.batch_sizes)
        options = {}
        for k in range(j.min_gpus, min(j.max_gpus, capacity) + 1):
            s = max(float(j.throughput(np.array(k), np.array(b))) * eff(b) for b in j.batch_sizes)
            r = 1 - j.restart_s / horizon if j.current_gpus and k != j.current_gpus else 1.0
            options[k] = j.priority * util(s / ref * r)
        per_job.append(options)
    best = -math.inf
    for combo in itertools.product(*[list(o) for o in per_job]):
        if sum(combo) <= capacity:
            best = max(best, sum(o[k] for o, k in zip(per_job, combo, strict=True)))
    return best


job_strategy = st.builds(
    lambda i, peak, serial, half, lo, span, cur, prio, phi, batches: OptimizerJob(
        f"j{i}",
        scaling(peak, serial, half),
        batches,
        min_gpus=lo,
        max_gpus=lo + span,
        efficiency=noise(phi),
        priority=prio,
        current_gpus=cur,
        restart_s=30.0,
    ),
    st.integers(0, 10**6),
    st.floats(10, 1000),
    st.floats(0.01, 0.9),
    st.floats(8, 512),
    st.integers(1, 3),
    st.integers(0, 4),
    st.integers(0, 5),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.floats(10, 5000),
    st.lists(st.sampled_from([32, 64, 128, 256, 512]), min_size=1, max_size=3, unique=True).map(
        lambda xs: tuple(sorted(xs))
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(job_strategy, min_size=1, max_size=4, unique_by=lambda j: j.job_id),
    capacity=st.integers(1, 10),
    objective=st.sampled_from(["throughput", "goodput"]),
    power=st.sampled_from([1.0, 0.0, -1.0]),
)
def test_dp_matches_brute_force(jobs, capacity, objective, power):
    # 8 GPUs per node: every count up to 16 is a candidate, so brute force sees the same space
    cluster = Cluster(tuple([8] * (capacity // 8) + ([capacity % 8] if capacity % 8 else [])))
    plan = optimize(jobs, cluster, objective=objective, horizon_s=600.0, fairness=power)
    admitted, waiting = admit(jobs, capacity)
    assert plan.waiting == tuple(j.job_id for j in waiting)
    assert list(plan.assignments) == [j.job_id for j in admitted]
    got = plan.assignments
    assert sum(a.gpus for a in got.values()) <= capacity
    for j in admitted:
        assert j.min_gpus <= got[j.job_id].gpus <= j.max_gpus
        assert got[j.job_id].batch_size in j.batch_sizes
    if admitted:
        expected = brute_force(admitted, capacity, objective, 600.0, power)
        assert plan.value == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_goodput_prefers_smaller_batches_than_throughput():
    job = OptimizerJob("a", scaling(100, 0.5, 64), (32, 64, 128, 256, 512), efficiency=noise(50))
    fast = optimize([job], Cluster((4,)), objective="throughput").assignments["a"]
    good = optimize([job], Cluster((4,)), objective="goodput").assignments["a"]
    assert fast.batch_size == 512
    assert good.batch_size < fast.batch_size


def test_admission_is_first_come_first_served():
    f = scaling(100, 0.1, 64)
    jobs = [
        OptimizerJob("a", f, (64,), min_gpus=4, max_gpus=8),
        OptimizerJob("b", f, (64,), min_gpus=3, max_gpus=8),
        OptimizerJob("c", f, (64,), min_gpus=2, max_gpus=8),  # does not fit after a and b
        OptimizerJob("d", f, (64,), min_gpus=1, max_gpus=8),  # would fit, but waits behind c
    ]
    plan = optimize(jobs, Cluster((4, 4)))
    assert list(plan.assignments) == ["a", "b"]
    assert plan.waiting == ("c", "d")
    assert sum(a.gpus for a in plan.assignments.values()) == 8


def test_restart_only_when_the_gain_over_the_horizon_pays_for_it():
    # "b" would gain ~1% from one more GPU: not worth a 60 s restart over 600 s ...
    flat = scaling(100, 0.98, 64)
    jobs = [OptimizerJob("a", flat, (64,), max_gpus=8, current_gpus=3, restart_s=60)]
    jobs.append(OptimizerJob("b", flat, (64,), max_gpus=8, current_gpus=1, restart_s=60))
    plan = optimize(jobs, Cluster((4,)), horizon_s=600)
    assert {k: a.gpus for k, a in plan.assignments.items()} == {"a": 3, "b": 1}
    assert plan.assignments["a"].reason.startswith("keep")
    # ... while a job that scales well is worth moving
    steep = scaling(100, 0.01, 64)
    jobs = [OptimizerJob("a", flat, (64,), max_gpus=8, current_gpus=3, restart_s=60)]
    jobs.append(OptimizerJob("b", steep, (64,), max_gpus=8, current_gpus=1, restart_s=60))
    plan = optimize(jobs, Cluster((4,)), horizon_s=600)
    assert plan.assignments["b"].gpus == 3
    assert "grow 1->3" in plan.assignments["b"].reason


def test_priority_shifts_gpus():
    f = scaling(100, 0.05, 64)
    even = optimize([OptimizerJob("a", f, (64,)), OptimizerJob("b", f, (64,))], Cluster((8,)))
    assert [a.gpus for a in even.assignments.values()] == [4, 4]
    skew = optimize(
        [OptimizerJob("a", f, (64,), priority=4), OptimizerJob("b", f, (64,))], Cluster((8,))
    )
    assert skew.assignments["a"].gpus > skew.assignments["b"].gpus >= 1


def test_candidate_counts_cover_small_counts_and_ladder():
    assert candidate_counts(1, 8, 4).tolist() == list(range(1, 9))
    ks = candidate_counts(3, 2048, 8, current=77)
    assert ks[0] == 3 and ks[-1] == 2048 and 77 in ks
    assert all(k % 8 == 0 for k in ks if k > 16 and k not in (77, 2048))
    assert len(ks) < 40


def test_bad_input_is_named():
    f = scaling(1, 0.1, 1)
    with pytest.raises(AllocatorError, match="min_gpus"):
        OptimizerJob("a", f, (1,), min_gpus=3, max_gpus=2)
    with pytest.raises(AllocatorError, match="batch_sizes"):
        OptimizerJob("a", f, ())
    with pytest.raises(AllocatorError, match="duplicate job ids"):
        optimize([OptimizerJob("a", f, (1,)), OptimizerJob("a", f, (1,))], Cluster((2,)))
    with pytest.raises(AllocatorError, match="objective='speed'"):
        optimize([], Cluster((2,)), objective="speed")  # type: ignore[arg-type]
    with pytest.raises(AllocatorError, match="predicted throughput is 0"):
        optimize(
            [OptimizerJob("a", lambda k, b: np.zeros(np.broadcast(k, b).shape), (1,))],
            Cluster((2,)),
        )
    with pytest.raises(AllocatorError, match="nodes"):
        Cluster(())


def test_place_keeps_unchanged_jobs_and_packs_the_rest():
    cluster = Cluster((4, 4, 4, 4))
    first = place({"big": 8, "a": 2, "b": 3, "c": 1}, cluster)
    assert first["big"] == (4, 4, 0, 0)  # two whole nodes
    assert sorted(sum(1 for x in p if x) for p in first.values()) == [1, 1, 1, 2]
    again = place({"big": 8, "a": 2, "b": 2, "c": 1}, cluster, first)
    assert again["big"] == first["big"] and again["a"] == first["a"]
    assert again["c"] == first["c"]
    with pytest.raises(AllocatorError, match="cannot place 17"):
        place({"x": 17}, cluster)


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    raw=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    data=st.data(),
)
def test_place_never_over_allocates(nodes, raw, data):
    cluster = Cluster(tuple(nodes))
    counts, left = {}, cluster.capacity
    for i, k in enumerate(raw):
        k = min(k, left)
        counts[f"j{i}"] = k
        left -= k
    first = place(counts, cluster)
    changed = {j: data.draw(st.integers(0, k)) for j, k in counts.items()}
    again = place(changed, cluster, first)
    repacked = place(changed, cluster, first, repack=set(changed))
    for placements, want in ((first, counts), (again, changed), (repacked, changed)):
        used = np.zeros(len(nodes), int)
        for job, p in placements.items():
            assert sum(p) == want[job] and len(p) == len(nodes)
            used += np.array(p)
        assert (used <= np.array(nodes)).all()
        assert set(placements) == {j for j, k in want.items() if k > 0}


def test_repack_moves_a_spread_job_only_onto_fewer_nodes():
    cluster = Cluster((4, 4, 4))
    held = {"spread": (2, 2, 0), "a": (2, 0, 0)}
    # "a" ends: with its own GPUs back, "spread" fits on one node; without repack it stays
    moved = place({"spread": 4}, cluster, held, repack={"spread"})["spread"]
    assert sorted(moved) == [0, 0, 4]
    assert place({"spread": 4}, cluster, held)["spread"] == (2, 2, 0)
    # no node with room for all four: it keeps its GPUs (a restart for nothing is no gain)
    busy = {**held, "b": (0, 1, 1), "c": (0, 0, 3)}
    counts = {"spread": 4, "a": 2, "b": 2, "c": 3}
    assert place(counts, cluster, busy, repack={"spread"})["spread"] == (2, 2, 0)


def test_a_spread_share_lowers_the_value_of_that_count():
    f = scaling(100, 0.01, 8)
    compact = optimize([OptimizerJob("a", f, (64,), max_gpus=8)], Cluster((4, 4)))
    assert compact.assignments["a"].gpus == 8
    spread = optimize([OptimizerJob("a", f, (64,), max_gpus=8, placed={8: 0.3})], Cluster((4, 4)))
    assert spread.assignments["a"].gpus < 8


def test_jobs_evaluated_together_get_the_plan_they_get_one_by_one():
    """ScalingThroughput's ``evaluate_many`` (one broadcast for every job) changes no decision:
    the same functions hidden behind plain lambdas (one call per job) give the same plan."""
    from dloader.allocator.policies import throughput_fn
    from dloader.predictor import ScalingModel, ScalingParams

    def params(i: int) -> ScalingParams:
        return ScalingParams(
            alpha_c=0.01 * (1 + i % 3),
            beta_c=0.002 / (1 + i % 2),
            alpha_n=0.005,
            beta_n=0.001 * (i % 4),
            alpha_r=0.05,
            beta_r=0.004,
            gamma=1.0 + 0.5 * (i % 5),
        )

    def jobs(hide: bool) -> list[OptimizerJob]:
        out = []
        for i in range(12):
            fn = throughput_fn(
                ScalingModel(params(i)),
                4 if i % 3 else 8,  # mixed node sizes, ranges, accumulation, batch lists
                (4 + i % 3, 32 + 16 * (i % 2)),
                accumulate=i % 2 == 0,
            )
            out.append(
                OptimizerJob(
                    f"j{i}",
                    (lambda k, b, fn=fn: fn(k, b)) if hide else fn,
                    (64, 128, 256, 512)[: 1 + i % 4],
                    min_gpus=1 + i % 2,
                    max_gpus=4 + 3 * i,
                    efficiency=noise(100.0 * (1 + i)),
                    current_gpus=i % 5,
                    placed={2: 0.7} if i == 3 else {},
                )
            )
        return out

    for nodes in [(4,) * 6, (8, 4, 4, 2)]:
        together = optimize(jobs(hide=False), Cluster(nodes), fairness=0.0)
        one_by_one = optimize(jobs(hide=True), Cluster(nodes), fairness=0.0)
        assert together == one_by_one
