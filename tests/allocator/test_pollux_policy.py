"""The ``pollux`` policy (Pollux's, from its paper): the power-mean fitness, determinism for a
seed, no over-allocation, at most one distributed job per node, the jobs' limits, and that it
runs through the same simulator and CLI as the other policies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dloader.allocator import AllocatorError, Cluster
from dloader.allocator.policies import JobState, make_policy
from dloader.allocator.policies.pollux import ZERO_SPEEDUP, PolluxPolicy, power_mean
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import load_apps, read_workload

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"


@pytest.fixture(scope="module")
def apps():
    return load_apps(DATA, ["cifar10", "ncf"])


def test_power_mean() -> None:
    v = np.array([1.0, 2.0, 4.0])
    assert power_mean(v, 1.0) == pytest.approx(7 / 3)
    assert power_mean(v, -1.0) == pytest.approx(3 / (1 + 0.5 + 0.25))  # harmonic
    assert power_mean(v, 0.0) == pytest.approx(2.0)  # geometric
    assert power_mean(v, -1.0, np.array([2.0, 1.0, 1.0])) == pytest.approx(4 / (2 + 0.5 + 0.25))
    # rows are scored independently; a lower p favours the balanced row
    rows = np.array([[1.0, 1.0], [0.5, 1.6]])
    assert power_mean(rows, 1.0).argmax() == 1 and power_mean(rows, -1.0).argmax() == 0
    # a job without GPUs at ZERO_SPEEDUP dominates: running one more job comes first
    assert power_mean(np.array([ZERO_SPEEDUP, 10.0]), -1.0) < power_mean(np.array([0.2, 0.2]), -1.0)


def _jobs(apps, n: int, **kw: object) -> list[JobState]:
    names = ["cifar10", "ncf"]
    return [
        JobState(
            f"j{i}",
            float(i),
            apps[names[i % 2]].model,
            1,
            128,
            (64, 4096),
            (8, 512),
            age_s=3600.0,
            **kw,  # type: ignore[arg-type]
        )
        for i in range(n)
    ]


def test_decisions_respect_the_cluster_and_the_jobs(apps) -> None:
    cluster = Cluster.uniform(4, 4)
    jobs = _jobs(apps, 6, max_gpus=6)
    d = PolluxPolicy(population=40, generations=30, seed=1).decide(jobs, cluster)
    per_node = np.zeros(len(cluster.nodes), dtype=int)
    for job_id, placement in d.placements.items():
        assert len(placement) == len(cluster.nodes)
        assert 1 <= sum(placement) <= 6
        per_node += np.array(placement)
        assert job_id in d.batch_sizes and 64 <= d.batch_sizes[job_id] <= 4096
    assert (per_node <= np.array(cluster.nodes)).all()
    spread = [p for p in d.placements.values() if sum(1 for g in p if g) > 1]
    for node in range(len(cluster.nodes)):
        assert sum(1 for p in spread if p[node]) <= 1  # one distributed job per node
    assert set(d.waiting) | set(d.placements) == {j.job_id for j in jobs}


def test_repair_enforces_every_limit_on_random_matrices(apps) -> None:
    policy = PolluxPolicy(seed=3)
    cap = np.array([4, 4, 2])
    lo, hi = np.array([1, 3, 1, 2]), np.array([5, 8, 1, 8])
    states = np.random.default_rng(0).integers(0, 6, size=(500, 4, 3))
    fixed = policy._repair(states, cap, lo, hi)
    k = fixed.sum(axis=2)
    assert (fixed >= 0).all()
    assert (fixed.sum(axis=1) <= cap).all()
    assert ((k == 0) | ((k >= lo) & (k <= hi))).all()
    distributed = (fixed > 0).sum(axis=2) > 1
    assert (((fixed > 0) & distributed[:, :, None]).sum(axis=1) <= 1).all()


def test_deterministic_for_a_seed(apps) -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = _jobs(apps, 5)
    a = PolluxPolicy(population=30, generations=20, seed=7).decide(jobs, cluster)
    b = PolluxPolicy(population=30, generations=20, seed=7).decide(jobs, cluster)
    assert a == b


def test_a_running_job_is_not_moved_for_nothing(apps) -> None:
    cluster = Cluster.uniform(2, 4)
    jobs = [
        JobState(
            "a", 0.0, apps["cifar10"].model, 1, 128, (128, 128), (8, 512),
            placement=(2, 0), batch_size=128, age_s=60.0, max_gpus=2,
        )
    ]  # fmt: skip
    d = PolluxPolicy(population=30, generations=30, seed=0).decide(jobs, cluster)
    assert d.placements == {"a": (2, 0)}


def test_it_runs_in_the_simulator_and_by_name(apps) -> None:
    workload = read_workload(DATA / "workload.csv")
    cluster = Cluster.uniform(3, 4)
    r = Simulator(workload, apps, make_policy("pollux"), cluster).run()
    assert r.policy == "pollux"
    assert all(j.end_s is not None for j in r.jobs)
    assert np.array(list(r.gpus.values())).sum(axis=0).max() <= cluster.capacity
    with pytest.raises(AllocatorError, match="population=1"):
        PolluxPolicy(population=1)


def test_when_gpus_are_short_the_least_served_jobs_get_them(apps) -> None:
    """As in Pollux's simulator: jobs are ordered by the GPU-seconds they have had, and repair
    hands out a node's GPUs in that order; the arrival order does not decide."""
    cluster = Cluster.uniform(1, 2)
    served = {"j0": 5000.0, "j1": 0.0, "j2": 800.0, "j3": 20.0}
    jobs = [
        JobState(
            k, float(i), apps["cifar10"].model, 1, 128, (128, 128), (8, 512),
            max_gpus=1, age_s=3600.0, attained_gpu_s=v,
        )
        for i, (k, v) in enumerate(served.items())
    ]  # fmt: skip
    d = PolluxPolicy(population=30, generations=30, seed=0).decide(jobs, cluster)
    assert set(d.placements) == {"j1", "j3"}
    assert set(d.waiting) == {"j0", "j2"}
