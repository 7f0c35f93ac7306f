"""The gRPC face of the allocator: a thin servicer over :class:`.core.AllocatorCore`.

The daemons' shared conventions (:func:`dloader._daemon.start_server`): Unix socket by
default, bearer token on TCP, domain errors mapped to status codes, health and reflection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from dloader._daemon.server import ListenConfig, Serving, start_server
from dloader.allocator.core import (
    MAX_MEASUREMENTS_PER_CALL,
    AllocatorCore,
    GradientStats,
    JobRequest,
    Measurement,
    NodeJobReport,
    Snapshot,
)
from dloader.errors import InvalidArgument
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["AllocatorServicer", "build_server", "snapshot_pb"]

SERVICE = pb.DESCRIPTOR.services_by_name["ClusterAllocator"].full_name


def _measurements(items: Sequence[pb.Measurement]) -> list[Measurement]:
    if len(items) > MAX_MEASUREMENTS_PER_CALL:  # refuse before converting them
        raise InvalidArgument(
            "measurements", f"{len(items)} measurements: at most {MAX_MEASUREMENTS_PER_CALL}"
        )
    return [
        Measurement(m.nodes, m.replicas, m.local_batch_size, m.step_seconds, m.sync_seconds)
        for m in items
    ]


def _gradient(msg: pb.GradientStats, present: bool) -> GradientStats | None:
    return GradientStats(msg.base_batch_size, msg.grad_sqr, msg.grad_var) if present else None


def job_request(spec: pb.JobSpec) -> JobRequest:
    """A ``JobSpec`` message as the core's request."""
    scaling = None
    if spec.HasField("scaling"):
        s = spec.scaling
        scaling = {
            "alpha_c": s.alpha_c,
            "beta_c": s.beta_c,
            "alpha_n": s.alpha_n,
            "beta_n": s.beta_n,
            "alpha_r": s.alpha_r,
            "beta_r": s.beta_r,
            "gamma": s.gamma,
        }
    return JobRequest(
        job_id=spec.job_id,
        batch_size=spec.batch_size,
        min_gpus=spec.min_gpus,
        max_gpus=spec.max_gpus,
        requested_gpus=spec.requested_gpus,
        min_batch_size=spec.min_batch_size,
        max_batch_size=spec.max_batch_size,
        min_local_batch_size=spec.min_local_batch_size,
        max_local_batch_size=spec.max_local_batch_size,
        priority=spec.priority,
        restart_s=spec.restart_seconds,
        scaling=scaling,
        measurements=_measurements(spec.measurements),
        gradient=_gradient(spec.gradient, spec.HasField("gradient")),
    )


def snapshot_pb(snap: Snapshot, job_id: str = "", node_id: str = "") -> pb.AllocationSet:
    """A snapshot as a message, optionally only one job's or one node's allocations."""
    allocations = [
        pb.Allocation(
            job_id=a.job_id,
            gpus=a.gpus,
            nodes=[pb.NodeShare(node_id=n, gpus=g) for n, g in sorted(a.nodes.items())],
            batch_size=a.batch_size,
            reason=a.reason,
            queue_position=a.queue_position,
            rendezvous=a.rendezvous,
            generation=a.generation,
        )
        for a in snap.allocations
        if (not job_id or a.job_id == job_id) and (not node_id or node_id in a.nodes)
    ]
    return pb.AllocationSet(
        version=snap.version,
        dry_run=snap.dry_run,
        policy=snap.policy,
        allocations=allocations,
        decided_at=snap.decided_at,
        decision_ms=snap.decision_ms,
    )


class AllocatorServicer(pb_grpc.ClusterAllocatorServicer):
    """Translates messages; the core does the work and raises domain errors."""

    def __init__(self, core: AllocatorCore) -> None:
        self.core = core

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: object
    ) -> pb.SubmitJobResponse:
        # checking and fitting a job is CPU work: off the event loop, so that other clients
        # are not held up; the core changes only on the loop (commit)
        job = await asyncio.to_thread(lambda: self.core.prepare(job_request(request.job)))
        job_id, pos, token = self.core.commit(job)
        return pb.SubmitJobResponse(job_id=job_id, queue_position=pos, token=token)

    async def UpdateJob(
        self, request: pb.UpdateJobRequest, context: object
    ) -> pb.UpdateJobResponse:
        staged = await asyncio.to_thread(
            self.core.stage_update,
            request.job_id,
            _measurements(request.measurements),
            _gradient(request.gradient, request.HasField("gradient")),
            request.priority,
            request.token,
        )
        self.core.apply_update(staged)
        return pb.UpdateJobResponse()

    async def CompleteJob(
        self, request: pb.CompleteJobRequest, context: object
    ) -> pb.CompleteJobResponse:
        self.core.complete(request.job_id, request.failed, request.token)
        return pb.CompleteJobResponse()

    async def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: object
    ) -> pb.RegisterNodeResponse:
        self.core.register_node(
            request.node_id, request.gpus, request.sidecar_address, request.host
        )
        return pb.RegisterNodeResponse()

    async def ReportNode(
        self, request: pb.ReportNodeRequest, context: object
    ) -> pb.ReportNodeResponse:
        self.core.report_node(
            request.node_id,
            request.free_gpus,
            [
                NodeJobReport(
                    j.job_id,
                    j.samples_per_second,
                    j.batch_size,
                    tuple(_measurements(j.measurements)),
                    _gradient(j.gradient, j.HasField("gradient")),
                )
                for j in request.jobs
            ],
        )
        return pb.ReportNodeResponse()

    async def GetAllocations(
        self, request: pb.GetAllocationsRequest, context: object
    ) -> pb.AllocationSet:
        return snapshot_pb(self.core.snapshot())

    async def WatchAllocations(
        self, request: pb.WatchAllocationsRequest, context: object
    ) -> AsyncIterator[pb.AllocationSet]:
        if request.job_id:
            self.core.get(request.job_id)  # NOT_FOUND for an unknown job
        async for snap in self.core.watch():
            yield snapshot_pb(snap, request.job_id, request.node_id)

    async def Configure(self, request: pb.ConfigureRequest, context: object) -> pb.AllocatorConfig:
        c = request.config
        s = self.core.configure(
            c.policy,
            c.interval_seconds,
            c.restart_seconds,
            c.dry_run if request.set_dry_run else None,
        )
        return pb.AllocatorConfig(
            policy=s.policy,
            interval_seconds=s.interval_s,
            dry_run=s.dry_run,
            restart_seconds=s.restart_s,
        )


async def build_server(core: AllocatorCore, listen: ListenConfig) -> Serving:
    """A started allocator server."""
    return await start_server(
        lambda server: pb_grpc.add_ClusterAllocatorServicer_to_server(
            AllocatorServicer(core), server
        ),
        [SERVICE],
        listen,
    )
