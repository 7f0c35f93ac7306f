"""The gRPC face of the sidecar: a thin servicer over :class:`dloader.sidecar.core.NodeCore`.

The server's conventions (error mapping, token, TLS, health, reflection, size caps) are the
daemons' shared ones: :func:`dloader._daemon.start_server`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from dloader._daemon.server import ListenConfig, Serving, start_server
from dloader._shared.node_messages import JobReport, Registration
from dloader.errors import NotFound, PermissionDenied, shown
from dloader.sidecar.config import PolicySettings
from dloader.sidecar.core import Job, NodeCore
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

__all__ = ["NodeServicer", "build_server"]


class NodeServicer(pb_grpc.NodeServiceServicer):
    """Translates messages to and from :class:`NodeCore` calls."""

    def __init__(self, core: NodeCore, node_status: Callable[[], pb.NodeStatus]) -> None:
        self.core = core
        self._node_status = node_status

    async def RegisterJob(
        self, request: pb.RegisterJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterJobResponse:
        job = self.core.register(Registration.from_pb(request))
        return pb.RegisterJobResponse(
            job_id=job.job_id,
            token=job.record.token,
            directive=job.directive.to_pb(job.job_id),
        )

    async def Report(
        self, request_iterator: AsyncIterator[pb.JobReport], context: grpc.aio.ServicerContext
    ) -> pb.ReportSummary:
        job: Job | None = None
        accepted = 0
        async for report in request_iterator:
            if job is None:
                job = self.core.authenticate(report.job_id, report.token)
            elif report.job_id != job.job_id:
                raise PermissionDenied(
                    "job_id",
                    f"a report for job {shown(report.job_id)} on the "
                    f"stream of job {job.job_id!r} is refused",
                )
            if job.job_id not in self.core.jobs:
                raise NotFound("job_id", f"job {job.job_id!r} has ended")
            self.core.report(job, JobReport.from_pb(report))
            accepted += 1
        return pb.ReportSummary(accepted=accepted)

    async def WatchDirectives(
        self, request: pb.WatchDirectivesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Directive]:
        job = self.core.authenticate(request.job_id, request.token)
        box = self.core.open_watch(job)  # RESOURCE_EXHAUSTED past the caller's share
        async for d in self.core.watch(job, box):
            yield d.to_pb(job.job_id)

    async def DeregisterJob(
        self, request: pb.DeregisterJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeregisterJobResponse:
        self.core.deregister(request.job_id, request.token)
        return pb.DeregisterJobResponse()

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListJobsResponse:
        return pb.ListJobsResponse(jobs=[self.job_status(j) for j in self.core.jobs.values()])

    def job_status(self, job: Job) -> pb.JobStatus:
        """A job as a status message."""
        r = job.last_report
        limit = (
            job.model.accelerator_limit(job.record.batch_size) if job.model.observations else 0.0
        )
        tree = job.tree
        return pb.JobStatus(
            job_id=job.job_id,
            name=job.record.name,
            limits=job.record.limits.to_pb(),
            pids=job.record.pids,
            num_workers=job.record.num_workers,
            batch_size=job.record.batch_size,
            samples_per_second=r.samples_per_second if r else 0.0,
            idle_share=r.idle_share if r else 0.0,
            accelerator_limit=limit,
            cpu_percent=tree.cpu_percent if tree else 0.0,
            rss_bytes=tree.rss_bytes if tree else 0,
            last_report_age_seconds=self.core.report_age(job),
            directive=job.directive.to_pb(job.job_id),
            done=r.done if r else 0.0,
        )

    async def GetNodeStatus(
        self, request: pb.GetNodeStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.NodeStatus:
        return self._node_status()

    async def GetPolicy(
        self, request: pb.GetPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PolicyConfig:
        return self._policy_pb()

    def _policy_pb(self) -> pb.PolicyConfig:
        s = self.core.settings
        return pb.PolicyConfig(
            name=s.name,
            worker_budget=s.worker_budget,
            cpu_budget=s.cpu_budget,
            period_seconds=s.period_s,
            memory_budget=s.memory_budget,
        )

    async def SetPolicy(
        self, request: pb.SetPolicyRequest, context: grpc.aio.ServicerContext
    ) -> pb.PolicyConfig:
        c, s = request.config, self.core.settings
        self.core.set_policy(
            PolicySettings(
                c.name or s.name,
                c.worker_budget or s.worker_budget,
                c.cpu_budget or s.cpu_budget,
                c.period_seconds or s.period_s,
                c.memory_budget or s.memory_budget,
            )
        )
        return self._policy_pb()

    async def Explain(
        self, request: pb.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExplainResponse:
        job = self.core.get(request.job_id)
        d = job.decision
        budget, used = self.core.memory_budget()
        out = pb.ExplainResponse(
            job_id=job.job_id,
            policy=self.core.settings.name,
            worker_memory_bytes=job.state.worker_memory_bytes,
            memory_budget_bytes=budget,
            memory_used_bytes=used,
        )
        if d is None:
            out.reason = "no decision yet"
            return out
        out.MergeFrom(
            pb.ExplainResponse(
                reason=d.reason,
                accelerator_limit=d.accelerator_limit,
                memory_limited=d.memory_limited,
                candidates=[
                    pb.Candidate(
                        num_workers=c.num_workers,
                        cpus=self.core.settings.cpu_budget,
                        predicted_samples_per_second=c.predicted,
                        relative_std=c.relative_std,
                        normalized=c.normalized,
                        chosen=c.num_workers == d.num_workers,
                    )
                    for c in d.candidates
                ],
            )
        )
        return out


async def build_server(
    core: NodeCore, node_status: Callable[[], pb.NodeStatus], listen: ListenConfig
) -> Serving:
    """A started node server."""
    return await start_server(
        lambda server: pb_grpc.add_NodeServiceServicer_to_server(
            NodeServicer(core, node_status), server
        ),
        [pb.DESCRIPTOR.services_by_name["NodeService"].full_name],
        listen,
    )
