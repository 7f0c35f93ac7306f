"""The gRPC server both daemons run, with one set of conventions.

* one interceptor maps :class:`dloader.errors.RequestError` to its status code (its ``code``:
  INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED); anything
  else becomes INTERNAL with a logged traceback, and the daemon carries on;
* a call that arrives over TCP must carry ``authorization: Bearer <token>`` (UNAUTHENTICATED
  otherwise); TLS when a certificate and key are given. A call on the Unix socket needs no
  token: the socket's file mode and folder guard it, so ``--token`` with ``--listen`` never
  locks a local operator out;
* standard gRPC health checking and reflection;
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

from dloader._daemon.paths import SocketClaim
from dloader.errors import MAX_MESSAGE_CHARS, ConfigError, RequestError

__all__ = ["MAX_MESSAGE_BYTES", "ErrorInterceptor", "ListenConfig", "Serving", "start_server"]

#: Seconds in-flight calls get to finish when a daemon stops.
GRACE_S = 2.0

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 20  # reports are ~1 KB; anything near this is not a report
_UNAUTHENTICATED = "missing or wrong 'authorization: Bearer <token>' metadata"


async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, RequestError):
        await context.abort(grpc.StatusCode[exc.code], str(exc)[: MAX_MESSAGE_CHARS + 100])
    log.exception("internal error in %s", method)
    await context.abort(
        grpc.StatusCode.INTERNAL,
        f"internal error in {method}: {type(exc).__name__} (see the daemon's log)",
    )


def _over_tcp(context: grpc.aio.ServicerContext) -> bool:
    return context.peer().startswith(("ipv4:", "ipv6:"))


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions from the servicer to status codes; checks the bearer token on TCP."""

    def __init__(self, token: str | None = None) -> None:
        self._expected = f"Bearer {token}".encode() if token else None

    def _authorised(self, context: grpc.aio.ServicerContext) -> bool:
        if self._expected is None or not _over_tcp(context):
            return True
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        raw = given.encode() if isinstance(given, str) else bytes(given)
        return secrets.compare_digest(raw, self._expected)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        serde = (handler.request_deserializer, handler.response_serializer)

        def guarded(inner: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if not self._authorised(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED)
                try:
                    return await inner(request, context)
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort_for(exc, context, method)

            return call

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(guarded(handler.unary_unary), *serde)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(guarded(handler.stream_unary), *serde)

        def streaming(
            inner: Callable[..., AsyncIterator[Any]],
        ) -> Callable[..., AsyncIterator[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                if not self._authorised(context):
                    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED)
                try:
                    async for item in inner(request, context):
                        yield item
                except grpc.aio.AbortError:
                    raise
                except Exception as exc:
                    await _abort_for(exc, context, method)

            return call

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), *serde)
        # stream-stream: gRPC reflection
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), *serde)


@dataclass(frozen=True)
class ListenConfig:
    """Where a daemon listens."""

    socket: str | None = None
    """Unix socket path (the default transport)."""
    tcp: str | None = None
    """``host:port``: needs ``token``."""
    token: str | None = None
    """Bearer token every TCP call must carry."""
    tls_cert: str | None = None
    """PEM certificate for TCP (with ``tls_key``): TLS instead of plain TCP."""
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if self.socket is None and self.tcp is None:
            raise ConfigError("listen on a Unix socket (--socket) or TCP (--listen)")
        if self.tcp is not None and not self.token:
            raise ConfigError(f"--listen {self.tcp}: TCP needs --token")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tcp is not None:
            host, sep, port = self.tcp.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ConfigError(
                    f"--listen {self.tcp!r}: expected HOST:PORT with a port in 0..65535 "
                    "(0: any free port, logged at start)"
                )


def _server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    try:
        with open(cert, "rb") as c, open(key, "rb") as k:
            return grpc.ssl_server_credentials([(k.read(), c.read())])
    except OSError as exc:
        raise ConfigError(f"--tls-cert {cert!r} / --tls-key {key!r}: {exc}") from None


@dataclass
class Serving:
    """A started server, the addresses it listens on, and its claim on the Unix socket."""

    server: grpc.aio.Server
    addresses: list[str]
    claim: SocketClaim | None

    async def stop(self) -> None:
        """Stops serving (in-flight calls get ``GRACE_S``) and gives the socket up."""
        try:
            await self.server.stop(grace=GRACE_S)
        finally:
            if self.claim is not None:
                self.claim.release()


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    listen: ListenConfig,
) -> Serving:
    """A started server with dloader's conventions.

    ``register`` adds the servicers; the server gets the error interceptor (and the token check
    on TCP), the message size cap, health checking (``SERVING`` for each of ``service_names``)
    and reflection; it listens on the Unix socket (mode 0660, claimed first: see
    :class:`~dloader._daemon.paths.SocketClaim`) and/or TCP (TLS if configured).
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
    claim = SocketClaim(listen.socket) if listen.socket else None
    try:
        if claim is not None:
            server.add_insecure_port(f"unix://{claim.path}")
            addresses.append(f"unix://{claim.path}")
        if listen.tcp:
            try:
                if listen.tls_cert:
                    creds = _server_credentials(listen.tls_cert, listen.tls_key or "")
                    port = server.add_secure_port(listen.tcp, creds)
                else:
                    port = server.add_insecure_port(listen.tcp)
            except RuntimeError:  # grpc's "Failed to bind"
                port = 0
            if port == 0:
                raise ConfigError(f"--listen {listen.tcp!r}: cannot bind (address in use?)")
            addresses.append(f"{listen.tcp.rpartition(':')[0]}:{port}")
        await server.start()
        if claim is not None:
            os.chmod(claim.path, 0o660)
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    return Serving(server, addresses, claim)
