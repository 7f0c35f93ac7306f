"""The measured truth's probe state machine (:class:`MeasuredTruth`), pure: the model proposes,
measurements decide; steady at a measured split a near-tie is probed, held until measured, and
judged (kept, or undone with a longer wait before the next probe)."""

from __future__ import annotations

from dataclasses import replace

from dloader.sidecar.node_policy import (
    MEASURE_WINDOWS,
    PROBE_AFTER_S,
    PROBE_MAX_WAIT_S,
    Budget,
    JobView,
    MeasuredTruth,
    Split,
    WorkerDecision,
    split_of,
)
from tests.predictor.test_loader_model import CPU_HEAVY, IO_HEAVY
from tests.sidecar.test_policy import fitted

BUDGET = Budget(workers=18, cores=2)
LIMITS = {"io": 1.0, "cpu": 1.0}
START = split_of({"io": 16, "cpu": 2})
PROBED = split_of({"io": 17, "cpu": 1})  # the first probe from START (see test_policy)


def views(split: Split) -> list[JobView]:
    counts = dict(split)
    return [
        JobView("io", 32, counts["io"], model=fitted(IO_HEAVY)),
        JobView("cpu", 32, counts["cpu"], model=fitted(CPU_HEAVY)),
    ]


def proposal(split: Split, placed: bool = True) -> dict[str, WorkerDecision]:
    return {j: WorkerDecision(j, k, "the model's", placed=placed) for j, k in split}


def measure(truth: MeasuredTruth, split: Split, score: float, now: float) -> None:
    for job, _ in split:
        for _ in range(MEASURE_WINDOWS):
            truth.record(split, job, score / len(split), now)


def steer(truth: MeasuredTruth, current: Split, proposed: Split, now: float, changed: float):
    return truth.steer(views(current), BUDGET, proposal(proposed), current, LIMITS, now, changed)


def counts(decisions: dict[str, WorkerDecision]) -> Split:
    return split_of({j: d.num_workers for j, d in decisions.items()})


def probed_from_start(truth: MeasuredTruth) -> None:
    measure(truth, START, 1.0, now=4.0)
    out = steer(truth, START, START, now=4.0 + PROBE_AFTER_S, changed=0.0)
    assert counts(out) == PROBED and out["io"].reason.startswith("probing (cpu=1, io=17)")
    assert truth.probed == PROBED and truth.previous == START


def test_nothing_is_steered_until_every_job_is_placed() -> None:
    truth = MeasuredTruth(previous=START, probe_wait=40.0)
    decisions = proposal(PROBED, placed=False)
    out = truth.steer(views(START), BUDGET, decisions, START, LIMITS, 100.0, 0.0)
    assert out is decisions and truth.previous is None and truth.probe_wait == PROBE_AFTER_S


def test_no_probe_before_the_split_is_measured_and_steady() -> None:
    truth = MeasuredTruth()
    assert counts(steer(truth, START, START, now=100.0, changed=0.0)) == START  # not measured
    measure(truth, START, 1.0, now=1.0)
    assert counts(steer(truth, START, START, now=2.0, changed=0.0)) == START  # not steady yet
    assert truth.probed is None


def test_a_probe_is_held_until_measured_then_undone_if_it_does_not_pay() -> None:
    truth = MeasuredTruth()
    probed_from_start(truth)
    # at the probe: the model wants its split back; the probe runs until it is measured
    out = steer(truth, PROBED, START, now=12.0, changed=9.0)
    assert counts(out) == PROBED and out["io"].reason == "probing (cpu=1, io=17): measuring it"
    # measured worse than the split it left (it is a lighter probe: a tie would stay): back
    # there, and twice the wait
    assert truth.lighter
    measure(truth, PROBED, 0.9, now=14.0)
    out = steer(truth, PROBED, PROBED, now=14.0, changed=9.0)  # the model would stay there
    assert counts(out) == START and "a probe that did not pay" in out["io"].reason
    assert truth.probed is None and truth.paid is None
    assert truth.probe_wait == 2 * PROBE_AFTER_S


def test_a_probe_that_pays_stays_and_its_move_is_tried_once_more() -> None:
    truth = MeasuredTruth()
    probed_from_start(truth)
    truth.probe_wait = 4 * PROBE_AFTER_S  # a probe that pays resets the wait
    measure(truth, PROBED, 1.1, now=13.0)
    out = steer(truth, PROBED, PROBED, now=13.0, changed=9.0)
    assert counts(out) == PROBED
    assert truth.paid == {"io": 1, "cpu": -1} and truth.probe_wait == PROBE_AFTER_S
    # steady there, the paid move is looked at once (here it would take cpu below its floor of
    # one worker, so it is not made) and used up
    out = steer(truth, PROBED, PROBED, now=9.0 + PROBE_AFTER_S, changed=9.0)
    assert truth.paid is None and dict(counts(out))["cpu"] >= 1


def test_waits_double_up_to_their_cap() -> None:
    truth = MeasuredTruth(probe_wait=PROBE_MAX_WAIT_S)
    probed_from_start_late(truth)
    measure(truth, PROBED, 0.9, now=300.0)
    steer(truth, PROBED, START, now=300.0, changed=290.0)
    assert truth.probe_wait == PROBE_MAX_WAIT_S


def probed_from_start_late(truth: MeasuredTruth) -> None:
    measure(truth, START, 1.0, now=280.0)
    out = steer(truth, START, START, now=280.0, changed=0.0)
    assert counts(out) == PROBED


def test_a_job_arriving_starts_afresh() -> None:
    truth = MeasuredTruth()
    probed_from_start(truth)
    truth.probe_wait = 80.0
    three = split_of({"io": 16, "cpu": 1, "new": 1})
    jobs = [*views(PROBED), JobView("new", 32, 1, model=fitted(IO_HEAVY))]
    truth.steer(jobs, BUDGET, proposal(three), three, {**LIMITS, "new": 1.0}, 20.0, 19.0)
    assert truth.probed is None and truth.paid is None and truth.probe_wait == PROBE_AFTER_S


def test_forgetting_drops_every_measurement() -> None:
    truth = MeasuredTruth()
    measure(truth, START, 1.0, now=1.0)
    assert truth.known(START, LIMITS, 1.0)
    truth.forget()
    assert not truth.known(START, LIMITS, 1.0)


def test_a_probe_under_way_when_the_costs_change_is_not_judged_on_them() -> None:
    """Seen live: a probe was under way when a job's costs changed and every measurement was
    forgotten; measured again, it "paid" (the split it left had no measurement left to beat),
    and its move was made once more and held, while the job whose costs had halved waited
    40 s for the model's move. After a forgetting the probe is dropped: the model's proposal
    runs at once, and nothing is followed as having paid."""
    for forget in (MeasuredTruth.forget, None):
        truth = MeasuredTruth()
        probed_from_start(truth)
        truth.probe_wait = 80.0
        if forget is not None:
            forget(truth)
        else:  # a window unlike before at the split: the node changed
            measure(truth, PROBED, 1.0, now=12.0)
            assert truth.record(PROBED, "io", 5.0, now=13.0)
            assert truth.measured.samples == {PROBED: {"io": [5.0]}}  # the new costs' first
        assert truth.probed is None and truth.paid is None and truth.previous is None
        assert truth.probe_wait == 80.0  # the wait before the next probe is kept
        measure(truth, PROBED, 1.0, now=14.0)
        model = split_of({"io": 12, "cpu": 6})
        out = steer(truth, PROBED, model, now=14.5, changed=10.0)
        assert counts(out) == model and out["io"].reason == "the model's"


def test_a_split_that_no_longer_fits_is_not_returned_to() -> None:
    """Back to the split left, unless it no longer fits the budgets (memory grew since)."""
    truth = MeasuredTruth()
    probed_from_start(truth)
    measure(truth, PROBED, 0.9, now=14.0)
    tight = [replace(v, max_workers=15) if v.job_id == "io" else v for v in views(PROBED)]
    decisions = proposal(PROBED)
    out = truth.steer(tight, BUDGET, decisions, PROBED, LIMITS, 14.0, 9.0)
    assert out is decisions  # io=16 (START) is past io's max_workers now: the model's stands
