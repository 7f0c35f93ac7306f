"""The gRPC server both daemons run, with one set of conventions.

* one interceptor maps :class:`dloader.errors.RequestError` to its status code (its ``code``:
  INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED); anything
  else becomes INTERNAL with a logged traceback, and the daemon carries on;
* every call has a caller (:mod:`dloader._daemon.peer`): on the Unix socket, the connecting
  process's uid from the kernel (the daemon serves the socket itself and relays each connection
  to a gRPC server of its own on a private loopback port, the only server that knows the relay
  connections, and one that accepts no token); on TCP (``--listen``, a second gRPC server that
  knows only tokens), the role whose token the call carries as ``authorization: Bearer
  <token>`` (UNAUTHENTICATED without one), whatever its source address and port. TLS when a
  certificate and key are given. A local operator never needs a token, so ``--token`` with
  ``--listen`` does not lock them out;
* standard gRPC health checking and reflection;
* messages above ``MAX_MESSAGE_BYTES`` are refused (RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from dloader._daemon.paths import SocketClaim
from dloader._daemon.peer import CALLER, Caller, Role, UnixFront
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


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Finds each call's caller (or refuses it), and maps exceptions to status codes."""

    def __init__(
        self,
        tokens: dict[Role, str] | None = None,
        peers: dict[str, Caller] | None = None,
        *,
        certificates: bool = False,
    ) -> None:
        """Args:
        tokens: the bearer token of each role on TCP (a role without one cannot call on TCP).
        peers: the Unix front's relay connections by peer address, and their callers.
        certificates: TCP with mutual TLS: each caller is named by its verified client
            certificate, which alone makes it a client (a token still raises it to its role).
        """
        self._tokens = [(f"Bearer {t}".encode(), role) for role, t in (tokens or {}).items() if t]
        self._peers = peers if peers is not None else {}
        self._certificates = certificates

    def _caller(self, context: grpc.aio.ServicerContext) -> Caller | str:
        """The caller, or why it is refused (UNAUTHENTICATED)."""
        peer = context.peer()
        local = self._peers.get(peer)
        if local is not None:
            return local
        name = None
        if self._certificates:
            name = _certificate_name(context)
            if not name.ok:
                return name.why  # under mutual TLS every TCP caller is someone, token or not
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        raw = given.encode() if isinstance(given, str) else bytes(given)
        who = name.name if name is not None else None
        for expected, role in self._tokens:
            if secrets.compare_digest(raw, expected):
                return Caller(role, certificate=who)
        if who is not None:
            return Caller(Role.CLIENT, certificate=who)
        return _UNAUTHENTICATED

    @contextlib.asynccontextmanager
    async def _serving(self, context: grpc.aio.ServicerContext, method: str) -> AsyncIterator[None]:
        """One call: its caller (UNAUTHENTICATED without one), then errors mapped to codes."""
        caller = self._caller(context)
        if isinstance(caller, str):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, caller)
            raise AssertionError("abort returns by raising")  # for the type checker
        token = CALLER.set(caller)
        try:
            yield
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)
        finally:
            # a stream dropped while suspended is closed by asyncio's async-generator finalizer,
            # in another task's Context, where the token cannot be reset (and where the caller
            # was never set): nothing to undo there
            with contextlib.suppress(ValueError):
                CALLER.reset(token)

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
                async with self._serving(context, method):
                    return await inner(request, context)

            return call

        def streaming(
            inner: Callable[..., AsyncIterator[Any]],
        ) -> Callable[..., AsyncIterator[Any]]:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async with self._serving(context, method):
                    async for item in inner(request, context):
                        yield item

            return call

        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(guarded(handler.unary_unary), *serde)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(guarded(handler.stream_unary), *serde)
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
    """The operator's bearer token on TCP."""
    node_token: str | None = None
    """The bearer token of nodes (sidecars) on TCP (allocator)."""
    client_token: str | None = None
    """The bearer token of clients (jobs, schedulers) on TCP (allocator)."""
    tls_cert: str | None = None
    """PEM certificate for TCP (with ``tls_key``): TLS instead of plain TCP."""
    tls_key: str | None = None
    tls_client_ca: str | None = None
    """PEM CA whose certificates name TCP clients (mutual TLS; needs ``tls_cert``)."""

    def __post_init__(self) -> None:
        if self.socket is None and self.tcp is None:
            raise ConfigError("listen on a Unix socket (--socket) or TCP (--listen)")
        if self.socket is not None and not self.socket.strip():
            raise ConfigError("--socket '': expected a path for the Unix socket")
        if self.tcp is not None and not self.token:
            raise ConfigError(f"--listen {self.tcp}: TCP needs --token")
        tokens = {
            "--token": self.token,
            "--node-token": self.node_token,
            "--client-token": self.client_token,
        }
        given = [(flag, t) for flag, t in tokens.items() if t]
        for i, (flag, token) in enumerate(given):
            for other, theirs in given[i + 1 :]:
                if token == theirs:
                    raise ConfigError(
                        f"{flag} and {other} are the same token: each role needs its own "
                        "(else a client would hold the operator's or a node's rights)"
                    )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError(
                "--tls-client-ca needs --tls-cert and --tls-key (client certificates are "
                "checked in a TLS handshake)"
            )
        if self.tcp is not None:
            host, sep, port = self.tcp.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ConfigError(
                    f"--listen {self.tcp!r}: expected HOST:PORT with a port in 0..65535 "
                    "(0: any free port, logged at start)"
                )


#: Characters of a certificate's common name at most (X.509's own bound is 64).
MAX_CERTIFICATE_NAME = 64


@dataclass(frozen=True)
class _Named:
    """A client certificate's identity: its name, or why it names no one."""

    name: str = ""
    why: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.name)


def _certificate_name(context: grpc.aio.ServicerContext) -> _Named:
    """The verified client certificate's identity: its subject's one common name (SECURITY.md,
    "Identity"). A certificate with no common name (a subject alternative name alone does not
    count), with several, or with one that is empty, longer than :data:`MAX_CERTIFICATE_NAME`
    or not printable names no one: its caller is refused, whatever token it brings (a name cut
    short or taken from elsewhere could be another user's)."""
    auth = context.auth_context() or {}
    texts = {
        key: [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values]
        for key, values in auth.items()
    }
    # gRPC reports one common name even where the subject has several: count them in the
    # subject itself (RFC 2253 text) where it is given
    subjects = texts.get("x509_subject", [])
    names = (
        [v for s in subjects for t, v in _rdn_attributes(s) if t.upper() in ("CN", "2.5.4.3")]
        if subjects
        else texts.get("x509_common_name", [])
    )
    if len(names) != 1:
        what = "no common name" if not names else f"{len(names)} common names"
        return _Named(
            why=f"the client certificate has {what}: under mutual TLS each client is named by "
            "exactly one subject common name (a subject alternative name does not name it)"
        )
    name = names[0]
    if not name or len(name) > MAX_CERTIFICATE_NAME or not name.isprintable():
        return _Named(
            why=f"the client certificate's common name {name[:80]!r} must be 1-"
            f"{MAX_CERTIFICATE_NAME} printable characters"
        )
    return _Named(name=name)


def _rdn_attributes(subject: str) -> list[tuple[str, str]]:
    """``(type, value)`` of each attribute of an RFC 2253 subject (``CN=a,O=b+OU=c``),
    separators escaped with a backslash kept in their value."""
    out, part, escaped = [], [], False
    for ch in subject + ",":
        if escaped:
            part.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",+":
            kind, _, value = "".join(part).partition("=")
            out.append((kind.strip(), value))
            part = []
        else:
            part.append(ch)
    return out


def _server_credentials(cert: str, key: str, client_ca: str | None) -> grpc.ServerCredentials:
    """TLS with the daemon's certificate; with ``client_ca``, mutual TLS: every client shows a
    certificate that CA signed, or the handshake fails."""
    try:
        with open(cert, "rb") as c, open(key, "rb") as k:
            pair = (k.read(), c.read())
        if client_ca is None:
            return grpc.ssl_server_credentials([pair])
        with open(client_ca, "rb") as ca:
            roots = ca.read()
    except OSError as exc:
        raise ConfigError(
            f"--tls-cert {cert!r} / --tls-key {key!r} / --tls-client-ca {client_ca!r}: {exc}"
        ) from None
    return grpc.ssl_server_credentials([pair], root_certificates=roots, require_client_auth=True)


@dataclass
class Serving:
    """The started servers, the addresses they listen on, and the claim on the Unix socket."""

    servers: list[grpc.aio.Server]
    """The relay server (behind the Unix socket), then the TCP server, as configured."""
    addresses: list[str]
    claim: SocketClaim | None
    front: UnixFront | None = None

    async def stop(self) -> None:
        """Stops serving (in-flight calls get ``GRACE_S``) and gives the socket up."""
        try:
            if self.front is not None:
                await self.front.stop()
            for server in self.servers:
                await server.stop(grace=GRACE_S)
        finally:
            if self.claim is not None:
                self.claim.release()


async def _server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    interceptor: ErrorInterceptor,
) -> grpc.aio.Server:
    """A server with the servicers, health checking, reflection and the message size cap."""
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 4 * MAX_MESSAGE_BYTES),
        ],
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
    return server


async def start_server(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    listen: ListenConfig,
) -> Serving:
    """Started servers with dloader's conventions.

    ``register`` adds the servicers (it is called once per server; servicers keep their state
    in the core they share). Each server gets the error interceptor, the message size cap,
    health checking (``SERVING`` for each of ``service_names``) and reflection.

    * The Unix socket (mode 0660, claimed first: :class:`~dloader._daemon.paths.SocketClaim`)
      is served by :class:`UnixFront`, which relays each connection to a server on a private
      loopback port. That server knows each relay connection's caller by its source address
      and accepts no token: a connection that did not come through the front is refused.
      A second connection with a live relay connection's source address cannot exist on that
      port (TCP allows one connection per address pair), and a relay's entry is gone before
      its connection closes.
    * TCP (``listen.tcp``, TLS if configured) is served by another server, which knows only
      the tokens, never the relay connections: a caller's source port proves nothing there.
    """
    peers: dict[str, Caller] = {}
    tokens = {Role.OPERATOR: listen.token, Role.NODE: listen.node_token}
    tokens[Role.CLIENT] = listen.client_token
    servers: list[grpc.aio.Server] = []
    addresses = []
    claim = SocketClaim(listen.socket) if listen.socket else None
    front = None
    try:
        if claim is not None:
            relay = await _server(register, service_names, ErrorInterceptor(peers=peers))
            servers.append(relay)
            private = relay.add_insecure_port("127.0.0.1:0")
            front = UnixFront(claim.path, private, peers)
            addresses.append(f"unix://{claim.path}")
        if listen.tcp:
            tcp = await _server(
                register,
                service_names,
                ErrorInterceptor(
                    {r: t for r, t in tokens.items() if t},
                    certificates=bool(listen.tls_client_ca),
                ),
            )
            servers.append(tcp)
            try:
                if listen.tls_cert:
                    creds = _server_credentials(
                        listen.tls_cert, listen.tls_key or "", listen.tls_client_ca
                    )
                    port = tcp.add_secure_port(listen.tcp, creds)
                else:
                    port = tcp.add_insecure_port(listen.tcp)
            except RuntimeError:  # grpc's "Failed to bind"
                port = 0
            if port == 0:
                raise ConfigError(f"--listen {listen.tcp!r}: cannot bind (address in use?)")
            addresses.append(f"{listen.tcp.rpartition(':')[0]}:{port}")
        for server in servers:
            await server.start()
        if front is not None:
            await front.start()
    except BaseException:
        for server in servers:
            await server.stop(None)
        if claim is not None:
            claim.release()
        raise
    return Serving(servers, addresses, claim, front)
