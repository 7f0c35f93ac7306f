"""The gRPC face of the sidecar: a thin servicer over :class:`sidecar.core.NodeCore`.

* one interceptor maps domain errors to status codes (``InvalidArgument`` -> INVALID_ARGUMENT,
  ``NotFound`` -> NOT_FOUND, ``PermissionDenied`` -> PERMISSION_DENIED); anything else becomes
  INTERNAL with a logged traceback, and the daemon carries on;
* over TCP every call must carry ``authorization: Bearer <token>`` (UNAUTHENTICATED otherwise);
* standard gRPC health checking and reflection are enabled;
* messages above ``MAX_MESSAGE_BYTES`` are refused (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dloader.sidecar.core import Directive, Job, NodeCore, PolicySettings
from dloader.sidecar.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    SidecarError,
)
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

__all__ = [
    "MAX_MESSAGE_BYTES",
    "ErrorInterceptor",
    "ListenConfig",
    "NodeServicer",
    "build_server",
    "start_server",
]

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20  # reports are ~1 KB; anything near this is not a report

_CODES = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
}


async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, SidecarError):
        await context.abort(_CODES.get(type(exc), grpc.StatusCode.INVALID_ARGUMENT), str(exc))
    log.exception("internal error in %s", method)
    await context.abort(
        grpc.StatusCode.INTERNAL,
        f"internal error in {method}: {type(exc).__name__} (see the sidecar log)",
    )


def _guarded(inner: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    """A unary-response behaviour (request or request stream in) with errors mapped."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return call


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions from the servicer to status codes; optionally checks a bearer token."""

    def __init__(self, token: str | None = None) -> None:
        self._token = token

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        token = self._token
        if token is not None:
            meta = dict(details.invocation_metadata or ())
            given = meta.get("authorization", "")
            if not secrets.compare_digest(given, f"Bearer {token}"):
                return _reject(handler)

        serde = (handler.request_deserializer, handler.response_serializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _guarded(handler.unary_unary, method), *serde
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _guarded(handler.stream_unary, method), *serde
            )
        if handler.unary_stream:
            inner_us = handler.unary_stream

            async def us(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                try:
                    async for item in inner_us(request, context):
                        yield item
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort_for(exc, context, method)

            return grpc.unary_stream_rpc_method_handler(us, *serde)
        return handler


def _reject(handler: Any) -> Any:
    async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong 'authorization: Bearer <token>' metadata",
        )

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong 'authorization: Bearer <token>' metadata",
        )
        yield None  # pragma: no cover

    kw = dict(
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)


def directive_pb(job_id: str, d: Directive) -> pb.Directive:
    """A core directive as a message."""
    return pb.Directive(
        job_id=job_id,
        num_workers=d.num_workers,
        batch_size=d.batch_size,
        cpus=list(d.cpus),
        reason=d.reason,
        revision=d.revision,
    )


def _limits(msg: pb.JobLimits) -> dict[str, Any]:
    return {
        "min_workers": msg.min_workers,
        "max_workers": msg.max_workers,
        "min_batch_size": msg.min_batch_size,
        "max_batch_size": msg.max_batch_size,
        "may_change_batch_size": msg.may_change_batch_size,
    }


def _report_body(r: pb.JobReport) -> dict[str, Any]:
    return {
        "timestamp": r.timestamp,
        "num_workers": r.num_workers,
        "batch_size": r.batch_size,
        "samples_per_second": r.samples_per_second,
        "idle_share": r.idle_share,
        "step_seconds": r.step_seconds,
        "wait_seconds": r.wait_seconds,
        "window_seconds": r.window_seconds,
        "samples": r.samples,
        "workers": [
            {
                "pid": w.pid,
                "fetch_seconds": w.fetch_seconds,
                "cpu_seconds": w.cpu_seconds,
                "batches": w.batches,
            }
            for w in r.workers
        ],
    }


class NodeServicer(pb_grpc.NodeServiceServicer):
    """Translates messages to and from :class:`NodeCore` calls."""

    def __init__(self, core: NodeCore, node_status: Callable[[], pb.NodeStatus]) -> None:
        self.core = core
        self._node_status = node_status

    async def RegisterJob(
        self, request: pb.RegisterJobRequest, context: Any
    ) -> pb.RegisterJobResponse:
        job = self.core.register(
            name=request.name,
            limits=_limits(request.limits),
            pids=list(request.pids),
            gpus=list(request.gpus),
            num_workers=request.num_workers,
            batch_size=request.batch_size,
        )
        return pb.RegisterJobResponse(
            job_id=job.job_id,
            token=job.record.token,
            directive=directive_pb(job.job_id, job.directive),
        )

    async def Report(
        self, request_iterator: AsyncIterator[pb.JobReport], context: Any
    ) -> pb.ReportSummary:
        job: Job | None = None
        accepted = 0
        async for report in request_iterator:
            if job is None:
                job = self.core.authenticate(report.job_id, report.token)
            elif report.job_id != job.job_id:
                raise PermissionDenied(
                    "job_id",
                    f"a report for job {report.job_id!r} on the "
                    f"stream of job {job.job_id!r} is refused",
                )
            if job.job_id not in self.core.jobs:
                raise NotFound("job_id", f"job {job.job_id!r} has ended")
            self.core.report(job, _report_body(report))
            accepted += 1
        return pb.ReportSummary(accepted=accepted)

    async def WatchDirectives(
        self, request: pb.WatchDirectivesRequest, context: Any
    ) -> AsyncIterator[pb.Directive]:
        job = self.core.authenticate(request.job_id, request.token)
        async for d in self.core.watch(job):
            yield directive_pb(job.job_id, d)

    async def DeregisterJob(
        self, request: pb.DeregisterJobRequest, context: Any
    ) -> pb.DeregisterJobResponse:
        self.core.deregister(request.job_id, request.token)
        return pb.DeregisterJobResponse()

    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        return pb.ListJobsResponse(jobs=[self.job_status(j) for j in self.core.jobs.values()])

    def job_status(self, job: Job) -> pb.JobStatus:
        """A job as a status message."""
        r = job.last_report or {}
        limit = (
            job.model.accelerator_limit(job.record.batch_size) if job.model.observations else 0.0
        )
        tree = job.tree
        return pb.JobStatus(
            job_id=job.job_id,
            name=job.record.name,
            limits=pb.JobLimits(**{k: v for k, v in job.record.limits.items()}),
            pids=job.record.pids,
            num_workers=job.record.num_workers,
            batch_size=job.record.batch_size,
            samples_per_second=r.get("samples_per_second", 0.0),
            idle_share=r.get("idle_share", 0.0),
            accelerator_limit=limit,
            cpu_percent=tree.cpu_percent if tree else 0.0,
            rss_bytes=tree.rss_bytes if tree else 0,
            last_report_age_seconds=self.core.report_age(job),
            directive=directive_pb(job.job_id, job.directive),
        )

    async def GetNodeStatus(self, request: pb.GetNodeStatusRequest, context: Any) -> pb.NodeStatus:
        return self._node_status()

    async def GetPolicy(self, request: pb.GetPolicyRequest, context: Any) -> pb.PolicyConfig:
        return self._policy_pb()

    def _policy_pb(self) -> pb.PolicyConfig:
        s = self.core.settings
        return pb.PolicyConfig(
            name=s.name,
            worker_budget=s.worker_budget,
            cpu_budget=s.cpu_budget,
            period_seconds=s.period_s,
        )

    async def SetPolicy(self, request: pb.SetPolicyRequest, context: Any) -> pb.PolicyConfig:
        c, s = request.config, self.core.settings
        self.core.set_policy(
            PolicySettings(
                c.name or s.name,
                c.worker_budget or s.worker_budget,
                c.cpu_budget or s.cpu_budget,
                c.period_seconds or s.period_s,
            )
        )
        return self._policy_pb()

    async def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.ExplainResponse:
        job = self.core.get(request.job_id)
        d = job.decision
        if d is None:
            return pb.ExplainResponse(
                job_id=job.job_id, policy=self.core.settings.name, reason="no decision yet"
            )
        return pb.ExplainResponse(
            job_id=job.job_id,
            policy=self.core.settings.name,
            reason=d.reason,
            accelerator_limit=d.accelerator_limit,
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


@dataclass(frozen=True)
class ListenConfig:
    """Where the server listens."""

    socket: str | None = None
    """Unix socket path (the default transport)."""
    tcp: str | None = None
    """``host:port``: needs ``token``."""
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_args(cls, args: Any) -> ListenConfig:
        """From a daemon's ``--socket``, ``--listen``, ``--token``, ``--tls-cert/--tls-key``."""
        return cls(args.socket, args.listen, args.token, args.tls_cert, args.tls_key)

    def __post_init__(self) -> None:
        if self.socket is None and self.tcp is None:
            raise ValueError("listen on a Unix socket (--socket) or TCP (--listen)")
        if self.tcp is not None and not self.token:
            raise ValueError(f"--listen {self.tcp}: TCP needs --token (or DLOADER_SIDECAR_TOKEN)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    listen: ListenConfig,
) -> tuple[grpc.aio.Server, list[str]]:
    """A started server with dloader's conventions, and the addresses it listens on.

    ``register`` adds the servicers; the server gets the error interceptor (and the token check
    on TCP), the message size cap, health checking (``SERVING`` for each of ``service_names``)
    and reflection; it listens on the Unix socket (mode 0660) and/or TCP (TLS if configured).
    """
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
    ]
    server = grpc.aio.server(
        interceptors=[ErrorInterceptor(listen.token if listen.tcp else None)], options=options
    )
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in service_names:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (
            *service_names,
            reflection.SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        ),
        server,
    )
    addresses = []
    if listen.socket:
        path = os.path.abspath(listen.socket)
        if os.path.exists(path):
            os.unlink(path)  # a stale socket from a killed daemon
        os.makedirs(os.path.dirname(path), exist_ok=True)
        server.add_insecure_port(f"unix://{path}")
        addresses.append(f"unix://{path}")
    if listen.tcp:
        if listen.tls_cert:
            with open(listen.tls_cert, "rb") as c, open(listen.tls_key or "", "rb") as k:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
            server.add_secure_port(listen.tcp, creds)
        else:
            server.add_insecure_port(listen.tcp)
        addresses.append(listen.tcp)
    await server.start()
    if listen.socket:
        os.chmod(os.path.abspath(listen.socket), 0o660)
    return server, addresses


async def build_server(
    core: NodeCore, node_status: Callable[[], pb.NodeStatus], listen: ListenConfig
) -> tuple[grpc.aio.Server, list[str]]:
    """A started node server and the addresses it listens on."""
    return await start_server(
        lambda server: pb_grpc.add_NodeServiceServicer_to_server(
            NodeServicer(core, node_status), server
        ),
        [pb.DESCRIPTOR.services_by_name["NodeService"].full_name],
        listen,
    )
