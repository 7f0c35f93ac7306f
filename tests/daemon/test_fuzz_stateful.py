"""Stateful fuzzing: real daemons driven through random sequences of valid and hostile steps.

The stateless fuzz (``test_fuzz.py``) mostly meets the first lookup or check. Here a job is
submitted (or registered) first, then random updates, reports and completions follow **with the
right token**, so random values reach the model fitting, the policy and the stores behind the
checks. After every step: no call ends in INTERNAL or UNKNOWN or misses its deadline, and the
allocator never gives a node more GPUs than it has, nor a job a batch outside its range.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from dloader.v1 import allocator_pb2 as apb
from dloader.v1 import node_pb2 as pb
from tests.allocator.test_service import SCALING, Allocator
from tests.daemon.test_fuzz import ALLOWED, DEADLINE_S, messages
from tests.sidecar.conftest import Sidecar

pytestmark = pytest.mark.integration

STEPS = 30  # per run; the slow lane runs longer sequences
EXAMPLES = 8  # runs, each on a new pair of daemons
NODES = {"n0": 4, "n1": 4}
CODES: dict[str, int] = {}  # requests by call and status, over a test (printed)

_FLOAT = st.one_of(
    st.floats(min_value=1e-4, max_value=10.0), st.sampled_from([0.0, -1.0, math.nan, 1e308])
)
_SIZE = st.one_of(st.integers(1, 4096), st.sampled_from([0, 2**32 - 1]))
#: A measured step: (nodes, replicas, local batch, step s, sync s), valid most of the time so
#: that updates reach the model fit, now and then hostile.
_MEASUREMENT = st.one_of(
    st.builds(
        lambda n, k, b, step, share: (n, n * k, b, step, step * share),
        st.integers(1, 2),
        st.integers(1, 4),
        st.integers(1, 512),
        st.floats(0.01, 2.0),
        st.floats(0.0, 0.5),
    ),
    st.tuples(st.integers(0, 3), st.integers(0, 9), _SIZE, _FLOAT, _FLOAT),
)


def _code(fn: Any, *args: Any, **kw: Any) -> tuple[grpc.StatusCode, Any]:
    try:
        return grpc.StatusCode.OK, fn(*args, timeout=DEADLINE_S, **kw)
    except grpc.RpcError as exc:
        return exc.code(), None


def _report(workers: int, batch: int, rate: float, idle: float, step: float) -> Any:
    worker = pb.WorkerReport(pid=os.getpid(), fetch_seconds=step, cpu_seconds=step / 2, batches=3)
    return pb.JobReport(
        num_workers=workers,
        batch_size=batch,
        samples_per_second=rate,
        idle_share=idle,
        step_seconds=step,
        wait_seconds=step * idle,
        window_seconds=2.0,
        samples=int(rate * 2),
        workers=[worker],
    )


#: A loader's report: valid most of the time (it reaches the model), now and then hostile.
_REPORT = st.one_of(
    st.builds(
        _report,
        st.integers(0, 64),
        st.integers(1, 1024),
        st.floats(0.0, 5000.0),
        st.floats(0.0, 1.0),
        st.floats(1e-3, 2.0),
    ),
    messages(pb.JobReport.DESCRIPTOR),
)


class Daemons(RuleBasedStateMachine):
    """One sidecar and one allocator, shared by a run's steps (a new pair per run)."""

    jobs = Bundle("jobs")  # (job_id, token, min batch, max batch) at the allocator
    loaders = Bundle("loaders")  # (job_id, token) at the sidecar

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="dloader-fuzz-"))
        self.sidecar = Sidecar(self.tmp / "s")
        self.allocator = Allocator(self.tmp / "a")
        for node, gpus in NODES.items():
            self.allocator.stub.RegisterNode(apb.RegisterNodeRequest(node_id=node, gpus=gpus))
        self.ranges: dict[str, tuple[int, int]] = {}
        self.seq = 0

    def teardown(self) -> None:
        self.sidecar.stop()
        self.allocator.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _ok(self, what: str, code: grpc.StatusCode) -> None:
        CODES[f"{what} {code.name}"] = CODES.get(f"{what} {code.name}", 0) + 1
        assert code in ALLOWED, f"{what} answered {code.name}"

    # ------------------------------------------------------------------ every run starts so

    @initialize(target=jobs)
    def a_measured_job(self) -> Any:
        """A job with a valid measurement sent with its token: every run reaches the model fit
        (random updates alone may all be refused before it)."""
        job = self.submit(64, 2, 4)
        req = apb.UpdateJobRequest(job_id=job[0], token=job[1])
        req.measurements.add(nodes=1, replicas=1, local_batch_size=32, step_seconds=0.1)
        code, _ = _code(self.allocator.stub.UpdateJob, req)
        self._ok("UpdateJob", code)
        assert code == grpc.StatusCode.OK, code
        return job

    @initialize(target=loaders)
    def a_reporting_loader(self) -> Any:
        """A loader with a valid report sent with its token: every run reaches the sidecar's
        model."""
        loader = self.register(2, 32)
        r = _report(2, 32, 500.0, 0.3, 0.05)
        r.job_id, r.token = loader
        code, _ = _code(self.sidecar.stub.Report, iter([r]))
        self._ok("Report", code)
        assert code == grpc.StatusCode.OK, code
        return loader

    # ------------------------------------------------------------------ allocator

    @rule(
        target=jobs, batch=st.integers(1, 512), spread=st.integers(1, 8), max_gpus=st.integers(0, 8)
    )
    def submit(self, batch: int, spread: int, max_gpus: int) -> Any:
        self.seq += 1
        job_id = f"job-{self.seq}"
        spec = apb.JobSpec(
            job_id=job_id,
            batch_size=batch,
            min_batch_size=batch,
            max_batch_size=batch * spread,
            max_gpus=max_gpus,
            scaling=SCALING,
        )
        code, r = _code(self.allocator.stub.SubmitJob, apb.SubmitJobRequest(job=spec))
        self._ok("SubmitJob", code)
        if code != grpc.StatusCode.OK:
            return (job_id, "", batch, batch * spread)
        self.ranges[job_id] = (batch, batch * spread)
        return (job_id, r.token, batch, batch * spread)

    @rule(
        job=jobs,
        steps=st.lists(_MEASUREMENT, max_size=6),
        priority=st.one_of(st.just(0.0), _FLOAT),
        gradient=st.one_of(st.none(), messages(apb.GradientStats.DESCRIPTOR)),
    )
    def update(self, job: Any, steps: list[Any], priority: float, gradient: Any) -> None:
        req = apb.UpdateJobRequest(job_id=job[0], token=job[1], priority=priority)
        if gradient is not None:
            req.gradient.CopyFrom(gradient)
        for nodes, replicas, local, step, sync in steps:
            req.measurements.add(
                nodes=nodes, replicas=replicas, local_batch_size=local,
                step_seconds=step, sync_seconds=sync,
            )  # fmt: skip
        self._ok("UpdateJob", _code(self.allocator.stub.UpdateJob, req)[0])

    @rule(free=st.dictionaries(st.sampled_from(sorted(NODES)), st.integers(0, 6), min_size=1),
          report=messages(apb.NodeJobReport.DESCRIPTOR), job=jobs)  # fmt: skip
    def report_node(self, free: dict[str, int], report: Any, job: Any) -> None:
        report.job_id = job[0]
        for node, gpus in free.items():
            req = apb.ReportNodeRequest(node_id=node, free_gpus=gpus, jobs=[report])
            self._ok("ReportNode", _code(self.allocator.stub.ReportNode, req)[0])

    @rule(job=consumes(jobs), failed=st.booleans())
    def complete(self, job: Any, failed: bool) -> None:
        req = apb.CompleteJobRequest(job_id=job[0], token=job[1], failed=failed)
        self._ok("CompleteJob", _code(self.allocator.stub.CompleteJob, req)[0])
        self.ranges.pop(job[0], None)

    # ------------------------------------------------------------------ sidecar

    @rule(target=loaders, workers=st.integers(0, 64), batch=st.integers(1, 1024))
    def register(self, workers: int, batch: int) -> Any:
        req = pb.RegisterJobRequest(
            name=f"loader-{self.seq}", pids=[os.getpid()], num_workers=workers, batch_size=batch
        )
        code, r = _code(self.sidecar.stub.RegisterJob, req)
        self._ok("RegisterJob", code)
        return (r.job_id, r.token) if r is not None else ("", "")

    @rule(loader=loaders, reports=st.lists(_REPORT, min_size=1, max_size=3))
    def report(self, loader: Any, reports: list[Any]) -> None:
        for r in reports:
            r.job_id, r.token = loader
        self._ok("Report", _code(self.sidecar.stub.Report, iter(reports))[0])

    @rule(loader=consumes(loaders))
    def deregister(self, loader: Any) -> None:
        req = pb.DeregisterJobRequest(job_id=loader[0], token=loader[1])
        self._ok("DeregisterJob", _code(self.sidecar.stub.DeregisterJob, req)[0])

    # ------------------------------------------------------------------ after every step

    @invariant()
    def allocations_fit_the_nodes_and_the_jobs(self) -> None:
        code, snap = _code(self.allocator.stub.GetAllocations, apb.GetAllocationsRequest())
        assert code == grpc.StatusCode.OK, code
        used: dict[str, int] = {}
        for a in snap.allocations:
            for share in a.nodes:
                used[share.node_id] = used.get(share.node_id, 0) + share.gpus
            lo, hi = self.ranges.get(a.job_id, (1, 2**32))
            assert a.gpus == 0 or lo <= a.batch_size <= hi, (a.job_id, a.batch_size, lo, hi)
        assert all(used[n] <= NODES[n] for n in used), used

    @invariant()
    def the_sidecar_answers(self) -> None:
        code, _ = _code(self.sidecar.stub.ListJobs, pb.ListJobsRequest())
        assert code == grpc.StatusCode.OK, code


def _run(examples: int, steps: int) -> None:
    run = Daemons.TestCase
    run.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    CODES.clear()
    run().runTest()
    print("stateful fuzz, requests by call and status:", dict(sorted(CODES.items())))
    # the steps went past the lookups: valid updates and reports were taken
    assert CODES.get("UpdateJob OK", 0) and CODES.get("Report OK", 0), CODES


@pytest.mark.timeout(900)
def test_random_sequences_of_steps() -> None:
    _run(EXAMPLES, STEPS)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_many_random_sequences_of_steps() -> None:
    _run(40, 60)
