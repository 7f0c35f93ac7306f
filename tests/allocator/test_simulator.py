"""Simulator invariants on a small excerpt of the Pollux traces, the policies and dloader-sim."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dloader.allocator import AllocatorError, Cluster
from dloader.allocator.policies import POLICIES, JobState, make_policy
from dloader.allocator.sim_cli import main
from dloader.allocator.simulator import Simulator, _fit_observed
from dloader.allocator.traces import PACKAGED_TRACES, WorkloadJob, load_apps, read_workload

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"
CLUSTER = Cluster.uniform(3, 4)


@pytest.fixture(scope="module")
def apps():
    return load_apps(DATA, ["cifar10", "ncf"])


@pytest.fixture(scope="module")
def workload():
    return read_workload(DATA / "workload.csv")


@pytest.fixture(scope="module")
def results(apps, workload):
    return {p: Simulator(workload, apps, make_policy(p), CLUSTER).run() for p in POLICIES}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_job_completes_without_over_allocation(results, workload, policy):
    r = results[policy]
    assert all(j.end_s is not None for j in r.jobs)
    submit = {w.name: w.time for w in workload}
    for j in r.jobs:
        assert j.start_s >= submit[j.name] and j.end_s > j.start_s
        assert j.jct_s == pytest.approx(j.end_s - submit[j.name])
    per_time = np.array(list(r.gpus.values())).sum(axis=0)
    assert per_time.max() <= CLUSTER.capacity
    s = r.summary()
    assert s["jobs_completed"] == len(workload)
    assert 0 < s["gpu_utilisation"] <= 1


def test_static_never_changes_a_running_job(results):
    r = results["static"]
    assert all(j.restarts == 0 and j.batch_changes == 0 for j in r.jobs)
    for series in r.gpus.values():
        running = [g for g in series if g]
        assert len(set(running)) <= 1


def test_elastic_policies_move_jobs_and_goodput_dp_is_fastest(results):
    assert sum(j.batch_changes for j in results["elastic-gpu"].jobs) == 0
    assert sum(j.batch_changes for j in results["goodput-dp"].jobs) > 0
    avg = {p: r.summary()["avg_jct_s"] for p, r in results.items()}
    assert avg["goodput-dp"] < avg["static"]
    assert avg["goodput-dp"] < avg["elastic-dp"]


def test_deterministic_with_and_without_the_fit_memo(apps, workload, results):
    """The same run again with its online models from the memo, and with every model fitted
    afresh: the same jobs, to the last number."""
    hits = _fit_observed.cache_info().hits
    warm = Simulator(workload, apps, make_policy("goodput-dp"), CLUSTER).run()
    assert _fit_observed.cache_info().hits > hits
    _fit_observed.cache_clear()
    cold = Simulator(workload, apps, make_policy("goodput-dp"), CLUSTER).run()
    assert _fit_observed.cache_info().misses > 0
    assert warm.jobs == cold.jobs == results["goodput-dp"].jobs


def test_restart_delay_costs_time(apps, workload):
    slow = Simulator(workload, apps, make_policy("elastic-dp"), CLUSTER, restart_s=300).run()
    fast = Simulator(workload, apps, make_policy("elastic-dp"), CLUSTER, restart_s=0).run()
    assert slow.summary()["avg_jct_s"] > fast.summary()["avg_jct_s"]


def test_trace_interpolation_and_progress(apps):
    app = apps["cifar10"]
    t1 = app.iteration_time((1,), 128)
    t4 = app.iteration_time((4,), 512)
    assert t1 > 0 and t4 > 0
    # a measured placement at a measured local batch is returned as measured
    assert app.step_sync((4,), 128)[0] > 0
    # an unmeasured placement falls back to the (nodes, replicas, local) interpolation
    assert np.isfinite(app.step_sync((3, 3, 1), 100)[0])
    # larger batches make more progress per step, but less per sample
    assert app.gain(2048, 0) > app.gain(128, 0) == pytest.approx(1.0)
    assert app.gain(2048, 0) < 2048 / 128


def test_bad_workload_files(tmp_path, apps):
    bad = tmp_path / "w.csv"
    bad.write_text("name,time,application,num_replicas,batch_size\na,0,resnet,1,32\n")
    with pytest.raises(AllocatorError, match="application='resnet'"):
        read_workload(bad)
    bad.write_text("name,time,application\na,0,ncf\n")
    with pytest.raises(AllocatorError, match="missing column"):
        read_workload(bad)
    bad.write_text("name,time,application,num_replicas,batch_size\na,x,ncf,1,32\n")
    with pytest.raises(AllocatorError, match="data row 1"):
        read_workload(bad)
    with pytest.raises(AllocatorError, match="does not exist"):
        read_workload(tmp_path / "nope.csv")
    with pytest.raises(AllocatorError, match="without traces"):
        Simulator([WorkloadJob("x", 0, "bert", 1, 12)], apps, make_policy("static"), CLUSTER)
    with pytest.raises(AllocatorError, match="policy='fifo'"):
        make_policy("fifo")


def test_job_state_validates(apps):
    with pytest.raises(AllocatorError, match="batch_range"):
        JobState("a", 0, apps["ncf"].model, 1, 32, (64, 32), (1, 8))


def test_cli_writes_results_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "3"]
    rc = main(
        [
            *args,
            "--policy",
            "goodput-dp",
            "--out",
            str(out),
            "--quiet",
            "--plot",
            str(tmp_path / "p.png"),
            "--losses",
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["learning"] == "online"
    assert set(result["losses"]["goodput-dp"]) == {"cifar10", "ncf"}
    for key in ("avg_jct_s", "p99_jct_s", "makespan_s", "jobs_completed", "optimizer_ms_p50"):
        assert key in result
    assert result["jobs_completed"] == 8
    rows = (tmp_path / "r.jobs.csv").read_text().splitlines()
    assert len(rows) == 9 and rows[0].startswith("policy,name")
    assert (tmp_path / "p.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "goodput-dp" in printed and "where each application's time went" in printed

    rc = main([*args, "--policy", "static,bogus", "--out", str(out), "--quiet"])
    assert rc == 2
    assert "--policy 'bogus'" in capsys.readouterr().err


def test_cli_runs_each_policy_on_jittered_copies_and_reports_median_and_range(tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "1"]
    argv = [*args, "--policy", "goodput-dp,goodput-dp-fifo", "--out", str(out), "--quiet"]
    assert main([*argv, "--jitter-seeds", "3", "--jitter-s", "120"]) == 0
    result = json.loads(out.read_text())
    runs = result["policies"]
    assert set(runs) == {f"{p} j{k}" for p in ("goodput-dp", "goodput-dp-fifo") for k in range(3)}
    assert all(r["jobs_completed"] == 8 for r in runs.values())
    jct = result["jitter"]["goodput-dp-fifo"]["avg_jct_s"]
    values = [runs[f"goodput-dp-fifo j{k}"]["avg_jct_s"] for k in range(3)]
    assert jct["values"] == values and jct["range"] == [min(values), max(values)]
    assert result["jitter"]["goodput-dp"]["avg_jct_s"]["ratio_median"] == 1.0  # to itself
    assert len(set(values)) > 1  # the copies differ
    assert "median [range]" in capsys.readouterr().out
    assert main([*argv, "--jitter-seeds", "-1"]) == 2
    assert "--jitter-seeds -1" in capsys.readouterr().err


def test_cli_steady_load_needs_a_philly_draw_and_no_time_scale(tmp_path, capsys):
    out = ["--out", str(tmp_path / "r.json"), "--quiet"]
    args = ["--workload", str(DATA / "workload.csv"), "--traces", str(DATA), "--nodes", "1"]
    assert main([*args, *out, "--jobs-per-hour", "9"]) == 2
    assert "--jobs-per-hour 9: a Philly draw's steady load" in capsys.readouterr().err
    philly = ["--philly", "--philly-jobs", "4", "--seed", "3", "--nodes", "1", *out]
    assert main([*philly, "--jobs-per-hour", "9", "--time-scale", "2"]) == 2
    assert "without --time-scale" in capsys.readouterr().err
    assert main([*args, *out, "--class-split", "20,70,10"]) == 2
    assert "--class-split 20,70,10: expected with --philly" in capsys.readouterr().err
    for bad in ("20,70", "a,b,c", "0,0,0"):
        assert main([*philly, "--class-split", bad]) == 2
        err = capsys.readouterr().err
        assert f"--class-split {bad!r}" in err or "class split" in err
    assert main([*philly, "--class-split", "20,70,10", "--policy", "synergy"]) == 0
    assert main([*args, *out, "--durations", "synergy"]) == 2
    assert "--durations synergy: expected with --philly" in capsys.readouterr().err
    assert main([*philly, "--philly-max-gpus", "0"]) == 2
    assert "--philly-max-gpus 0: expected >= 1" in capsys.readouterr().err
    assert main([*philly, "--synergy-models", "--cpus-per-node", "24"]) == 2
    assert "--synergy-models: expected with --class-split" in capsys.readouterr().err
    synergy = ["--durations", "synergy", "--philly-max-gpus", "1", "--policy", "synergy"]
    assert main([*philly, *synergy]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["jobs_completed"] == 4


def test_a_job_that_can_never_start_is_an_error_not_a_hang(apps):
    # elastic-gpu keeps batch 4096; at most 1024 per GPU, it needs 4 GPUs: the cluster has 2
    work = [WorkloadJob("big", 0, "cifar10", 4, 4096)]
    sim = Simulator(work, apps, make_policy("elastic-gpu"), Cluster.uniform(1, 2))
    with pytest.raises(AllocatorError, match=r"job big can never start on 2 GPUs: waiting, 1 in"):
        sim.run()


@pytest.mark.parametrize("policy", ["goodput-dp", "static"])
def test_time_losses_add_up_to_each_jct(results, policy):
    r = results[policy]
    for j in r.jobs:
        run = j.jct_s - j.queue_s - j.restart_s - j.placement_s
        assert j.queue_s >= 0 and j.placement_s >= 0 and run > 0, j
        # every start and every restart costs the restart delay (the last may be cut short)
        assert j.restart_s <= (j.restarts + 1) * r.restart_s + 1e-6
        assert j.restart_s >= j.restarts * r.restart_s - 1e-6 if j.restarts else j.restart_s > 0
    losses = r.losses()
    assert set(losses) == {"cifar10", "ncf"}
    for m in losses.values():
        assert m["jct"] == pytest.approx(m["queue"] + m["restart"] + m["placement"] + m["run"])
    assert sum(m["jobs"] for m in losses.values()) == len(r.jobs)


def test_online_learning_starts_each_job_on_one_gpu_and_grows_at_most_twofold(results):
    r = results["goodput-dp"]  # the simulator's default: online
    for series in r.gpus.values():
        running = [g for g in series if g]
        assert running[0] == 1
        seen = 1
        for g in running:
            assert g <= 2 * seen
            seen = max(seen, g)


def test_the_oracle_mode_is_deterministic_and_differs_from_online(apps, workload, results):
    run = lambda: Simulator(  # noqa: E731
        workload, apps, make_policy("goodput-dp"), CLUSTER, learning="oracle"
    ).run()
    oracle = run()
    assert oracle.jobs == run().jobs
    assert all(j.end_s is not None for j in oracle.jobs)
    assert oracle.jobs != results["goodput-dp"].jobs
    with pytest.raises(AllocatorError, match="learning='psychic'"):
        Simulator(workload, apps, make_policy("goodput-dp"), CLUSTER, learning="psychic")  # type: ignore[arg-type]


def test_restart_cost_weighs_age_and_restarts(apps):
    policy = make_policy("goodput-dp")
    state = lambda age, restarts: JobState(  # noqa: E731
        "a", 0, apps["ncf"].model, 1, 32, (32, 64), (1, 64), age_s=age, restarts=restarts
    )
    young, old = policy.restart_factor(state(60, 0)), policy.restart_factor(state(6000, 0))
    assert young == pytest.approx(60 / 90) and old == pytest.approx(6000 / 6030)
    assert policy.restart_factor(state(6000, 50)) == pytest.approx(4500 / 6030)
    assert policy.restart_factor(state(60, 5)) == 0.0
    unknown = JobState("a", 0, apps["ncf"].model, 1, 32, (32, 64), (1, 64))
    assert policy.restart_factor(unknown) is None  # the horizon then amortises it


def test_a_job_not_measured_yet_runs_as_configured_on_one_gpu(apps):
    policy = make_policy("goodput-dp")
    new = JobState("a", 0, apps["ncf"].model, 4, 512, (32, 4096), (1, 512), explored_gpus=0)
    spec = policy.spec(new, CLUSTER)
    assert spec.batch_sizes == (512,) and spec.max_gpus == 1
    measured = JobState("a", 0, apps["ncf"].model, 4, 512, (32, 4096), (1, 512), explored_gpus=2)
    spec = policy.spec(measured, CLUSTER)
    assert len(spec.batch_sizes) > 1 and spec.max_gpus == 4


def test_a_model_that_never_spanned_nodes_is_not_trusted_on_a_spread_placement():
    """Two running jobs leave one GPU free on each of two nodes. A newcomer whose model says
    synchronising across nodes is free would take both (spread); it may only when its model
    has measured a step across nodes (or is the oracle), else it gets the one GPU it can use
    compactly."""
    from dloader.predictor import ScalingModel, ScalingParams

    free_sync = ScalingModel(
        ScalingParams(
            alpha_c=0.1, beta_c=0.001, alpha_n=0.0, beta_n=0.0, alpha_r=0.0, beta_r=0.0, gamma=4.0
        )
    )
    cluster = Cluster.uniform(2, 4)
    policy = make_policy("goodput-dp")

    def decide(explored_nodes: int | None) -> tuple[int, ...]:
        def job(name: str, placement: tuple[int, ...]) -> JobState:
            return JobState(
                name, 0, free_sync, 3, 96, (96, 96), (8, 64), placement=placement,
                batch_size=96, age_s=10.0, restarts=0, explored_gpus=3, explored_nodes=1,
            )  # fmt: skip

        new = JobState(
            "new", 0, free_sync, 1, 64, (64, 64), (8, 64), age_s=0.0,
            explored_gpus=1, explored_nodes=explored_nodes,
        )  # fmt: skip
        jobs = [job("a", (3, 0)), job("b", (0, 3)), new]
        return policy.decide(jobs, cluster).placements["new"]

    assert decide(None) == (1, 1)  # the oracle's model is trusted: spread
    assert decide(2) == (1, 1)  # it has measured a step across nodes
    assert sum(decide(1)) == 1  # only one node seen: one GPU, on one node


def test_a_spread_placement_is_charged_at_the_batch_the_job_runs():
    """yolov3 (local batch at most 8) on 4 GPUs over 4 nodes: at its largest batch, with
    micro-batches, a spread costs little throughput, but its gradient noise makes such a batch
    worth little, and it runs the batch that is best on 4 compact GPUs, where the network's
    cost is large. The spread is charged its goodput at that batch (in the traces, 0.66 of
    compact), not the ratio of the two placements' best throughputs (which called it ~0.9 and
    kept yolov3 jobs on one GPU per node, 35 min a job lost, on Pollux workload 7)."""
    from dloader.allocator.policies.throughput import throughput_fn
    from dloader.predictor import GradientNoise

    app = load_apps(PACKAGED_TRACES)["yolov3"]
    policy = make_policy("goodput-dp")
    job = JobState(
        "yolo", 0, app.model, 4, 32, (8, 512), app.local_bsz_range,
        noise=GradientNoise(base_batch=8, sqr=1.0, var=4.0), explored_nodes=4,
    )  # fmt: skip
    spec = policy.spec(job, Cluster.uniform(4, 4))
    batches = np.asarray(spec.batch_sizes, dtype=float)
    k = np.array([4.0])
    compact = np.nan_to_num(np.ravel(spec.throughput(k, batches)))
    spread = np.nan_to_num(np.ravel(throughput_fn(app.model, 1, app.local_bsz_range)(k, batches)))
    goodput = compact * np.asarray(spec.efficiency(batches))
    runs = int(goodput.argmax())
    share = policy._spread_share(job, spec, 4, 4)
    assert share == pytest.approx(spread[runs] / compact[runs])
    assert share < 0.75 < spread.max() / compact.max()


def test_a_job_alone_tries_more_gpus_than_its_early_network_slope_allows():
    """A job measured on up to 4 GPUs (on one node) and on 2-3 across nodes, where that one
    difference puts the network cost at 0.4 s a replica: its fitted line says 8 GPUs over 2
    nodes are slower than 4 on one, so the policy kept it on 4 with the cluster idle (yolov3 in
    a Philly draw, for 3.5 h). Its sync time is held beyond what it measured: it gets 8."""
    from dloader.predictor import ScalingModel, ScalingParams, ScalingPoint

    steep = ScalingModel(ScalingParams(0.0, 0.04, 0.15, 0.08, 0.58, 0.40, 1.0))
    early = [(1, 1, 16), (1, 2, 16), (1, 4, 32), (2, 2, 16), (2, 3, 16)]
    points = [ScalingPoint(n, r, b, steep.step_time(n, r, b)) for n, r, b in early]
    job = JobState(
        "yolo", 0, ScalingModel.fit_observed(points), 4, 128, (16, 256), (8, 64),
        placement=(4, 0, 0, 0), batch_size=128, age_s=3600.0, restarts=1, explored_gpus=4,
        explored_nodes=2,
    )  # fmt: skip
    decision = make_policy("goodput-dp").decide([job], Cluster.uniform(4, 4))
    assert sorted(decision.placements["yolo"]) == [0, 0, 4, 4]
    # on the fitted lines (as before; Pollux's model too: its peer stays faithful to it)
    before = make_policy("goodput-dp-extrapolated").decide([job], Cluster.uniform(4, 4))
    assert before.placements["yolo"] == (4, 0, 0, 0)
    pollux = job.model.extrapolated
    assert pollux.sync_replicas is None and not pollux.node_factors


@pytest.mark.parametrize("cpus", [None, 6.0])
def test_a_job_with_a_duration_runs_that_long_at_its_request(apps, cpus):
    """``WorkloadJob.duration_s`` (Synergy's jobs: a length from the Philly trace): alone on
    its requested GPUs at its requested batch, with its GPUs' share of the cores (here 3 of 6
    cores on a 4-GPU node for 2 GPUs, where cifar10 is CPU-bound), it runs that many seconds
    after its start; without one it runs its application's length."""
    cluster = Cluster.uniform(1, 4, cpus)
    own = Simulator(
        [WorkloadJob("c", 0, "cifar10", 2, 256)], apps, make_policy("static"), cluster
    ).run()
    for duration in (5_000.0, 50_000.0):
        work = [WorkloadJob("c", 0, "cifar10", 2, 256, duration)]
        job = Simulator(work, apps, make_policy("static"), cluster).run().jobs[0]
        assert job.jct_s - job.restart_s - job.queue_s == pytest.approx(duration, rel=1e-6)
        assert job.jct_s != pytest.approx(own.jobs[0].jct_s, rel=0.01)
    with pytest.raises(AllocatorError, match="duration_s=-1"):
        Simulator(
            [WorkloadJob("c", 0, "cifar10", 2, 256, -1.0)], apps, make_policy("static"), cluster
        )


def test_a_job_with_a_cpu_profile_of_its_own_is_fed_by_it(apps):
    """``WorkloadJob.cpu_profile``: the job's input pipeline follows that profile, relative to
    its own GPUs' rate at its request, as Synergy runs its jobs: cifar10 as alexnet on 4 GPUs
    runs exactly alexnet's profiled speed-up (2.94x its speed at 3 cores per GPU) faster at
    its ideal 12 cores per GPU than at 3; an unknown profile is named."""
    from dloader.allocator.cpu_profiles import read_cpu_profiles

    points = dict(read_cpu_profiles()["alexnet"].points)

    def run_s(cores_per_gpu: float, profile: str | None = "alexnet") -> float:
        work = [WorkloadJob("c", 0, "cifar10", 4, 512, None, profile)]
        cluster = Cluster.uniform(1, 4, 4 * cores_per_gpu)
        job = Simulator(work, apps, make_policy("static"), cluster).run().jobs[0]
        return job.jct_s - job.restart_s - job.queue_s

    assert run_s(3.0) / run_s(12.0) == pytest.approx(points[12.0] / points[3.0], rel=1e-6)
    assert run_s(3.0) == pytest.approx(run_s(3.0, "shufflenet"), rel=0.2)  # alike profiles
    assert run_s(3.0, None) < run_s(3.0) / 1.5  # its own (res18's) needs fewer cores
    with pytest.raises(
        AllocatorError, match="job 'c' of application 'cifar10' has no CPU profile 'x'"
    ):
        run_s(3.0, "x")
