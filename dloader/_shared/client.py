"""How every dloader client reaches a daemon: targets, credentials, channels, backoff.

Used by the loader's agent helper, ``dloaderctl``, the sidecar's allocator link and
``dloader-launch`` alike, so that each accepts the same targets and speaks TLS the same way:

* a target is ``unix:///path.sock`` (or a bare absolute path) or ``host:port``;
* a Unix socket is plain gRPC (the socket's file mode and the peer check guard it);
* TCP uses TLS when a CA file is given (``tls_ca``, else ``DLOADER_TLS_CA``), and sends the
  bearer token as ``authorization`` metadata when one is given.

gRPC is imported when a channel is made, not at import, so that the training process (which
must not hold gRPC state across ``fork()``) can import this module.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dloader._shared import env
from dloader.errors import ConfigError

if TYPE_CHECKING:
    import grpc
    import grpc.aio

__all__ = ["Backoff", "Endpoint", "parse_target", "serving_status"]

#: Reconnection delays of every client: doubling from the first to the last, with jitter.
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0


def parse_target(target: str) -> str:
    """A gRPC target from ``unix:///path``, ``unix:/path``, a bare socket path or ``host:port``.

    Raises:
        ConfigError: an empty or malformed target (a ``ValueError``).
    """
    t = target.strip()
    if not t:
        raise ConfigError("target is empty; expected unix:///path/to.sock or host:port")
    if t.startswith("unix:"):
        path = t[len("unix:") :].lstrip("/")
        if not path:
            raise ConfigError(f"target {target!r} has no socket path")
        return f"unix:///{path}"
    if t.startswith("/"):
        return f"unix://{t}"
    host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"target {target!r} is neither unix:///path nor host:port with a port in 1..65535"
        )
    return t


@dataclass(frozen=True)
class Endpoint:
    """A daemon as a client sees it: where, with which token, trusting which CA."""

    target: str
    """``unix:///path`` or ``host:port`` (normalised by :func:`parse_target`)."""
    token: str | None = None
    """Bearer token (sent on every call when set)."""
    tls_ca: str | None = None
    """PEM file of the CA that signed the daemon's certificate: TLS on TCP."""
    tls_client: tuple[str, str] | None = None
    """This client's certificate and key (PEM files) for mutual TLS."""

    @classmethod
    def of(
        cls,
        target: str,
        token: str | None = None,
        tls_ca: str | None = None,
        tls_client: tuple[str, str] | None = None,
    ) -> Endpoint:
        """An endpoint with a checked target; ``tls_ca`` defaults to ``DLOADER_TLS_CA`` and
        ``tls_client`` to ``DLOADER_TLS_CERT``/``DLOADER_TLS_KEY``."""
        return cls(
            parse_target(target),
            token or None,
            tls_ca or env.tls_ca(),
            tls_client or env.tls_client_cert(),
        )

    @property
    def is_unix(self) -> bool:
        """Whether the target is a Unix socket."""
        return self.target.startswith("unix:")

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata: the bearer token, if any."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def _credentials(self) -> Any:
        import grpc

        if self.is_unix or not self.tls_ca:
            return None
        try:
            with open(self.tls_ca, "rb") as f:
                roots = f.read()
        except OSError as exc:
            raise ConfigError(f"TLS CA file {self.tls_ca!r} cannot be read: {exc}") from None
        if self.tls_client is None:
            return grpc.ssl_channel_credentials(root_certificates=roots)
        cert, key = self.tls_client
        try:
            with open(cert, "rb") as c, open(key, "rb") as k:
                chain, private = c.read(), k.read()
        except OSError as exc:
            raise ConfigError(
                f"TLS client certificate {cert!r} / key {key!r} cannot be read: {exc}"
            ) from None
        return grpc.ssl_channel_credentials(roots, private, chain)

    def channel(self, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel (TLS on TCP when a CA is set)."""
        import grpc

        creds = self._credentials()
        if creds is None:
            return grpc.insecure_channel(self.target, options=list(options))
        return grpc.secure_channel(self.target, creds, options=list(options))

    def aio_channel(self, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """An asyncio channel (TLS on TCP when a CA is set)."""
        import grpc.aio

        creds = self._credentials()
        if creds is None:
            return grpc.aio.insecure_channel(self.target, options=list(options))
        return grpc.aio.secure_channel(self.target, creds, options=list(options))


class Backoff:
    """Exponential reconnection delays with jitter: ``next()`` after a failure, ``reset()``
    after a success. Every client reconnects on the same schedule."""

    def __init__(self, low: float = BACKOFF_MIN_S, high: float = BACKOFF_MAX_S) -> None:
        if not 0 < low <= high:
            raise ValueError(f"backoff low={low} and high={high}: need 0 < low <= high")
        self.low, self.high = low, high
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try (jittered by up to 10%)."""
        delay = min(self.low * 2**self.failures, self.high)
        self.failures += 1
        return delay * (1 + 0.1 * random.random())

    def reset(self) -> None:
        """A success: the next failure waits the shortest delay again."""
        self.failures = 0


def serving_status(endpoint: Endpoint, timeout: float) -> str:
    """The gRPC health status (``SERVING``, ``NOT_SERVING``, ...) of the daemon at
    ``endpoint``; raises ``grpc.RpcError`` when it does not answer."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with endpoint.channel() as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""),
            timeout=timeout,
            metadata=endpoint.metadata,
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
