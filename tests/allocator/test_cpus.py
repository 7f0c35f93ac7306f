"""CPU cores in the cluster allocator: the resource model, the division of a node's cores, the
CPU-aware placement, Synergy-TUNE, and the simulator's CPUs (Synergy's profiles)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dloader.allocator import AllocatorError, Cluster
from dloader.allocator.cpu_profiles import (
    APP_PROFILES,
    CpuProfile,
    input_truth,
    read_cpu_profiles,
)
from dloader.allocator.optimizer import place
from dloader.allocator.policies import ClusterDecision, JobState, SynergyPolicy, make_policy
from dloader.allocator.policies.cores import (
    borrowed_cores,
    divide_cores,
    fed_table,
    feed_cores,
    feed_rate,
    proportional_cores,
    water_fill,
)
from dloader.allocator.sim_cli import main
from dloader.allocator.simulator import Simulator
from dloader.allocator.traces import POLLUX_CONSTANTS, WorkloadJob, load_apps, read_workload
from dloader.predictor import InputModel, ScalingModel, ScalingParams

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"
#: Linear scaling: every GPU adds the same samples/s (1 per ms of compute).
LINEAR = ScalingModel(ScalingParams(0.0, 1e-3, 0.0, 0.0, 0.0, 0.0, 1.0))


@pytest.fixture(scope="module")
def apps():
    return load_apps(DATA, ["cifar10", "ncf"])


@pytest.fixture(scope="module")
def workload():
    return read_workload(DATA / "workload.csv")


def _job(job_id: str, gpus: int = 1, placement: tuple[int, ...] = (), **kw) -> JobState:
    return JobState(
        job_id,
        kw.pop("arrival", 0.0),
        kw.pop("model", LINEAR),
        requested_gpus=gpus,
        requested_batch=kw.pop("batch", 64),
        batch_range=(64, 64),
        local_bsz_range=(1, 64),
        placement=placement,
        **kw,
    )


def test_a_cluster_takes_one_core_count_per_node() -> None:
    assert Cluster.uniform(2, 4, 12).cpus == (12.0, 12.0)
    assert Cluster.uniform(2, 4).cpus is None
    for bad in ((12.0,), (12.0, 0.0), (12.0, math.nan)):
        with pytest.raises(AllocatorError, match="cpus="):
            Cluster((4, 4), bad)


def test_water_filling_gives_what_is_needed_then_equal_shares() -> None:
    assert water_fill(np.array([1.0, 2.0]), np.ones(2), 10.0).tolist() == [1.0, 2.0]
    got = water_fill(np.array([1.0, 8.0, 8.0]), np.ones(3), 9.0)
    assert got.tolist() == pytest.approx([1.0, 4.0, 4.0])
    weighted = water_fill(np.array([9.0, 9.0]), np.array([2.0, 1.0]), 6.0)
    assert weighted.tolist() == pytest.approx([4.0, 2.0])


def test_a_nodes_cores_go_first_to_what_each_job_needs() -> None:
    cluster = Cluster((4, 4), (12.0, 12.0))
    placements = {"light": (2, 0), "hungry": (2, 0), "alone": (0, 2)}
    cores = divide_cores(placements, {"light": 1.0, "hungry": 30.0}, {}, cluster)
    assert cores["light"] == (1.0, 0.0)
    assert cores["hungry"] == (11.0, 0.0)  # the rest of the node, not half
    assert cores["alone"] == (0.0, 12.0)  # need unknown: all it can get (idle GPUs' cores too)
    assert proportional_cores(placements, cluster)["light"] == (6.0, 0.0)
    assert divide_cores(placements, {}, {}, Cluster((4, 4))) == {}
    # a job on two nodes: its need split by its GPUs on each; weights where the cores run short
    wide = {"a": (2, 2), "b": (2, 0), "c": (0, 2)}
    cores = divide_cores(wide, {"a": 8.0, "b": 30.0, "c": 1.0}, {"b": 3.0}, cluster)
    # node 0: a needs 4, b 15 of 12: water-filled by GPUs x weight (a 2, b 6): a 3, b 9;
    # node 1: a 4 and c 1 fit, the 7 left split by their GPUs
    assert cores["a"] == pytest.approx((3.0, 7.5)) and cores["b"] == pytest.approx((9.0, 0.0))
    assert cores["c"] == pytest.approx((0.0, 4.5))
    short = divide_cores(wide, {"a": 40.0, "b": 30.0}, {"b": 3.0}, cluster)
    assert short["a"][0] == pytest.approx(3.0) and short["b"][0] == pytest.approx(9.0)
    assert divide_cores({}, {}, {}, cluster) == {}
    # a job holding no GPU gets no core; a node no job holds gives none
    assert divide_cores({"none": (0, 0), "b": (0, 2)}, {}, {}, cluster) == {
        "none": (0.0, 0.0),
        "b": (0.0, 12.0),
    }
    assert divide_cores({"none": (0, 0)}, {}, {}, cluster) == {"none": (0.0, 0.0)}


def test_the_dp_values_a_count_at_what_its_cores_feed() -> None:
    feed = fed_table(InputModel.linear(10.0), cores_per_gpu=3.0)  # 30 samples/s per GPU's cores
    table = np.array([[20.0, 50.0], [40.0, 100.0]])
    assert feed(np.array([1.0, 2.0]), table).tolist() == [[20.0, 30.0], [40.0, 60.0]]


def test_a_cpu_hungry_part_goes_where_the_free_cores_cover_it() -> None:
    cluster = Cluster((2, 2), (2.0, 2.0))
    counts = {"a-hungry": 1, "b-hungry": 1, "c-light": 1, "d-light": 1}
    need = {"a-hungry": 1.8, "b-hungry": 1.8, "c-light": 0.2, "d-light": 0.2}
    blind = place(counts, cluster)
    aware = place(counts, cluster, cores=need)
    assert blind["a-hungry"] == blind["b-hungry"]  # GPUs alone: packed side by side
    assert aware["a-hungry"] != aware["b-hungry"]  # each beside a light one
    assert aware["a-hungry"] in ((1, 0), (0, 1)) and aware["c-light"] != aware["d-light"]


def test_with_unlimited_cores_the_cpu_aware_policy_decides_as_today(apps, workload) -> None:
    cluster = Cluster.uniform(3, 4)
    runs = {
        p: Simulator(workload, apps, make_policy(p), cluster).run()
        for p in ("goodput-dp", "goodput-dp-cpu-blind")
    }
    aware, blind = runs["goodput-dp"], runs["goodput-dp-cpu-blind"]
    assert aware.gpus == blind.gpus
    assert [j.jct_s for j in aware.jobs] == [j.jct_s for j in blind.jobs]
    assert math.isnan(aware.summary()["cpu_utilisation"])
    assert all(j.input_s == 0 and j.cpu_seconds == 0 for j in aware.jobs)


@pytest.mark.parametrize(
    "policy",
    [
        "goodput-dp",
        "goodput-dp-cpu-blind",
        "pollux",
        "synergy",
        "synergy-fifo",
        "synergy-proportional",
    ],
)
def test_with_cpus_every_policy_completes_within_the_nodes_cores(apps, workload, policy) -> None:
    cluster = Cluster.uniform(3, 4, 6.0)
    r = Simulator(workload, apps, make_policy(policy), cluster).run()
    assert all(j.end_s is not None for j in r.jobs)
    s = r.summary()
    assert 0 < s["cpu_utilisation"] <= 1 and 0 < s["gpu_utilisation"] <= 1
    # cifar10 (ResNet-18's profile) waits for its input at 1.5 cores per GPU; ncf (flat) barely
    losses = r.losses()
    assert losses["cifar10"]["input"] > 0.1 * losses["cifar10"]["jct"]
    assert losses["ncf"]["input"] < losses["cifar10"]["input"]
    for m in losses.values():
        parts = ("queue", "restart", "placement", "input", "run")
        assert m["jct"] == pytest.approx(sum(m[k] for k in parts))
        assert m["run"] > 0


def test_limited_cores_slow_the_jobs_and_more_cores_help(apps, workload) -> None:
    def avg(cpus: float | None) -> float:
        cluster = Cluster.uniform(3, 4, cpus)
        r = Simulator(workload, apps, make_policy("goodput-dp"), cluster).run()
        return float(r.summary()["avg_jct_s"])

    unlimited, ample, tight = avg(None), avg(48.0), avg(4.0)
    assert tight > ample >= unlimited * 0.999


def test_online_a_jobs_input_is_what_it_ran_at(apps, workload) -> None:
    seen: list[tuple[str, InputModel | None, int]] = []

    class Spy:
        name = "spy"

        def __init__(self) -> None:
            self.inner = make_policy("goodput-dp")

        def decide(self, jobs, cluster):
            seen.extend((j.job_id, j.input, j.gpus) for j in jobs)
            return self.inner.decide(jobs, cluster)

    Simulator(workload, apps, Spy(), Cluster.uniform(3, 4, 6.0)).run()
    first = {}
    for job_id, model, gpus in seen:
        first.setdefault(job_id, (model, gpus))
    assert all(m is None for m, _ in first.values())  # before it ran: nothing known
    known = [(job_id, m) for job_id, m, _ in seen if m is not None]
    assert known
    sim = Simulator(workload, apps, make_policy("goodput-dp"), Cluster.uniform(3, 4, 6.0))
    for job_id, m in known:  # each point is the truth at a core count the job ran at
        truth = sim.inputs[job_id.split("-")[0]]
        for c, r in m.points:
            assert r == pytest.approx(truth.rate(c), rel=1e-6)


def test_with_a_prior_a_new_job_brings_what_its_applications_jobs_measured(apps, workload) -> None:
    first: dict[str, tuple[InputModel | None, bool]] = {}
    ran: set[str] = set()

    class Spy:
        name = "spy"

        def __init__(self) -> None:
            self.inner = make_policy("goodput-dp")

        def decide(self, jobs, cluster):
            for j in jobs:  # its input at its first decision; had its application run yet?
                app = j.job_id.split("-")[0]
                first.setdefault(j.job_id, (j.input, app in ran))
                if j.placement:
                    ran.add(app)
            return self.inner.decide(jobs, cluster)

    cluster = Cluster.uniform(3, 4, 6.0)
    sim = Simulator(workload, apps, Spy(), cluster, input_prior=True)
    sim.run()
    later = [(job_id, m) for job_id, (m, before) in first.items() if before]
    assert later and all(m is not None for _, m in later)
    for job_id, m in later:  # the truth at core counts per GPU its application ran at
        truth = sim.inputs[job_id.split("-")[0]]
        assert all(r == pytest.approx(truth.rate(c), rel=1e-6) for c, r in m.points)
    assert any(m is None for m, before in first.values() if not before)  # the very first


def test_synergy_places_a_hungry_job_beside_a_light_one_and_never_below_its_share() -> None:
    cluster = Cluster((2, 2), (6.0, 6.0))  # 3 cores per GPU
    light = InputModel.linear(1e6)

    def decide(hungry: InputModel):
        jobs = [
            _job("h1", 1, input=hungry, arrival=0),
            _job("h2", 1, input=hungry, arrival=1),
            _job("l1", 1, input=light, arrival=2),
            _job("l2", 1, input=light, arrival=3),
        ]
        d = SynergyPolicy("fifo").decide(jobs, cluster)
        for n in range(2):
            assert sum(c[n] for c in d.cores.values()) <= 6.0 + 1e-9
        assert all(sum(d.cores[j]) < 0.01 for j in ("l1", "l2"))  # needs less than its share
        assert all(d.batch_sizes[j.job_id] == 64 for j in jobs)
        return d

    # 1,000 samples/s per GPU (LINEAR at batch 64); 200 per core: 5 cores, more than its share
    d = decide(InputModel.linear(200.0))
    assert d.placements["h1"] != d.placements["h2"]  # best fit of the whole demand: apart
    assert all(sum(d.cores[j]) == pytest.approx(5.0) for j in ("h1", "h2"))
    # a demand no server holds (20 cores): the proportional share, best fit (side by side)
    d = decide(InputModel.linear(50.0))
    assert all(sum(d.cores[j]) == pytest.approx(3.0) for j in ("h1", "h2"))


def test_synergy_gives_unknown_jobs_their_share_and_las_preempts() -> None:
    cluster = Cluster((2,), (4.0,))
    old = _job("old", 2, placement=(2,), attained_gpu_s=1e5, arrival=0)
    new = _job("new", 2, arrival=10)
    d = SynergyPolicy("las").decide([old, new], cluster)
    assert "new" in d.placements and "old" not in d.placements
    assert d.cores["new"] == (4.0,)  # input unknown: the GPU-proportional share
    assert "preempted" in d.reasons["old"]
    fifo = SynergyPolicy("fifo").decide([old, new], cluster)
    assert "old" in fifo.placements and fifo.waiting == ("new",)
    with pytest.raises(AllocatorError, match="order="):
        SynergyPolicy("srtf")


def test_synergy_decides_in_rounds_and_re_places_every_job_each_round() -> None:
    cluster = Cluster((4, 4), (12.0, 12.0))
    policy = SynergyPolicy("las")
    # continuous LAS: 100 GPU-s before 200 (one queue under a discretised 3,600-s split)
    a = _job("a", 4, attained_gpu_s=200.0, arrival=0.0, age_s=600.0)
    b = _job("b", 4, attained_gpu_s=100.0, arrival=1.0, age_s=599.0)
    c = _job("c", 2, attained_gpu_s=0.0, arrival=2.0, age_s=598.0)
    first = policy.decide([a, b, c], cluster)  # a round at t=600
    assert set(first.placements) == {"b", "c"} and first.waiting == ("a",)
    assert first.placements["b"] in ((4, 0), (0, 4))  # the largest placed first, best fit
    # 120 s later, mid-round: c has finished and d arrived; nothing moves, d waits, c's GPUs idle
    b1 = replace(b, placement=first.placements["b"], age_s=719.0, attained_gpu_s=580.0)
    d = _job("d", 1, arrival=700.0, age_s=20.0)
    mid = policy.decide([a, b1, d], cluster)
    assert mid.placements == {"b": first.placements["b"]} and set(mid.waiting) == {"a", "d"}
    assert "round at 900" in mid.reasons["d"]
    assert mid.cores["b"] == first.cores["b"]
    # the round at t=900: all afresh in LAS order (d 0, a 200, b 1,780 GPU-s)
    b2 = replace(b1, age_s=899.0, attained_gpu_s=1780.0)
    nxt = policy.decide([a, b2, replace(d, age_s=200.0)], cluster)
    assert set(nxt.placements) == {"a", "d"} and nxt.waiting == ("b",)
    assert "preempted" in nxt.reasons["b"]
    # a caller that gives no ages (the live service): every decision is a round
    live = SynergyPolicy("las")
    live.decide([replace(j, age_s=None) for j in (a, b, c)], cluster)
    again = live.decide([replace(a, age_s=None), replace(b1, age_s=None), d], cluster)
    assert "d" in again.placements
    with pytest.raises(AllocatorError, match="round_s"):
        SynergyPolicy(round_s=0.0)


def test_a_synergy_round_keeps_a_running_job_where_it_still_fits() -> None:
    cluster = Cluster((4, 4), (12.0, 12.0))
    ran = _job("ran", 1, placement=(0, 1), attained_gpu_s=100.0, age_s=400.0)
    new = _job("new", 1, arrival=300.0, age_s=100.0)
    kept = SynergyPolicy("las").decide([ran, new], cluster)
    assert kept.placements == {"ran": (0, 1), "new": (0, 1)}  # beside it: best fit
    # from scratch (the artifact's simulator): LAS puts new first on node 0, ran follows it
    moved = SynergyPolicy("las", keep=False).decide([ran, new], cluster)
    assert moved.placements == {"new": (1, 0), "ran": (1, 0)}


def test_the_shipped_profiles_map_every_pollux_application() -> None:
    profiles = read_cpu_profiles()
    assert set(APP_PROFILES) == set(POLLUX_CONSTANTS)
    assert set(APP_PROFILES.values()) <= set(profiles)
    res18 = profiles["res18"]
    assert res18.share(3.0) == pytest.approx(1.0 / 2.4)  # 1.0 at 3 cores, 2.4 at its ideal
    assert res18.share(9.0) == 1.0 and profiles["bert"].share(1.0) == 1.0


def test_a_faster_gpu_needs_proportionally_more_cores(apps) -> None:
    profile = CpuProfile("p", ((1.0, 0.25), (4.0, 1.0)))
    v100 = input_truth(apps["cifar10"], profile, 1.0)
    h100 = input_truth(apps["cifar10"], profile, 3.0)
    rate = v100.rate(4.0)
    assert h100.cores_for(rate) == pytest.approx(3 * v100.cores_for(rate))
    with pytest.raises(AllocatorError, match="gpu_speed"):
        input_truth(apps["cifar10"], profile, 0.0)


#: Synergy's multi-GPU tables (msr-fiddle/synergy at 1b013c2, ``simulator/models/<model>_<k>.py``;
#: MIT, see ``dloader/allocator/data/NOTICE.md``): a job's speed on ``k`` GPUs of one server at
#: 1, 2, 3, 4, 5, 6 and 9 cores per GPU (as far as the 24-core server allows), relative to 3
#: cores per GPU, the same in every memory column profiled.
SYNERGY_MULTI_GPU = {
    ("res18", 2): (0.37, 0.72, 1.0, 1.3, 1.53, 1.75, 2.4),
    ("res18", 4): (0.37, 0.72, 1.0, 1.3, 1.53, 1.75),
    ("res50", 2): (0.4, 0.74, 1.0, 1.0, 1.0, 1.0, 1.0),
    ("res50", 4): (0.4, 0.74, 1.0, 1.0, 1.0, 1.0),
    ("deepspeech", 2): (0.3, 0.66, 1.0, 1.0, 1.0, 1.0, 1.0),
    ("deepspeech", 4): (0.3, 0.66, 1.0, 1.0, 1.0, 1.0),
}
SYNERGY_CORES_PER_GPU = (1, 2, 3, 4, 5, 6, 9)


class _Pinned:
    """Every job on ``gpus`` GPUs of node 0 with ``cores`` cores, at its requested batch."""

    name = "pinned"

    def __init__(self, gpus: int, cores: float) -> None:
        self.gpus, self.cores = gpus, cores

    def decide(self, jobs, cluster):
        ids = [j.job_id for j in jobs]
        return ClusterDecision(
            {i: (self.gpus,) for i in ids},
            {j.job_id: j.requested_batch for j in jobs},
            {i: "pinned" for i in ids},
            (),
            {i: (self.cores,) for i in ids},
        )


def _fed_share(apps, profile: CpuProfile, gpus: int, cores: float) -> float:
    """The share of its GPUs' speed a job on ``gpus`` GPUs of one node with ``cores`` cores
    is fed in the simulator (a cifar10 job run to completion with ``profile`` as its truth)."""
    job = WorkloadJob("cifar10-0", 0.0, "cifar10", gpus, 512 * gpus)
    sim = Simulator(
        [job],
        apps,
        _Pinned(gpus, cores),
        Cluster.uniform(1, 4, cores),
        learning="oracle",
        cpu_profiles={"res18": profile},
    )
    (r,) = sim.run().jobs
    assert r.jct_s is not None
    running = r.jct_s - r.queue_s - r.restart_s - r.placement_s
    return 1.0 - r.input_s / running


@pytest.mark.parametrize(("model", "gpus"), sorted(SYNERGY_MULTI_GPU))
def test_the_simulator_feeds_a_multi_gpu_job_as_synergys_multi_gpu_tables(
    apps, model, gpus
) -> None:
    """Where the pipeline binds (below the table's top speed), ``k`` GPUs at ``u`` cores per GPU
    run at the table's speed relative to 1 core per GPU: each GPU's loader on its share of the
    cores, not one pipeline on all of them (which gets 4-10% off on res18)."""
    profile = read_cpu_profiles()[model]
    table = dict(zip(SYNERGY_CORES_PER_GPU, SYNERGY_MULTI_GPU[model, gpus], strict=False))
    base = _fed_share(apps, profile, gpus, float(gpus))
    assert base < 1.0  # input-bound at 1 core per GPU: the comparison is meaningful
    bound = [u for u, speed in table.items() if speed < max(table.values()) and u > 1]
    assert bound
    for u in bound:
        share = _fed_share(apps, profile, gpus, float(u * gpus))
        assert share / base == pytest.approx(table[u] / table[1], rel=0.02), (model, gpus, u)


class _Apart:
    """Each job alone on its own node (job ``i`` on node ``i``), all its GPUs, cores left to
    the simulator (CPU-blind: the GPU-proportional division)."""

    name = "apart"

    def decide(self, jobs, cluster):
        placements = {}
        for i, j in enumerate(jobs):
            row = [0] * len(cluster.nodes)
            row[i] = cluster.nodes[i]
            placements[j.job_id] = tuple(row)
        return ClusterDecision(
            placements,
            {j.job_id: j.requested_batch for j in jobs},
            {j.job_id: "apart" for j in jobs},
            (),
        )


def test_pooled_cores_feed_a_hungry_job_from_a_light_neighbours_node(apps) -> None:
    """The pooled same-cores reference: the same cores, no node boundaries, divided by need."""
    jobs = [
        WorkloadJob("cifar10-0", 0.0, "cifar10", 4, 2048),  # hungry (res18's profile)
        WorkloadJob("ncf-1", 0.0, "ncf", 4, 4096),  # light (flat profile)
    ]
    cluster = Cluster.uniform(2, 4, 4.0)

    def run(pooled: bool):
        sim = Simulator(jobs, apps, _Apart(), cluster, learning="oracle", pooled_cores=pooled)
        return {j.name: j for j in sim.run().jobs}

    nodes, pooled = run(False), run(True)
    hungry, light = "cifar10-0", "ncf-1"
    assert pooled[hungry].jct_s < nodes[hungry].jct_s * 0.8  # the light node's spare cores
    assert pooled[hungry].input_s < nodes[hungry].input_s
    assert pooled[light].input_s == pytest.approx(nodes[light].input_s, abs=1.0)  # still fed
    both = max(j.end_s for j in pooled.values())
    assert sum(j.cpu_seconds for j in pooled.values()) <= 8.0 * both * (1 + 1e-6)
    with pytest.raises(AllocatorError, match="pooled cores"):
        Simulator(jobs, apps, _Apart(), Cluster.uniform(2, 4), pooled_cores=True)


def test_feeding_k_gpus_is_k_loaders_each_on_its_share() -> None:
    one_gpu = InputModel(((1.0, 100.0), (4.0, 250.0)))
    assert feed_rate(one_gpu, 2, 2.0) == pytest.approx(2 * 100.0)
    assert feed_rate(one_gpu, 4, 10.0) == pytest.approx(4 * one_gpu.rate(2.5))
    assert feed_cores(one_gpu, 4, feed_rate(one_gpu, 4, 10.0)) == pytest.approx(10.0)
    assert feed_rate(one_gpu, 0, 8.0) == 0.0 and feed_cores(one_gpu, 0, 10.0) == 0.0
    # the DP's view: k GPUs with rho cores each are fed k * R(rho)
    table = np.full((3, 1), 1e9)
    capped = fed_table(one_gpu, 4.0)(np.array([1.0, 2.0, 4.0]), table)
    assert capped[:, 0] == pytest.approx([250.0, 500.0, 1000.0])


def test_bad_profile_files_are_refused_with_the_line(tmp_path) -> None:
    bad = tmp_path / "p.csv"
    bad.write_text("model,cpus_per_gpu\nres18,3\n")
    with pytest.raises(AllocatorError, match="missing column"):
        read_cpu_profiles(bad)
    bad.write_text(
        "model,cpus_per_gpu,mem_gb_per_gpu,speed,speedup_at_ideal\nres18,three,250,1,2\n"
    )
    with pytest.raises(AllocatorError, match="line 2"):
        read_cpu_profiles(bad)
    with pytest.raises(AllocatorError, match="No such file"):
        read_cpu_profiles(tmp_path / "missing.csv")


def test_an_application_without_a_profile_is_named(apps, workload) -> None:
    profiles = {"lstm": CpuProfile("lstm", ((1.0, 1.0),))}
    with pytest.raises(AllocatorError, match="'cifar10' has no CPU profile 'res18'"):
        Simulator(
            workload,
            apps,
            make_policy("goodput-dp"),
            Cluster.uniform(3, 4, 6),
            cpu_profiles=profiles,
        )


def test_sim_cli_takes_cpus_and_reports_cpu_use(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    base = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "3"]
    rc = main(
        [
            *base,
            "--cpus-per-node",
            "6",
            "--policy",
            "goodput-dp,synergy",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["cluster"]["cpus_per_node"] == 6.0
    assert 0 < result["policies"]["synergy"]["cpu_utilisation"] <= 1
    assert "CPU util" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*base, "--cpus-per-node", "0", "--out", str(out)])
    assert "--cpus-per-node" in capsys.readouterr().err
    bound = [*base, "--cpus-per-node", "6", "--policy", "goodput-dp", "--quiet", "--out", str(out)]
    assert main([*bound, "--pooled-cores", "--input-prior"]) == 0
    assert json.loads(out.read_text())["jobs_completed"] > 0
    assert main([*base, "--pooled-cores", "--out", str(out), "--quiet"]) != 0
    assert "--pooled-cores" in capsys.readouterr().err


# ---------------------------------------------------------------------- a CPU pool (#47)


def test_the_pool_goes_to_what_jobs_are_short_of_within_what_they_can_use() -> None:
    from dloader.allocator.policies.cores import divide_pool

    cluster = Cluster((4, 4), (4.0, 4.0), pool=6.0, pool_efficiency=0.5)
    short = {"a": 1.0, "b": 5.0, "fed": 0.0, "local-only": 3.0}
    most = {"a": 10.0, "b": 10.0, "fed": 10.0, "local-only": 0.0}
    got = divide_pool(short, most, {}, cluster)
    # a needs 1 / 0.5 = 2 pool cores; b the rest (4 of the 10 it would need); nothing to a job
    # that is fed or whose loaders have no remote workers
    assert got == pytest.approx({"a": 2.0, "b": 4.0})
    assert divide_pool(short, {"a": 1.0, "b": 1.0}, {}, cluster) == {"a": 1.0, "b": 1.0}
    assert divide_pool(short, most, {}, Cluster((4, 4), (4.0, 4.0))) == {}
    with pytest.raises(AllocatorError, match="pool="):
        Cluster((4,), (4.0,), pool=-1.0)


def test_goodput_dp_gives_the_pool_to_a_starved_job_that_can_use_it() -> None:
    """A job whose pipeline feeds 10 samples/s a core, on 4 GPUs that compute 4,000: its
    node's 4 cores feed 40; the pool's cores go to it, at their efficiency, and its batch is
    refitted to what it has in all. A job whose loaders have no remote workers gets none."""
    cluster = Cluster((4, 4), (4.0, 4.0), pool=8.0, pool_efficiency=0.75)
    slow = InputModel.linear(10.0)
    jobs = [
        _job("starved", 4, input=slow, remote_max=100.0),
        _job("no-remote", 4, input=slow, remote_max=0.0),
    ]
    d = make_policy("goodput-dp").decide(jobs, cluster)
    assert d.remote == {"starved": pytest.approx(8.0)}
    assert "8.0 pool cores" in d.reasons["starved"]
    plain = make_policy("goodput-dp").decide(jobs, Cluster((4, 4), (4.0, 4.0)))
    assert plain.remote == {}
    blind = make_policy("goodput-dp-cpu-blind").decide(jobs, cluster)
    assert blind.remote == {}


def test_goodput_dp_queues_a_cpu_hungry_job_the_cores_cannot_feed() -> None:
    """One node, 4 GPUs, 4 cores. A running job needs 3 cores to feed its GPU (1,000
    samples/s, 333 a core); a second such job would leave both on 2 cores each: it waits, and
    a CPU-light job behind it gets the GPU. Without core-aware admission both hungry jobs run."""
    cluster = Cluster((4,), (4.0,))
    hungry, light = InputModel.linear(1000.0 / 3), InputModel.linear(1e6)
    jobs = [
        _job("ran", 1, placement=(1,), input=hungry, batch_size=64, max_gpus=1, age_s=600.0),
        _job("next", 1, input=hungry, arrival=10.0, max_gpus=1),
        _job("light", 1, input=light, arrival=20.0, max_gpus=1),
    ]
    d = make_policy("goodput-dp").decide(jobs, cluster)
    assert set(d.placements) == {"ran", "light"} and d.waiting == ("next",)
    assert "CPU-hungry (3.0 cores to feed 1 GPU(s))" in d.reasons["next"]
    assert "need 3.0 of the cluster's 4 cores" in d.reasons["next"]
    assert sum(d.cores["ran"]) >= 3.0  # all it needs (and a share of the spare)
    plain = make_policy("goodput-dp-no-core-admission").decide(jobs, cluster)
    assert set(plain.placements) == {"ran", "next", "light"}
    # with the cores it needs (8 on the node), it runs
    roomy = make_policy("goodput-dp").decide(jobs, Cluster((4,), (8.0,)))
    assert set(roomy.placements) == {"ran", "next", "light"}
    # the running job long served: the new one is ahead of it in line (least attained
    # service first), so the cores go to the new one first and it is not queued behind it
    served = [replace(jobs[0], attained_gpu_s=1e5), *jobs[1:]]
    ahead = make_policy("goodput-dp").decide(served, cluster)
    assert set(ahead.placements) == {"ran", "next", "light"}
    # with lengths known: a waiting job with fewer GPU-seconds left than the running one does
    # not wait for its cores (shortest remaining first); one with more still does
    long_run = replace(jobs[0], attained_gpu_s=3_600.0, done=0.1)  # 32,400 GPU-s left
    for done, waits in ((0.5, False), (0.01, True)):
        resumed = replace(jobs[1], attained_gpu_s=900.0, done=done)  # 900 or 89,100 left
        d = make_policy("goodput-dp").decide([long_run, resumed, jobs[2]], cluster)
        assert (d.waiting == ("next",)) is waits, (done, d.waiting)
        if waits:
            assert "the jobs ahead with at most 178200 GPU-s left need 3.0" in d.reasons["next"]
        fifo = make_policy("goodput-dp-core-fifo").decide([long_run, resumed, jobs[2]], cluster)
        assert fifo.waiting == ("next",)  # the ablation waits for every job ahead
    # about as much left as the job ahead (within CORE_LENGTH_FACTOR): it waits its turn
    alike = replace(jobs[1], attained_gpu_s=900.0, done=0.05)  # 17,100 left against 32,400
    d = make_policy("goodput-dp").decide([long_run, alike, jobs[2]], cluster)
    assert d.waiting == ("next",)


def test_a_pool_speeds_up_cpu_starved_jobs_in_the_simulator(apps, workload) -> None:

    tight = Cluster.uniform(3, 4, 4.0)

    def run(cluster: Cluster):  # type: ignore[no-untyped-def]
        return Simulator(workload, apps, make_policy("goodput-dp"), cluster).run()

    none, pooled = run(tight), run(replace(tight, pool=12.0, pool_efficiency=0.9))
    s = pooled.summary()
    assert 0 < s["pool_utilisation"] <= 1
    assert s["avg_jct_s"] < none.summary()["avg_jct_s"]
    assert sum(j.remote_seconds for j in pooled.jobs) > 0
    assert math.isnan(none.summary()["pool_utilisation"])


class _Tampered:
    """A registered policy whose every decision ``change(decision, cluster)`` alters, to see the
    simulator refuse what a policy must not give out."""

    name = "tampered"

    def __init__(self, policy: str, change) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.change = make_policy(policy), change

    def decide(self, jobs, cluster):  # type: ignore[no-untyped-def]
        return self.change(self.inner.decide(jobs, cluster), cluster)


def test_the_simulator_refuses_a_policy_that_overdraws_the_pool(apps, workload) -> None:
    greedy = _Tampered(
        "goodput-dp", lambda d, cluster: replace(d, remote={j: cluster.pool for j in d.placements})
    )
    cluster = Cluster.uniform(
        3,
        4,
        4.0,
    )
    with pytest.raises(AllocatorError, match="pool cores"):
        Simulator(workload, apps, greedy, replace(cluster, pool=2.0)).run()


def test_sim_cli_takes_a_cpu_pool(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    base = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "3"]
    rc = main(
        [*base, "--cpus-per-node", "4", "--cpu-pool-nodes", "1", "--cpu-pool-cores", "6",
         "--out", str(out), "--quiet"]
    )  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["cluster"]["cpu_pool_cores"] == 6.0
    assert 0 < result["pool_utilisation"] <= 1
    assert main([*base, "--cpu-pool-nodes", "1", "--out", str(out), "--quiet"]) == 2
    assert "--cpus-per-node" in capsys.readouterr().err


def test_spare_cores_are_what_a_nodes_own_jobs_do_not_need() -> None:
    from dloader.allocator.policies.cores import spare_cores

    cluster = Cluster((4, 4, 4), (8.0, 8.0, 8.0))
    placements = {"hungry": (4, 0, 0), "light": (0, 2, 0), "split": (0, 2, 2)}
    need = {"hungry": 20.0, "light": 1.0, "split": 4.0}
    cores = divide_cores(placements, need, {}, cluster)
    # node 0 is short; node 1 keeps light's 1 and split's half (2) of what they need; node 2
    # split's other half; a job without a known need counts all it got
    assert spare_cores(placements, cores, need, cluster) == pytest.approx((0.0, 5.0, 6.0))
    assert spare_cores(placements, cores, {"hungry": 20.0}, cluster) == pytest.approx(
        (0.0, 0.0, 0.0)
    )
    assert spare_cores(placements, {}, need, Cluster((4, 4, 4))) == ()
    lends = replace(cluster, lends=(True, False, True))  # the second node's Ray hosts none
    assert spare_cores(placements, cores, need, lends) == pytest.approx((0.0, 0.0, 6.0))


def test_goodput_dp_lend_feeds_a_starved_job_from_a_light_nodes_spare_cores() -> None:
    """Two nodes of 4 GPUs and 4 cores: a job whose pipeline feeds 10 samples/s a core on one,
    a job that needs almost no cores on the other. goodput-dp-lend lends the light node's
    spare to the starved job's remote workers; the light job keeps what it needs; the starved
    node lends nothing; each borrowed core is named by its lender. goodput-dp does not lend."""
    cluster = Cluster((4, 4), (4.0, 4.0), pool_efficiency=0.75)
    jobs = [
        _job("starved", 4, input=InputModel.linear(10.0), remote_max=math.inf, max_gpus=4),
        _job("light", 4, input=InputModel.linear(1e6), remote_max=math.inf, max_gpus=4),
    ]
    d = make_policy("goodput-dp-lend").decide(jobs, cluster)
    light = d.placements["light"].index(4)
    assert d.placements["starved"][light] == 0
    assert d.lent[1 - light] == 0.0 and 3.9 < d.lent[light] < 4.0
    assert d.remote == {"starved": pytest.approx(d.lent[light])}
    assert "pool cores" in d.reasons["starved"]
    kept = d.cores["light"][light]
    assert kept + d.lent[light] == pytest.approx(4.0)
    assert kept == pytest.approx(4000 / 1e6)  # what its 4 GPUs need at 1,000 samples/s each
    borrowed = borrowed_cores(d.remote, d.lent)
    assert borrowed == {"starved": pytest.approx(d.lent)}
    plain = make_policy("goodput-dp").decide(jobs, cluster)
    assert plain.remote == {} and plain.lent == ()
    assert borrowed_cores(plain.remote, plain.lent) == {}


def test_goodput_dp_lend_decides_as_goodput_dp_where_no_node_may_lend(apps, workload) -> None:
    """The service's default lends only from nodes whose sidecar says they may
    (``--lend-cores``): where none may, its whole run is ``goodput-dp``'s, the CPU pool's cores
    included; where they may, it lends."""

    def run(policy: str, lends: tuple[bool, ...]):  # type: ignore[no-untyped-def]
        cluster = replace(Cluster.uniform(3, 4, 3.0), pool=2.0, pool_efficiency=0.87, lends=lends)
        sim = Simulator(workload, apps, make_policy(policy), cluster, learning="oracle")
        return [(j.name, j.jct_s, j.remote_seconds) for j in sim.run().jobs]

    plain = run("goodput-dp", (True,) * 3)  # (goodput-dp never lends)
    assert run("goodput-dp-lend", (False,) * 3) == plain
    assert any(remote > 0 for *_, remote in plain)  # the pool was used, alike
    assert run("goodput-dp-lend", (True,) * 3) != plain


def test_borrowed_cores_draw_on_the_pool_and_each_lender_alike() -> None:
    """Three pool cores and 3 + 1 lent, taken 6 and 1 by two jobs: each job draws 4/7 of its
    cores from the first lender and 1/7 from the second; the lenders lend what they lent."""
    borrowed = borrowed_cores({"a": 6.0, "b": 1.0, "none": 0.0}, (3.0, 0.0, 1.0))
    assert borrowed == {
        "a": pytest.approx((18 / 7, 0.0, 6 / 7)),
        "b": pytest.approx((3 / 7, 0.0, 1 / 7)),
    }
    assert [sum(x) for x in zip(*borrowed.values(), strict=True)] == pytest.approx([3, 0, 1])
    assert borrowed_cores({"a": 6.0}, ()) == {} and borrowed_cores({}, (1.0,)) == {}


def test_lent_cores_feed_a_hungry_job_in_the_simulator_within_each_nodes_cores(apps) -> None:
    """A hungry job and a light one, each on its own node: goodput-dp-lend feeds the hungry
    one from the light node's spare (at the pool's efficiency), and is done sooner than
    goodput-dp; the simulator refuses a policy that lends more than a node has."""
    jobs = [
        WorkloadJob("cifar10-0", 0.0, "cifar10", 4, 2048),  # hungry (res18's profile)
        WorkloadJob("ncf-1", 0.0, "ncf", 4, 4096),  # light (flat profile)
    ]
    cluster = Cluster.uniform(2, 4, 4.0)

    def run(policy, cluster=cluster):  # type: ignore[no-untyped-def]
        sim = Simulator(jobs, apps, policy, cluster, learning="oracle")
        return {j.name: j for j in sim.run().jobs}

    lends = replace(cluster, pool_efficiency=0.87)
    alone, lent = run(make_policy("goodput-dp"), lends), run(make_policy("goodput-dp-lend"), lends)
    assert lent["cifar10-0"].remote_seconds > 0
    assert lent["cifar10-0"].jct_s < alone["cifar10-0"].jct_s * 0.9
    assert lent["ncf-1"].input_s == pytest.approx(alone["ncf-1"].input_s, abs=60.0)

    # lending all of each node's cores, those its own jobs hold too
    lavish = _Tampered("goodput-dp-lend", lambda d, cluster: replace(d, lent=tuple(cluster.cpus)))
    with pytest.raises(AllocatorError, match="more cores than a node has"):
        run(lavish)


def test_sim_cli_runs_the_lending_policy_and_lists_it_when_refusing(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    base = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "3"]
    rc = main([*base, "--cpus-per-node", "4", "--policy", "goodput-dp-lend", "--out", str(out),
               "--quiet"])  # fmt: skip
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["cluster"]["pool_efficiency"] == pytest.approx(0.87)  # lent cores feed so
    assert main([*base, "--policy", "goodput-dp-borrow", "--out", str(out), "--quiet"]) == 2
    assert "goodput-dp-lend" in capsys.readouterr().err
