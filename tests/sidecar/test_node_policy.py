"""The node decision as one object (:class:`~dloader.sidecar.node_policy.NodePolicy`), fed
plain values with no core, store, socket or clock around it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from dloader.predictor import LoaderModel, LoaderObservation
from dloader.sidecar import node_policy as pol

BUDGET = pol.Budget(8, 2.0)


def job(job_id: str, workers: int = 2, **kw: float) -> pol.PolicyJob:
    """A job running ``workers`` workers, registered with that many."""
    kw.setdefault("initial_workers", workers)
    return pol.PolicyJob(job_id, LoaderModel(), 32, workers, workers, 32, **kw)  # type: ignore[arg-type]


def window(workers: int, rate: float, *, fetch: float = 0.2, cpu: float = 0.1) -> pol.ReportWindow:
    """A 2-s window at ``rate`` samples/s, each of ``workers`` workers timing its batches."""
    return pol.ReportWindow(
        workers,
        32,
        rate,
        0.5,
        32 / rate if rate else 0.0,
        2.0,
        (fetch,) * workers,
        (cpu,) * workers,
        (None,) * workers,
    )


def fed(name: str) -> pol.NodePolicy:
    """A policy with two jobs, each after one timed window (an I/O-bound one, a CPU-bound one)."""
    p = pol.NodePolicy(name, BUDGET)
    p.add(job("io", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.add(job("cpu", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.decide(0.0)
    p.report("io", window(2, 100.0, fetch=0.6, cpu=0.02), 3.0)
    p.report("cpu", window(2, 300.0, fetch=0.2, cpu=0.19), 3.0)
    return p


def test_the_split_is_a_function_of_what_the_policy_was_fed() -> None:
    """Fed the same windows at the same times, two policies give the same orders: nothing
    outside its inputs (no clock, no I/O) goes into the decision."""
    a, b = fed("adaptive").decide(4.0), fed("adaptive").decide(4.0)
    assert a.orders == b.orders and a.notes == b.notes
    assert a.orders, "the first timed windows place the jobs"
    counts = {o.job_id: o.changes["num_workers"] for o in a.orders if "num_workers" in o.changes}
    assert counts["io"] > counts["cpu"]  # I/O-bound: workers are cheap; CPU-bound: cores bind
    assert sum(counts.values()) <= BUDGET.workers
    assert any(n.startswith("job io: placed by its model") for n in a.notes)
    # what it ordered is what it now holds as the split, and changing it was a change
    p = fed("adaptive")
    held = {**dict(p.split()), **counts}
    p.decide(4.0)
    assert dict(p.split()) == held and p.changed_at == 4.0


def test_a_report_learns_and_says_when_to_decide_at_once() -> None:
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.decide(0.0)
    assert not p.dirty
    first = p.report("a", window(2, 300.0), 2.5)
    assert first.learned and first.wake  # its first window: news
    assert len(p.jobs["a"].model.observations) == 1
    empty = p.report("a", window(2, 0.0), 3.5)  # no throughput: nothing to learn
    assert not empty.learned and not empty.wake
    assert p.jobs["a"].rate == 0.0


def test_probes_fall_due_only_under_adaptive() -> None:
    for name, due in (("adaptive", True), ("even", False)):
        p = pol.NodePolicy(name, BUDGET)
        p.add(job("a"), 0.0)
        p.decide(0.0)
        assert not p.due(1.0)
        assert p.due(1.0 + p.truth.probe_wait) is due


def test_leaving_guided_hands_the_counts_back() -> None:
    p = pol.NodePolicy("guided", BUDGET)
    p.add(job("a", workers=3), 0.0)
    out = p.decide(0.0)
    assert out.orders[0].changes == {"tune_up_to": 8, "num_workers": 3}
    assert p.jobs["a"].ceiling == 8
    p.report("a", window(5, 300.0), 1.0)  # its own tuner went to 5
    orders = p.configure("even", BUDGET)
    assert [o.changes for o in orders] == [{"tune_up_to": None, "num_workers": 5}]
    assert p.jobs["a"].ceiling is None and p.jobs["a"].directed == 5
    assert p.configure("even", BUDGET) == []  # nothing left to hand back


def test_an_allocator_target_starts_an_unplaced_job() -> None:
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", workers=1, initial_workers=1), 0.0)
    out = p.target("a", 6.0, 2, 1.0)  # 6 cores for 2 ranks: 3 each
    assert [o.changes for o in out.orders] == [{"num_workers": 3}]
    assert p.jobs["a"].initial_workers == 3 and p.changed_at == 1.0
    assert p.target("a", 6.1, 2, 2.0).orders == []  # within TARGET_CHANGE: the same target
    p.jobs["a"].placed = True
    assert p.target("a", 2.0, 2, 3.0).orders == []  # placed: its model decides


@pytest.mark.parametrize("cpus", [(), (0, 1)])
def test_cpu_shares_and_sets_come_with_the_decision(cpus: tuple[int, ...]) -> None:
    p = pol.NodePolicy("even", BUDGET)
    p.add(job("a"), 0.0)
    p.add(job("b"), 0.0)
    out = p.decide(0.0, cpus=cpus, shares=True)
    assert set(out.shares) == {"a", "b"} and all(v > 0 for v in out.shares.values())
    sets = [o.changes["cpus"] for o in out.orders if "cpus" in o.changes]
    assert sets == ([(0,), (1,)] if cpus else [])
    again = p.decide(1.0, cpus=cpus, shares=True)
    assert not [o for o in again.orders if "cpus" in o.changes]  # unchanged: not sent again


def test_memory_is_noted_from_the_tree_before_the_first_decision() -> None:
    p = pol.NodePolicy("even", pol.Budget(16, 2.0))
    tree = pol.TreeSample(0.1, 0.1, main_uss=(300.0,), main_anon=400.0)
    p.add(job("a"), 0.0, tree)
    assert p.jobs["a"].worker_memory_bytes == 300.0
    assert p.jobs["a"].worker_memory_bound == 400.0
    out = p.decide(0.0, memory_bytes=1000.0)
    assert p.jobs["a"].decision is not None and p.jobs["a"].decision.num_workers <= 2
    assert out.orders == []  # it runs 2 already, which fit


def test_a_cost_change_is_followed_in_one_window() -> None:
    """A job learnt at 0.2 s a batch per worker (0.1 s of it CPU), its workers timing their
    wait for a CPU; then one window at 0.4 s a batch: its storage got slower. The model restarts
    from that window at once (its shape kept), says so, and the split is re-decided now."""
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.decide(0.0)

    def timed(fetch: float, rate: float, workers: int = 2) -> pol.ReportWindow:
        return replace(window(workers, rate, fetch=fetch), run_delay_s=(0.0,) * workers)

    now = 2.5
    for _ in range(6):  # steady at its own count: as the model predicts
        assert not any(e.kind == "restarted" for e in p.report("a", timed(0.2, 300.0), now).events)
        now += 2.0
    p.decide(now)
    learnt = len(p.jobs["a"].model.observations)
    assert learnt >= 2 and p.jobs["a"].model.io_seconds_per_sample == pytest.approx(0.1 / 32)
    k = p.jobs["a"].directed
    now += 10.0
    p.report("a", timed(0.2, 300.0 * k / 2, k), now)  # at its new count, as before
    assert len(p.jobs["a"].model.observations) == learnt + 1
    now += 2.0
    done = p.report("a", timed(0.4, 150.0 * k / 2, k), now)
    assert done.wake and p.dirty
    assert [e.kind for e in done.events] == ["restarted"]
    assert any("time per sample +100%" in n for n in done.notes), done.notes
    model = p.jobs["a"].model
    assert len(model.observations) == 1
    assert model.io_seconds_per_sample == pytest.approx(0.3 / 32)


def test_the_cost_of_a_window_against_the_recent_ones() -> None:
    base = dict(num_workers=2, cores=2.0, batch_size=32, samples_per_s=300.0)
    base |= dict(idle_share=0.5, step_s=32 / 300)
    before = LoaderObservation(**base, fetch_s=0.2, cpu_s=0.1, cpu_wait_s=0.0)
    same = LoaderObservation(**base, fetch_s=0.2, cpu_s=0.1, cpu_wait_s=0.0)
    fixed = math.log(pol.COST_CHANGE)
    assert pol.cost_change([before], same) == pytest.approx((0.0, fixed), abs=1e-6)
    slower = LoaderObservation(**base, fetch_s=0.5, cpu_s=0.1, cpu_wait_s=0.1)  # 0.1 s of it a wait
    assert pol.cost_change([before], slower).change == pytest.approx(math.log(2.0))  # 0.4, not 0.2
    assert pol.cost_change([before], slower).moved
    assert not pol.cost_change([before], slower, split_moved=True).moved  # its CPU is the same
    # the wait for a CPU unknown: the wall time cannot tell storage from contention; CPU can
    busy = LoaderObservation(**base, fetch_s=0.9, cpu_s=0.1)
    assert pol.cost_change([before], busy).change == pytest.approx(0.0, abs=1e-6)
    heavier = LoaderObservation(**base, fetch_s=0.9, cpu_s=0.2)
    assert pol.cost_change([before], heavier).change == pytest.approx(math.log(2.0))
    # across a move of the split: CPU alone, and only beyond what sharing a core does to it
    assert pol.cost_change([before], heavier, split_moved=True).moved
    shared = LoaderObservation(**base, fetch_s=0.9, cpu_s=0.15, cpu_wait_s=0.0)
    assert pol.cost_change([before], shared).moved
    assert not pol.cost_change([before], shared, split_moved=True).moved
    assert pol.cost_change([before], LoaderObservation(**base)).change == 0.0  # no timings
    other = LoaderObservation(**{**base, "num_workers": 4}, fetch_s=0.5, cpu_s=0.2, cpu_wait_s=0)
    assert pol.cost_change([before], other).change == 0.0  # another count: its curve, not costs
    assert not pol.cost_change([], same).moved  # nothing to compare with


def test_a_cost_change_is_judged_against_the_recent_windows_spread() -> None:
    """Against the median of the recent windows, not the last one (an outlier there is not
    the reference), and beyond their own spread: a pipeline whose windows' time per sample
    varies by +-30% does not say a change at +45%; a steady one does, and both at 3x."""

    def at(cpu: float) -> LoaderObservation:
        return LoaderObservation(
            num_workers=1, cores=2.0, batch_size=32, samples_per_s=300.0, idle_share=0.5,
            step_s=32 / 300, fetch_s=cpu, cpu_s=cpu, cpu_wait_s=0.0,
        )  # fmt: skip

    steady = [at(0.1 * (1 + d)) for d in (0.0, 0.02, -0.02, 0.01, -0.01)]
    noisy = [at(0.1 * (1 + d)) for d in (0.0, 0.3, -0.3, 0.25, -0.25)]
    assert pol.cost_change(steady, at(0.145)).moved
    assert not pol.cost_change(noisy, at(0.145)).moved
    assert pol.cost_change(noisy, at(0.3)).moved and pol.cost_change(steady, at(0.3)).moved
    # one outlier last: the median stands
    assert pol.cost_change([*steady, at(0.2)], at(0.1)).change == pytest.approx(0.0, abs=0.02)


def test_a_noisy_job_is_not_restarted_by_its_own_noise() -> None:
    """Windows whose time per sample moves by +-20-30% around a steady level (packed text on a
    crowded node: 240-450 samples/s at one split), reported at one split: its model never
    restarts (one window against the last, it would: 1.2x then 0.8x), and the split's
    measurements are kept; a real change after them (2.6x) still restarts it."""
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)

    def timed(cpu: float) -> pol.ReportWindow:
        return replace(window(2, 0.2 / cpu * 300.0, fetch=cpu, cpu=cpu), run_delay_s=(0.0,) * 2)

    now, learnt = 2.5, []
    for d in (0.0, 0.2, -0.2, 0.3, -0.25, 0.3, -0.3, 0.25, -0.3, 0.3) * 2:
        for _ in range(2):  # a 2-s window is taken every other report: both the same
            done = p.report("a", timed(0.2 * (1 + d)), now)
            assert not done.events, d  # neither a restart nor a "changed" of the measurements
            learnt += [d] if done.learned else []
            now += 2.0
    assert len(learnt) >= 15 and min(learnt) < -0.2 < 0.2 < max(learnt)  # the swings were seen
    for _ in range(10):  # twice the usual level: a change, once a window is learnt
        again = p.report("a", timed(0.2 * 2.6), now)
        now += 2.0
        if again.learned:
            break
    assert "restarted" in [e.kind for e in again.events]


def test_a_surprise_with_unchanged_timings_is_learnt_not_restarted() -> None:
    """Windows far below the model's prediction, in a row, whose workers' timings are as
    before: the model was wrong (the window teaches it), the job's costs did not change."""
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)

    def timed(rate: float) -> pol.ReportWindow:
        return replace(window(2, rate, fetch=0.2), run_delay_s=(0.0,) * 2)

    now = 2.5
    for _ in range(4):
        p.report("a", timed(300.0), now)
        now += 2.0
    for _ in range(4 * pol.DRIFT_WINDOWS):
        assert not any(e.kind == "restarted" for e in p.report("a", timed(120.0), now).events)
        now += 2.0
    assert len(p.jobs["a"].model.observations) > pol.DRIFT_WINDOWS


def test_a_timed_window_breaks_a_row_of_surprises() -> None:
    """Surprising windows without the wait for a CPU timed count towards a restart only in a
    row: a timed window between them (whose timings say the costs did not change) breaks it."""
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    timed = replace(window(2, 120.0), run_delay_s=(0.0,) * 2)
    now = 2.5
    for _ in range(4):
        p.report("a", window(2, 300.0), now)
        now += 2.0
    for _ in range(4):
        for w in [window(2, 120.0)] * (pol.DRIFT_WINDOWS - 1) + [timed]:
            assert not any(e.kind == "restarted" for e in p.report("a", w, now).events)
            now += 2.0


def neighbour_moved(steady: pol.ReportWindow) -> tuple[pol.NodePolicy, float]:
    """Jobs ``a`` and ``b``; ``a`` learns three ``steady`` windows, then ``b``'s count moves by
    three. Returns the policy and when ``a``'s next window comes."""
    p = pol.NodePolicy("adaptive", BUDGET)
    for j in ("a", "b"):
        p.add(job(j, registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    now = 2.5
    for _ in range(3):
        p.report("a", steady, now)
        now += 2.0
    p.jobs["b"].directed += 3
    return p, now


def test_a_neighbours_new_count_is_not_a_cost_change() -> None:
    """The same job, the same count, twice the wall time per sample (its CPU time the same),
    but a neighbour's count changed between the windows (cores shared by more workers): no
    restart; the next window at the new split is the reference."""

    def timed(fetch: float, rate: float) -> pol.ReportWindow:
        return replace(window(2, rate, fetch=fetch), run_delay_s=(0.0,) * 2)

    p, now = neighbour_moved(timed(0.2, 300.0))
    slower = p.report("a", timed(0.4, 150.0), now)
    assert not any(e.kind == "restarted" for e in slower.events)
    learnt = p.jobs["a"].model.observations
    assert slower.learned and learnt[-1].fetch_s == 0.4  # the reference now
    for _ in range(10):  # at the new split, twice again: a change, once a window is learnt
        now += 2.0
        again = p.report("a", timed(0.8, 75.0), now)
        if again.learned:
            break
    assert [e.kind for e in again.events] == ["restarted"]


def test_a_cost_change_just_after_a_neighbours_move_is_seen_in_its_cpu_time() -> None:
    """A job's samples become twice as dear in CPU in the first window after a neighbour's
    count changed: no window at the new split to compare with, but CPU time per sample does
    not move with the split as wall time does, so the change is seen in that window (it was
    missed until the model relearnt the job at the new split, 40 s in one run)."""

    def timed(cpu: float, rate: float) -> pol.ReportWindow:
        return replace(window(2, rate, fetch=2 * cpu, cpu=cpu), run_delay_s=(0.0,) * 2)

    p, now = neighbour_moved(timed(0.1, 300.0))
    dearer = p.report("a", timed(0.2, 150.0), now)
    assert [e.kind for e in dearer.events] == ["restarted"]
    assert any("CPU time per sample +100%" in n and "(beyond +70%)" in n for n in dearer.notes)
    assert dearer.wake


def test_a_loader_never_iterated_holds_no_workers_in_the_budget() -> None:
    """A job whose loader was created but never iterated (the agent registers it at creation)
    has no worker processes and no batch yet: its count is not reserved against the node's
    workers until they run; once they do, it counts again."""
    idle_tree = pol.TreeSample(0.0, 0.01)  # walked: its training process, no loader workers
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("io", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.add(job("idle", workers=6, registered_at=0.0), 0.0, idle_tree)
    p.decide(0.0)
    p.report("io", window(2, 100.0, fetch=0.6, cpu=0.02), 3.0)
    p.report("idle", window(6, 0.0), 3.0)  # a report before its first batch: nothing measured
    p.decide(4.0)
    io, idle = p.jobs["io"].decision, p.jobs["idle"].decision
    assert io is not None and idle is not None
    assert io.num_workers == BUDGET.workers  # I/O-bound: the whole budget, none held for idle
    assert "not started" in idle.reason
    # the measurements steer the running jobs as if it were not there (it joins the split
    # when it runs): the split and what steering sees leave it out
    assert dict(p.split()) == {"io": p.jobs["io"].directed}
    seen: list[set[str]] = []
    steer = p.truth.steer

    def spy(jobs, *args, **kw):
        seen.append({j.job_id for j in jobs})
        return steer(jobs, *args, **kw)

    p.truth.steer = spy  # type: ignore[method-assign]
    p.decide(4.5)
    assert seen == [{"io"}]
    # its workers start: the next decision counts them again
    p.tree("idle", pol.TreeSample(0.5, 0.01, has_workers=True), 5.0)
    assert p.dirty
    p.decide(5.0)
    io = p.jobs["io"].decision
    assert io is not None and io.num_workers + p.jobs["idle"].directed <= BUDGET.workers
    assert seen[-1] == {"io", "idle"} and dict(p.split()).keys() == {"io", "idle"}


def test_a_loader_never_iterated_gets_no_cpu_set_of_its_own() -> None:
    p = pol.NodePolicy("adaptive", BUDGET)
    p.add(job("io", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.add(job("idle", workers=6, registered_at=0.0), 0.0, pol.TreeSample(0.0, 0.01))
    out = p.decide(0.0, cpus=(0, 1), shares=True)
    sets = {o.job_id: o.changes["cpus"] for o in out.orders if "cpus" in o.changes}
    assert sets == {"io": (0, 1)}  # both CPUs: none idles in a set of a loader with no workers
    assert out.shares["idle"] == pol.node.MIN_SHARE < out.shares["io"]
    p.tree("idle", pol.TreeSample(0.5, 0.01, has_workers=True), 1.0)
    out = p.decide(1.0, cpus=(0, 1), shares=True)
    sets = {o.job_id: o.changes["cpus"] for o in out.orders if "cpus" in o.changes}
    assert sets == {"io": (0,), "idle": (1,)}  # running: a set of its own


def test_a_new_jobs_workers_run_before_niced_ones_until_its_model_places_it() -> None:
    """On a crowded node a niced worker's batch can take seconds, and the model places a new
    job from its timed batches: its workers run at the trainers' priority until it is placed,
    then at the node's nice value, ordered once (or after ``UNPLACED_NICE_S`` unplaced)."""

    def niced(d: pol.Decided) -> dict[str, int]:
        return {o.job_id: o.changes["worker_nice"] for o in d.orders if "worker_nice" in o.changes}

    p = pol.NodePolicy("adaptive", BUDGET, worker_nice=10)
    p.add(job("io", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    p.add(job("cpu", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
    assert p.nice_for(p.jobs["io"], 0.0) is None and not p.jobs["io"].niced
    assert niced(p.decide(0.0)) == {}  # exploring: not placed yet
    p.report("io", window(2, 100.0, fetch=0.6, cpu=0.02), 3.0)
    p.report("cpu", window(2, 300.0, fetch=0.2, cpu=0.19), 3.0)
    placed = p.decide(4.0)
    assert p.jobs["io"].placed and p.jobs["cpu"].placed
    assert niced(placed) == {"io": 10, "cpu": 10}
    # one directive a job: the nice value goes with the count its placement sets
    assert sorted(o.job_id for o in placed.orders) == ["cpu", "io"]
    assert all("num_workers" in o.changes for o in placed.orders)
    p.dirty = True
    assert niced(p.decide(5.0)) == {}  # once
    # a job its model does not place (no timed batch) is niced after UNPLACED_NICE_S
    p.add(job("late", registered_at=5.0), 5.0)
    assert niced(p.decide(5.0 + pol.UNPLACED_NICE_S - 0.5)) == {}
    assert not p.due(5.0 + pol.UNPLACED_NICE_S - 0.5)
    assert p.due(5.0 + pol.UNPLACED_NICE_S)  # its nice is due: a decision, nothing else changed
    late = p.decide(5.0 + pol.UNPLACED_NICE_S)
    assert niced(late) == {"late": 10} and not p.jobs["late"].placed
    # under a policy that places no job by a model, and with the nice value off
    even = pol.NodePolicy("even", BUDGET, worker_nice=10)
    even.add(job("a", registered_at=0.0), 0.0)
    assert even.jobs["a"].niced and even.nice_for(even.jobs["a"], 0.0) == 10
    assert niced(even.decide(0.0)) == {}  # niced as it registered
    off = pol.NodePolicy("adaptive", BUDGET)
    off.add(job("a", registered_at=0.0), 0.0)
    assert off.nice_for(off.jobs["a"], 0.0) is None
    assert niced(off.decide(pol.UNPLACED_NICE_S + 1)) == {}


def test_a_starved_jobs_cores_are_what_its_run_queue_wait_says() -> None:
    """A job's workers that waited for a CPU were given ``workers * cpu / (cpu + wait)``
    cores, whatever the reports add up to (they miss what does not report): a JPEG job whose
    two workers each ran 64 ms and waited 100 ms a batch was given 0.78 cores, where the
    reports' sum (nothing else reports) left it the node's 2. Without a wait beyond wake-up
    latency, the reports' sum stands."""

    def cores_seen(wait: float) -> float:
        p = pol.NodePolicy("adaptive", BUDGET)
        p.add(job("a", registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
        w = replace(window(2, 200.0, fetch=0.064 + wait, cpu=0.064), run_delay_s=(wait,) * 2)
        p.report("a", w, 3.0)
        return p.jobs["a"].model.observations[-1].cores

    assert cores_seen(0.1) == pytest.approx(2 * 0.064 / 0.164, abs=pol.CORES_STEP / 2)
    assert cores_seen(0.05 * 0.064 * 0.5) == pytest.approx(BUDGET.cores)  # wake-up latency


def test_a_jobs_worker_activity_is_how_many_of_its_workers_were_runnable() -> None:
    """8 workers that each ran 64 ms and waited 100 ms a batch, at 780 samples/s: 4 of them
    were runnable on average (780 * 0.164 / 32), the others blocked, so 8 workers claim the
    cores of 4 (activity ln 4 / ln 8). Workers all runnable keep 1; a window without a wait
    beyond wake-up latency says nothing of how they claim cores when short (the view's 1)."""

    def activity(rate: float, wait: float) -> float:
        p = pol.NodePolicy("adaptive", pol.Budget(16, 2.0))
        p.add(job("a", 8, registered_at=0.0, directive_at=-pol.SETTLE_S), 0.0)
        w = replace(window(8, rate, fetch=0.064 + wait, cpu=0.064), run_delay_s=(wait,) * 8)
        p.report("a", w, 3.0)
        return p.view("a").worker_activity

    runnable4 = 4 * 32 / 0.164
    assert activity(runnable4, 0.1) == pytest.approx(math.log(4) / math.log(8))
    assert activity(8 * 32 / 0.164, 0.1) == pytest.approx(1.0)
    assert activity(runnable4 / 4, 0.1) == pol.MIN_ACTIVITY  # fewer than 2: not below the floor
    assert activity(runnable4, 0.001) == 1.0
