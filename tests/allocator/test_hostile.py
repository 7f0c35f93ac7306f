"""The allocator against hostile or broken input: one job can never stop decisions for others."""

from __future__ import annotations

from pathlib import Path

import pytest

from dloader._shared.allocator_messages import GradientStats, JobSpec, Measurement
from dloader.allocator.config import Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.store import AllocatorStore
from dloader.errors import InvalidArgument
from dloader.predictor import ScalingModel, ScalingParams

GOOD = {
    "alpha_c": 0.05,
    "beta_c": 0.002,
    "alpha_n": 0.01,
    "beta_n": 0.0001,
    "alpha_r": 0.005,
    "beta_r": 0.00005,
    "gamma": 1.5,
}


def core(tmp_path: Path) -> AllocatorCore:
    c = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    c.register_node("n0", 4)
    return c


def request(job_id: str, **kw: object) -> JobSpec:
    return JobSpec(job_id=job_id, batch_size=64, max_batch_size=1024, scaling=dict(GOOD), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"scaling": dict.fromkeys(GOOD, 1e308)}, "job.scaling"),
        ({"gradient": GradientStats(64, 1e-308, 1e308)}, "job.gradient"),
        ({"priority": 1e308}, "job.priority"),
        ({"batch_size": 1 << 40}, "job.batch_size"),
        ({"max_gpus": 1 << 40}, "job.max_gpus"),
        ({"restart_seconds": float("nan")}, "job.restart_seconds"),
        ({"measurements": (Measurement(1, 1, 8, 0.1),) * 30_000}, "job.measurements"),
    ],
)
def test_extreme_submissions_are_refused_naming_the_field(
    tmp_path: Path, change: dict[str, object], field: str
) -> None:
    c = core(tmp_path)
    base = request("bad")
    req = JobSpec(**{**base.__dict__, **change})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument) as err:
        c.submit(req)
    assert err.value.field.startswith(field), err.value
    assert "bad" not in c.jobs


def test_a_job_whose_model_breaks_later_is_set_aside_and_the_others_decided(
    tmp_path: Path,
) -> None:
    c = core(tmp_path)
    c.submit(request("good"))
    c.submit(request("broken"))
    # its model becomes unusable after submission (a later refit gone wrong)
    c.jobs["broken"].model = ScalingModel(ScalingParams(**dict.fromkeys(GOOD, 1e308)))
    snap = c.decide()
    views = {a.job_id: a for a in snap.allocations}
    assert views["good"].gpus >= 1
    assert views["broken"].gpus == 0 and views["broken"].reason.startswith("set aside")
    # and the next decision too
    assert {a.job_id: a for a in c.decide().allocations}["good"].gpus >= 1


def test_a_stored_row_that_no_longer_validates_does_not_stop_a_restart(tmp_path: Path) -> None:
    c = core(tmp_path)
    c.submit(request("good"))
    c.submit(request("stale"))
    c.decide()
    c.store._exec("UPDATE jobs SET spec = ? WHERE job_id = 'stale'", (b'{"job_id": "stale"}',))
    c.store.close()
    again = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    assert "good" in again.jobs and "stale" not in again.jobs
    assert again.store.known_job("stale")  # kept in the file, set aside


def test_a_restart_reads_fitted_models_instead_of_refitting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = core(tmp_path)
    points = [Measurement(1, k, 8, 0.1 + 0.01 * k) for k in (1, 2, 4)]
    c.submit(JobSpec(job_id="fitted", batch_size=32, measurements=tuple(points)))
    before = c.jobs["fitted"].model.params
    c.store.close()

    def no_fit(*a: object, **k: object) -> None:
        raise AssertionError("refitted at start")

    monkeypatch.setattr(ScalingModel, "fit", no_fit)
    again = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    assert again.jobs["fitted"].model.params == before


def test_one_caller_cannot_take_every_job_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 at the allocator: each caller (a local uid, a TCP token's role) holds at most its
    share of the active jobs, and operators keep places of their own (the caps made small)."""
    import dloader.allocator.core as core_mod
    from dloader._daemon.peer import CALLER, Caller, Role
    from dloader.errors import ResourceExhausted

    monkeypatch.setattr(core_mod, "MAX_ACTIVE_JOBS", 8)
    monkeypatch.setattr(core_mod, "OPERATOR_RESERVE", 2)
    monkeypatch.setattr(core_mod, "MAX_JOBS_PER_CALLER", 4)
    c = core(tmp_path)

    def submit_as(caller: Caller, job_id: str) -> None:
        token = CALLER.set(caller)
        try:
            c.submit(request(job_id))
        finally:
            CALLER.reset(token)

    alice, bob, tcp = (
        Caller(Role.CLIENT, 1001, 1),
        Caller(Role.CLIENT, 1002, 2),
        Caller(Role.CLIENT),
    )
    for i in range(4):
        submit_as(alice, f"a{i}")
    with pytest.raises(ResourceExhausted, match="uid 1001 holds 4 active jobs"):
        submit_as(alice, "a4")
    submit_as(bob, "b0")
    submit_as(tcp, "t0")  # the client token is a caller of its own
    with pytest.raises(ResourceExhausted, match="kept for operators"):
        submit_as(bob, "b1")
    c.submit(request("ops-0"))  # the operator (no caller: the daemon's own code) still can
    c.submit(request("ops-1"))
    assert {j.owner for j in c.jobs.values()} == {"uid 1001", "uid 1002", "client token", ""}
    c.store.close()
    again = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    assert again.jobs["a0"].owner == "uid 1001"  # a restart keeps who owns what


def test_a_restart_keeps_each_jobs_age(tmp_path: Path) -> None:
    """The restart penalty weighs a job's age: a restarted allocator must not make every job
    new again (the submit time is stored, on the core's clock)."""
    now = [1000.0]
    c = AllocatorCore(
        AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60), clock=lambda: now[0]
    )
    c.submit(request("old"))
    c.store.close()
    now[0] = 5000.0
    again = AllocatorCore(
        AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60), clock=lambda: now[0]
    )
    assert again.jobs["old"].state([], now[0]).age_s == pytest.approx(4000.0)


@pytest.mark.parametrize("placement", ["{not json", '"n0"', '{"n0": "4"}', '{"n0": -1}'])
def test_a_corrupt_placement_is_set_aside_not_fatal(
    tmp_path: Path, placement: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored placement that no longer reads once blocked start-up with a message naming
    neither file nor row; now that job is set aside, named, and the others are restored."""
    c = core(tmp_path)
    c.submit(request("good"))
    c.submit(request("bad"))
    c.store._exec("UPDATE jobs SET placement = ? WHERE job_id = 'bad'", (placement,))
    c.store.close()
    restarted = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    assert set(restarted.jobs) == {"good"}
    assert f"{tmp_path / 'a.db'}: jobs row 'bad' no longer validates" in caplog.text


@pytest.mark.parametrize("rate", [5e-324, 1e-320, 1e-300])
def test_a_job_with_a_vanishing_input_curve_does_not_stop_the_others(
    tmp_path: Path, rate: float
) -> None:
    """#49 §1 (high): a job submitted with the input curve ``(4096 cores, 5e-324 samples/s)``
    failed every decision round ("predicted throughput is 0 at every candidate"; with 1e-320 a
    ZeroDivisionError), and another user's job was never placed. Such a curve is refused at
    submission; a job the policy cannot place for any reason is set aside alone."""
    c = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    c.register_node("n0", 4, cpus=16)
    with pytest.raises(InvalidArgument) as err:
        c.submit(request("tiny", input_curve=((4096.0, rate),)))
    assert err.value.field.startswith("job.input_curve")
    c.submit(request("other"))
    assert {a.job_id: a for a in c.decide().allocations}["other"].gpus >= 1


def test_a_job_the_policy_cannot_place_on_this_cluster_is_set_aside_alone(
    tmp_path: Path,
) -> None:
    """The check that set a bad job aside tried it on a cluster without cores, so a model
    that fails only where cores are limited stopped every decision: now the job is tried on
    the cluster being decided."""
    from dloader.predictor import InputModel

    c = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
    c.register_node("n0", 4, cpus=16)
    c.submit(request("bad"))
    c.submit(request("other"))
    # a model that breaks after submission (as a later report's curve could)
    object.__setattr__(c.jobs["bad"], "input", InputModel(((4096.0, 5e-324),)))
    views = {a.job_id: a for a in c.decide().allocations}
    assert views["other"].gpus >= 1
    assert views["bad"].gpus == 0 and views["bad"].reason.startswith("set aside")


def test_a_token_that_is_given_must_be_the_jobs_even_for_an_operator(tmp_path: Path) -> None:
    """#49 §1 (high): the launcher checks its token file with an empty UpdateJob, which passed
    for an operator whatever the token, so root's launcher ran its script on another user's
    job. A token that is given is checked whoever calls."""
    from dloader._daemon.peer import CALLER, Caller, Role
    from dloader.errors import PermissionDenied

    c = core(tmp_path)
    nobody = Caller(Role.CLIENT, 65534, 1)
    token = CALLER.set(nobody)
    try:
        _, _, job_token = c.submit(request("nobodys"))
    finally:
        CALLER.reset(token)
    with pytest.raises(PermissionDenied, match="the token given is not the job's"):
        c.update("nobodys", [], token="0" * 32)  # the operator (root's launcher), wrong token
    c.update("nobodys", [], token=job_token)  # the right token: an operator may
    c.update("nobodys", [])  # and an operator with no token (dloaderctl) too


def test_a_job_an_operator_submitted_is_not_anyones_with_its_token(tmp_path: Path) -> None:
    """#49 §1 (medium): jobs an operator submitted were protected by their token alone; a user
    who got the token (a file it made first at the launcher's path) completed root's job."""
    from dloader._daemon.peer import CALLER, Caller, Role
    from dloader.errors import PermissionDenied

    c = core(tmp_path)
    _, _, job_token = c.submit(request("roots"))  # the operator
    for caller in (Caller(Role.CLIENT, 65534, 1), Caller(Role.CLIENT)):  # a user, a TCP client
        token = CALLER.set(caller)
        try:
            with pytest.raises(PermissionDenied, match="only an operator may act on it"):
                c.complete("roots", token=job_token)
        finally:
            CALLER.reset(token)
    assert "roots" in c.jobs
    c.complete("roots", token=job_token)
