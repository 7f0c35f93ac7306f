"""The gRPC face of the allocator: a thin servicer over :class:`.core.AllocatorCore`.

The daemons' shared conventions (:func:`dloader._daemon.start_server`): Unix socket by
default, bearer token on TCP, domain errors mapped to status codes, health and reflection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from dloader._daemon.server import ListenConfig, Serving, start_server
from dloader._shared.allocator_messages import (
    GradientStats,
    JobSpec,
    Measurement,
    NodeJobReport,
)
from dloader.allocator.core import AllocatorCore
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["AllocatorServicer", "build_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["ClusterAllocator"].full_name


class AllocatorServicer(pb_grpc.ClusterAllocatorServicer):
    """Translates messages; the core does the work and raises domain errors."""

    def __init__(self, core: AllocatorCore) -> None:
        self.core = core

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitJobResponse:
        # checking and fitting a job is CPU work: off the event loop, so that other clients
        # are not held up; the core changes only on the loop (commit)
        job = await asyncio.to_thread(lambda: self.core.prepare(JobSpec.from_pb(request.job)))
        job_id, pos, token = self.core.commit(job)
        return pb.SubmitJobResponse(job_id=job_id, queue_position=pos, token=token)

    async def UpdateJob(
        self, request: pb.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateJobResponse:
        staged = await asyncio.to_thread(
            self.core.stage_update,
            request.job_id,
            Measurement.many_from_pb(request.measurements),
            GradientStats.from_pb(request.gradient, request.HasField("gradient")),
            request.priority,
            request.token,
            request.done,
        )
        self.core.apply_update(staged, request.done)
        return pb.UpdateJobResponse()

    async def CompleteJob(
        self, request: pb.CompleteJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteJobResponse:
        self.core.complete(request.job_id, request.failed, request.token)
        return pb.CompleteJobResponse()

    async def RegisterNode(
        self, request: pb.RegisterNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterNodeResponse:
        self.core.register_node(
            request.node_id,
            request.gpus,
            request.sidecar_address,
            request.host,
            request.cpus,
            request.lends,
        )
        return pb.RegisterNodeResponse()

    async def ReportNode(
        self, request: pb.ReportNodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportNodeResponse:
        self.core.report_node(
            request.node_id,
            request.free_gpus,
            [NodeJobReport.from_pb(j) for j in request.jobs],
        )
        return pb.ReportNodeResponse()

    async def GetAllocations(
        self, request: pb.GetAllocationsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocationSet:
        return self.core.snapshot().to_pb()

    async def WatchAllocations(
        self, request: pb.WatchAllocationsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.AllocationSet]:
        if request.job_id:
            self.core.get(request.job_id)  # NOT_FOUND for an unknown job
        box = self.core.open_watch()  # RESOURCE_EXHAUSTED past the caller's share
        async for snap in self.core.watch(box):
            yield snap.to_pb(request.job_id, request.node_id)

    async def Configure(
        self, request: pb.ConfigureRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocatorConfig:
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
