"""Admission by attained service (``goodput-dp``'s ``las`` line, #48): which jobs hold the GPUs
when not every job can have its fewest."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dloader._shared.allocator_messages import JobSpec
from dloader.allocator import AllocatorError, Cluster
from dloader.allocator.config import Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.policies import DpPolicy, JobState, make_policy
from dloader.allocator.store import AllocatorStore
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    jitter_arrivals,
    load_apps,
    read_philly,
    read_workload,
)
from tests.allocator.test_hostile import GOOD as SCALING

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"


@pytest.fixture(scope="module")
def apps():
    return load_apps(DATA, ["cifar10", "ncf"])


def _job(apps, name: str, arrival: float, served: float, running: bool, **kw: object) -> JobState:
    return JobState(
        name, arrival, apps["cifar10"].model, 1, 128, (128, 128), (8, 512),
        max_gpus=1, age_s=36_000.0, attained_gpu_s=served,
        placement=(1,) if running else (), batch_size=128 if running else None,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _policy(admission: str) -> DpPolicy:
    policy = make_policy("goodput-dp")
    assert isinstance(policy, DpPolicy)
    policy.admission = admission  # type: ignore[assignment]
    return policy


def test_a_new_job_displaces_a_long_served_one_only_under_las(apps) -> None:
    """One GPU: a job that has had 20,000 GPU-seconds runs; a new one arrives. First come,
    first served keeps the new one waiting; ``las`` gives it the GPU."""
    cluster = Cluster.uniform(1, 1)
    jobs = [_job(apps, "long", 0.0, 20_000.0, True), _job(apps, "new", 100.0, 0.0, False)]
    fifo = _policy("fifo").decide(jobs, cluster)
    assert set(fifo.placements) == {"long"} and fifo.waiting == ("new",)
    las = _policy("las").decide(jobs, cluster)
    assert set(las.placements) == {"new"} and las.waiting == ("long",)
    assert "waiting, 1 in line" in las.reasons["long"]


def test_within_a_queue_the_running_job_keeps_its_gpu(apps) -> None:
    """Both past the threshold: the one that runs keeps running even though the waiting one
    arrived first (a job that just crossed the threshold is not swapped back: no thrashing);
    both under it: the same."""
    cluster = Cluster.uniform(1, 1)
    policy = _policy("las")
    for served in (5_000.0, 100.0):
        jobs = [
            _job(apps, "early", 0.0, served, False),
            _job(apps, "late", 50.0, served, True),
        ]
        d = policy.decide(jobs, cluster)
        assert set(d.placements) == {"late"} and d.waiting == ("early",)


def test_a_job_restarted_to_its_budget_is_not_preempted_again(apps) -> None:
    """A long-served running job whose restarts already cost its budget's share of its age
    keeps its GPU against a new job."""
    cluster = Cluster.uniform(1, 1)
    policy = _policy("las")
    age, restart = 3_600.0, 30.0
    budget = int(policy.restart_budget * age / restart)  # restarts it may have had
    for restarts, preempted in ((budget - 1, True), (budget, False)):
        long = replace(
            _job(apps, "long", 0.0, 20_000.0, True),
            age_s=age, restarts=restarts, restart_s=restart,
        )  # fmt: skip
        d = policy.decide([long, _job(apps, "new", 100.0, 0.0, False)], cluster)
        assert ("long" in d.waiting) is preempted, restarts


def test_fifo_keeps_the_arrival_order_and_bad_settings_are_refused(apps) -> None:
    assert [make_policy(n).admission for n in ("goodput-dp", "goodput-dp-fifo")] == [  # type: ignore[attr-defined]
        "las",
        "fifo",
    ]
    jobs = [_job(apps, f"j{i}", float(i), 10_000.0 * (i % 2), i % 2 == 0) for i in range(6)]
    assert _policy("fifo").line(jobs) == jobs
    line = [j.job_id for j in _policy("las").line(jobs)]
    assert line == ["j0", "j2", "j4", "j1", "j3", "j5"]  # served < threshold first
    with pytest.raises(AllocatorError, match="admission='lifo'"):
        DpPolicy("x", objective="goodput", fixed_batch=False, admission="lifo")  # type: ignore[arg-type]
    with pytest.raises(AllocatorError, match="las_threshold_gpu_s=0"):
        DpPolicy("x", objective="goodput", fixed_batch=False, las_threshold_gpu_s=0)


def test_jittered_arrivals_move_each_job_within_the_bound_and_repeat_for_a_seed() -> None:
    jobs = read_workload(DATA.parent / "pollux-sim" / "workload.csv")
    a = jitter_arrivals(jobs, seed=3, seconds=30.0)
    assert a == jitter_arrivals(jobs, seed=3, seconds=30.0) != jitter_arrivals(jobs, 4, 30.0)
    assert all(abs(x.time - y.time) <= 30.0 and x.time >= 0 for x, y in zip(a, jobs, strict=True))
    assert [x.name for x in a] == [y.name for y in jobs]
    assert jitter_arrivals(jobs, seed=3, seconds=0.0) == jobs
    with pytest.raises(AllocatorError, match="seconds=-1"):
        jitter_arrivals(jobs, seed=3, seconds=-1.0)


def test_a_steady_load_draw_keeps_the_jobs_and_spaces_them_at_the_rate() -> None:
    """Steady load (Synergy's experiments: jobs at a set rate for hours): the same jobs as the
    trace's window, in order, arriving as a Poisson process at the asked rate; the same for a
    seed."""
    apps = load_apps(PACKAGED_TRACES)
    window = read_philly(PACKAGED_PHILLY, apps, num_jobs=400, seed=5)
    steady = read_philly(PACKAGED_PHILLY, apps, num_jobs=400, seed=5, jobs_per_hour=9.0)
    assert steady == read_philly(PACKAGED_PHILLY, apps, num_jobs=400, seed=5, jobs_per_hour=9)
    assert [replace(j, time=0.0) for j in steady] == [replace(j, time=0.0) for j in window]
    times = [j.time for j in steady]
    assert times[0] == 0.0 and times == sorted(times)
    gaps = np.diff(times)
    # 399 exponential gaps of mean 400 s: their mean within 20% (about 4 standard errors)
    assert np.mean(gaps) == pytest.approx(3600 / 9, rel=0.2)
    assert np.std(gaps) == pytest.approx(np.mean(gaps), rel=0.25)  # exponential: std = mean
    for bad in (0.0, -3.0, math.inf):
        with pytest.raises(AllocatorError, match=f"jobs per hour {bad}"):
            read_philly(PACKAGED_PHILLY, apps, num_jobs=10, seed=5, jobs_per_hour=bad)


def test_a_class_split_draws_image_language_and_speech_jobs_at_its_weights() -> None:
    """Synergy's experiments draw 20% image, 70% language and 10% speech jobs: with a split,
    each job's class follows it, its application within the class its GPU time; the same GPU
    counts and arrivals as without."""
    apps = load_apps(PACKAGED_TRACES)
    plain = read_philly(PACKAGED_PHILLY, apps, num_jobs=1000, seed=7)
    split = read_philly(PACKAGED_PHILLY, apps, num_jobs=1000, seed=7, class_split=(20, 70, 10))
    assert [(j.time, j.num_replicas) for j in split] == [(j.time, j.num_replicas) for j in plain]
    kinds = {"cifar10": 0, "yolov3": 0, "imagenet": 0, "ncf": 1, "bert": 1, "deepspeech2": 2}
    counts = np.bincount([kinds[j.application] for j in split], minlength=3)
    # binomial counts of 1,000 draws: within ~4 standard deviations of 200, 700 and 100
    assert abs(counts - [200, 700, 100]).max() < 60, counts
    only_speech = read_philly(PACKAGED_PHILLY, apps, num_jobs=50, seed=7, class_split=(0, 0, 1))
    assert {j.application for j in only_speech} == {"deepspeech2"}
    bad: Any
    for bad in ((0, 0, 0), (1, -1, 1), (1, 1), (math.nan, 1, 1)):
        with pytest.raises(AllocatorError, match="class split"):
            read_philly(PACKAGED_PHILLY, apps, num_jobs=10, seed=7, class_split=bad)


def one_job_service(tmp_path: Path, gpus: int) -> tuple[AllocatorCore, list[float]]:
    """A live allocator on a clock it is given (``now[0]``, from 1,000 s), one node ``n0`` of
    ``gpus`` GPUs and one one-GPU job ``a``."""
    now = [1000.0]
    c = AllocatorCore(
        AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60), clock=lambda: now[0]
    )
    c.register_node("n0", gpus)
    c.submit(JobSpec(job_id="a", batch_size=64, max_batch_size=64, max_gpus=1, scaling=SCALING))
    return c, now


def test_the_live_allocator_counts_each_jobs_gpu_seconds(tmp_path: Path) -> None:
    """The service's jobs carry the GPU-seconds they held into the policy's view (``las`` and
    ``pollux`` order by it): counted at each decision, for the GPUs held since the last."""
    c, now = one_job_service(tmp_path, 2)
    c.decide()
    assert c.jobs["a"].attained_gpu_s == 0.0 and c.jobs["a"].placement == {"n0": 1}
    now[0] += 120.0
    c.decide()
    assert c.jobs["a"].attained_gpu_s == pytest.approx(120.0)
    assert c._inputs().states[0].attained_gpu_s == pytest.approx(120.0)
    now[0] -= 50.0  # a clock that steps back counts nothing, and nothing twice
    c.decide()
    assert c.jobs["a"].attained_gpu_s == pytest.approx(120.0)
    now[0] += 80.0
    c.decide()
    assert c.jobs["a"].attained_gpu_s == pytest.approx(150.0)


def test_a_restarted_allocator_goes_on_from_each_jobs_stored_service(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Attained GPU-seconds and the share done are stored with each decision: a restarted
    allocator does not see its most served job as new (``las`` would put it first again), and
    the time it was down counts at the job's kept placement. A stored value that no longer
    validates sets that job aside, by name."""
    c, now = one_job_service(tmp_path, 2)
    c.decide()
    c.update("a", [], done=0.25)
    now[0] += 120.0
    c.decide()
    c.store.close()
    now[0] += 60.0  # down for a minute; the job kept its GPU
    again = AllocatorCore(
        AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60), clock=lambda: now[0]
    )
    job = again.jobs["a"]
    assert (job.attained_gpu_s, job.done, job.done_origin) == (120.0, 0.25, (0.0, 0.25))
    assert job.placement == {"n0": 1}
    again.register_node("n0", 2)
    again.decide()
    assert again.jobs["a"].attained_gpu_s == pytest.approx(180.0)
    (state,) = again._inputs().states
    assert state.done == 0.25 and state.done_origin == (0.0, 0.25)
    again.store._exec("UPDATE jobs SET done = 1.5 WHERE job_id = 'a'")
    again.store.close()
    with caplog.at_level(logging.ERROR, logger="dloader.allocator"):
        third = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    assert "a" not in third.jobs
    assert "done: 1.5 must be a finite number within [0.0, 1.0]" in caplog.text
    third.store.close()


def test_durations_as_synergys_artifact_draws_them() -> None:
    """``durations``: ``philly`` keeps each kept job's own trace duration, ``synergy`` draws
    10**U minutes (U on 1.5-3 for 80% of jobs, 3-4 for the rest); both keep, as Synergy's
    artifact does, the jobs that ran 31.6 min to 10**4 min on at most 16 GPUs; ``app`` (the
    default) leaves the length to the application."""
    apps = load_apps(PACKAGED_TRACES)
    plain = read_philly(PACKAGED_PHILLY, apps, num_jobs=400, seed=11)
    assert {j.duration_s for j in plain} == {None}
    lo, hi = 10**1.5 * 60, 10**4 * 60
    own = read_philly(PACKAGED_PHILLY, apps, num_jobs=400, seed=11, durations="philly")
    assert all(lo < j.duration_s < hi for j in own if j.duration_s is not None)
    assert {j.num_replicas for j in own} <= {1, 2, 4, 8, 16}
    drawn = read_philly(PACKAGED_PHILLY, apps, num_jobs=2000, seed=11, durations="synergy")
    minutes = np.array([j.duration_s for j in drawn], dtype=float) / 60
    assert ((minutes > 10**1.5) & (minutes < 10**4)).all()
    assert {j.num_replicas for j in drawn} <= {1, 2, 4, 8, 16}
    # 2,000 draws, 20% of them above 1,000 minutes: within ~4 standard deviations (~18)
    assert abs((minutes > 1000).sum() - 400) < 75
    assert np.log10(minutes[minutes < 1000]).mean() == pytest.approx(2.25, abs=0.05)
    with pytest.raises(AllocatorError, match="durations='long'"):
        read_philly(PACKAGED_PHILLY, apps, num_jobs=10, seed=11, durations="long")  # type: ignore[arg-type]


def test_synergy_models_give_each_job_one_of_its_class_zoo() -> None:
    """``synergy_models``: each job's input pipeline is one of the models Synergy's artifact
    draws for its class, each about equally often; its application (the GPU side) as without."""
    apps = load_apps(PACKAGED_TRACES)
    split = (20.0, 70.0, 10.0)
    plain = read_philly(PACKAGED_PHILLY, apps, num_jobs=600, seed=13, class_split=split)
    zoo = read_philly(
        PACKAGED_PHILLY, apps, num_jobs=600, seed=13, class_split=split, synergy_models=True
    )
    assert {j.cpu_profile for j in plain} == {None}
    classes = {
        "cifar10": {"alexnet", "res18", "res50", "mobilenet", "shufflenet"},
        "yolov3": {"alexnet", "res18", "res50", "mobilenet", "shufflenet"},
        "imagenet": {"alexnet", "res18", "res50", "mobilenet", "shufflenet"},
        "ncf": {"gnmt", "transformer", "lstm"},
        "bert": {"gnmt", "transformer", "lstm"},
        "deepspeech2": {"m5", "deepspeech"},
    }
    assert all(j.cpu_profile in classes[j.application] for j in zoo)
    language = [j.cpu_profile for j in zoo if j.application in ("ncf", "bert")]
    # ~420 language jobs over three models: each within ~4 standard deviations of a third
    for model in ("gnmt", "transformer", "lstm"):
        assert abs(language.count(model) - len(language) / 3) < 4 * (len(language) * 2 / 9) ** 0.5
    with pytest.raises(AllocatorError, match="synergy_models: expected with a class split"):
        read_philly(PACKAGED_PHILLY, apps, num_jobs=10, seed=13, synergy_models=True)
