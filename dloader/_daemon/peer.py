"""Who is calling: the Unix socket's peer credentials, and the caller's role.

gRPC does not tell a Python server who is on the other end of a Unix socket (its peer string
is just ``unix:``). So the daemon serves its Unix socket itself: :class:`UnixFront` accepts
each connection, reads the kernel's ``SO_PEERCRED`` (pid, uid, gid of the connecting process),
and relays the bytes to the gRPC server on a private loopback port. The relay's own address
on that port names the connection; the interceptor looks it up and knows the caller's uid.
A connection to the private port that did not come through the front is an ordinary TCP
caller: it needs a token like any other.

A caller is one of three roles (:class:`Role`), checked by the cores:

* ``operator``: on the Unix socket, the daemon's own user or root; on TCP, the ``--token``;
* ``node``: on TCP, the allocator's ``--node-token`` (sidecars register nodes and report);
* ``client``: any other local user, or a TCP caller with ``--client-token`` (submit jobs,
  act on the jobs whose token they hold, read).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import math
import os
import secrets
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dloader.errors import PermissionDenied

__all__ = [
    "CALLER",
    "Caller",
    "Role",
    "Shares",
    "UnixFront",
    "current_caller",
    "require",
    "same_token",
]

log = logging.getLogger(__name__)

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_CONNECTIONS = 1024  # open connections on the Unix socket, all clients together
OPERATOR_CONNECTIONS = 64  # of those, kept for operators (the daemon's user and root)
MAX_CONNECTIONS_PER_USER = 256  # open connections of one local user who is not an operator
_CHUNK = 1 << 16


class Role(enum.IntEnum):
    """What a caller may do (higher includes lower)."""

    CLIENT = 1
    NODE = 2
    OPERATOR = 3


@dataclass(frozen=True)
class Caller:
    """The caller of the current RPC."""

    role: Role
    uid: int | None = None
    """Its uid (callers on the Unix socket; None on TCP)."""
    pid: int | None = None
    """The connecting process (callers on the Unix socket)."""
    certificate: str | None = None
    """On TCP with client certificates (mutual TLS): the verified certificate's subject
    (its common name), which names the caller as the uid does on the Unix socket."""

    @property
    def local(self) -> bool:
        """Whether it came through the Unix socket."""
        return self.uid is not None

    def at_least(self, role: Role) -> bool:
        """Whether it may act as ``role``."""
        return self.role >= role

    @property
    def identified(self) -> bool:
        """Whether it is known as one user: by uid (the Unix socket) or by its certificate
        (mutual TLS); a TCP caller known only by a shared token is not."""
        return self.local or self.certificate is not None

    @property
    def owner(self) -> str:
        """Who it counts as for per-caller caps and ownership: "" for an operator (capped by
        nothing but the totals), ``uid N`` on the Unix socket, ``cert NAME`` with a client
        certificate, else the role's token on TCP."""
        if self.at_least(Role.OPERATOR):
            return ""
        if self.local:
            return f"uid {self.uid}"
        if self.certificate is not None:
            return f"cert {self.certificate}"
        return f"{self.role.name.lower()} token"

    def __str__(self) -> str:
        if self.local:
            who = f"uid {self.uid}, pid {self.pid}"
        elif self.certificate is not None:
            who = f"certificate {self.certificate!r}"
        else:
            who = "a TCP caller"
        return f"{who} ({self.role.name.lower()})"


#: The caller of the RPC being served (set by the daemons' interceptor).
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("dloader_caller")


def current_caller() -> Caller:
    """The caller of the RPC being served; an operator when code runs outside an RPC (tests
    and the daemons' own loops call the cores directly)."""
    return CALLER.get(Caller(Role.OPERATOR))


def require(role: Role, action: str) -> Caller:
    """The current caller if it may act as ``role``; else PERMISSION_DENIED naming both."""
    caller = current_caller()
    if not caller.at_least(role):
        raise PermissionDenied(
            "caller", f"{action} needs the {role.name.lower()} role; the caller is {caller}"
        )
    return caller


@dataclass(frozen=True)
class Shares:
    """Places (jobs, connections) shared by callers: ``most`` in all; callers other than
    operators hold at most ``most - reserve`` together (the rest is kept for operators, who
    always have a way in) and at most ``per_owner`` each. One rule for every table and pool
    that a user could otherwise fill for the others."""

    most: int
    reserve: int
    per_owner: int

    def refusal(self, held: Mapping[Any, int], owner: Hashable) -> tuple[str, int] | None:
        """Why one more place for ``owner`` (None: an operator) is refused: ``("all", places
        held)``, ``("users", places callers other than operators hold)`` or ``("owner", the
        owner's places)``; None when it fits. ``held``: places by owner, operators' under None."""
        total = sum(held.values())
        if total >= self.most:
            return "all", total
        if owner is None:
            return None
        users = total - held.get(None, 0)
        if users >= self.most - self.reserve:
            return "users", users
        mine = held.get(owner, 0)
        if mine >= self.per_owner:
            return "owner", mine
        return None


def same_token(expected: str, given: str) -> bool:
    """Whether ``given`` is the credential ``expected`` (constant time; any text, ASCII or not;
    an empty ``expected`` matches nothing)."""
    return bool(expected) and secrets.compare_digest(expected.encode(), given.encode())


def local_role(uid: int) -> Role:
    """A local caller's role: the daemon's own user and root operate it."""
    return Role.OPERATOR if uid in (0, os.geteuid()) else Role.CLIENT


CONNECTIONS = Shares(MAX_CONNECTIONS, OPERATOR_CONNECTIONS, MAX_CONNECTIONS_PER_USER)


class RefusalLog:
    """Refused connections, logged at most once per ``every_s`` per uid: the first as it
    happens, then how many more there were (40,000 refused connects once wrote 40,000 warning
    lines, 6.3 MB, and the logging starved other users' connections)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: dict[int, float] = {}
        self._held: Counter[int] = Counter()

    def note(self, uid: int, why: str) -> bool:
        """Records a refusal of ``uid``'s connection; True if it was logged now."""
        now = self._clock()
        if now - self._last.get(uid, -math.inf) < self.every_s:
            self._held[uid] += 1
            return False
        more = self._held.pop(uid, 0)
        self._last[uid] = now
        if len(self._last) > 4096:  # bounded: forget the oldest uids
            for old in sorted(self._last, key=self._last.__getitem__)[:2048]:
                del self._last[old]
                self._held.pop(old, None)
        log.warning(
            "refused a connection from uid %d: %s%s",
            uid,
            why,
            f" ({more} more refused since the last such line)" if more else "",
        )
        return True


class UnixFront:
    """Serves the Unix socket at ``path`` and relays each connection to ``127.0.0.1:port``,
    remembering the connecting process's credentials by the relay's address."""

    def __init__(self, path: Path, port: int, peers: dict[str, Caller]) -> None:
        self.path = path
        self.port = port
        self.peers = peers
        """``ipv4:127.0.0.1:PORT`` of a relay connection -> the caller behind it."""
        self._server: asyncio.AbstractServer | None = None
        self._open: Counter[int | None] = Counter()
        """Open connections per uid, operators' under None (counted from accept, before the
        relay connects)."""
        self._refusals = RefusalLog()
        #: The relay tasks running: asyncio's stream server drops its own reference to a
        #: connection's task when the client goes away, and a task nobody holds is collected
        #: while pending ("Task was destroyed but it is pending!", 42 lines a minute of soak)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listens on the socket (mode 0660)."""
        self._server = await asyncio.start_unix_server(
            self._relay, path=str(self.path), backlog=_backlog()
        )
        os.chmod(self.path, 0o660)

    async def stop(self) -> None:
        """Stops accepting and closes every relay."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        sock: socket.socket = writer.get_extra_info("socket")
        try:
            pid, uid, _gid = _CREDS.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
            )
        except OSError:
            writer.close()
            return
        role = local_role(uid)
        owner = None if role >= Role.OPERATOR else uid
        refused = CONNECTIONS.refusal(self._open, owner)
        if refused is not None:
            bound, n = refused
            why = {
                "all": f"{n} connections open, the most the socket takes",
                "users": f"users hold {n} connections (the last {OPERATOR_CONNECTIONS} are kept "
                "for operators)",
                "owner": f"uid {uid} holds {n} connections, the most one user may",
            }[bound]
            self._refusals.note(uid, why)
            writer.close()
            return
        self._open[owner] += 1
        key = ""
        up_writer: asyncio.StreamWriter | None = None
        try:
            # the relay is opened only once the client speaks: a flood of connections that
            # close at once costs an accept each, not a connection to the gRPC server each
            # (which once failed another user's new connection 1 time in 3)
            try:
                first = await reader.read(_CHUNK)
            except (ConnectionError, OSError):
                return
            if not first:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return
            host, port = up_writer.get_extra_info("sockname")[:2]
            key = f"ipv4:{host}:{port}"
            self.peers[key] = Caller(role, uid, pid)
            up_writer.write(first)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # the front is stopping: the connection ends here, quietly
        finally:
            # the entry goes before the relay's connection closes: no later connection can
            # meet it with that connection's address
            self.peers.pop(key, None)
            self._open[owner] -= 1
            if not self._open[owner]:
                del self._open[owner]
            for w in (writer, up_writer):
                if w is not None:
                    w.close()


def _backlog() -> int:
    """The listen backlog: as deep as the kernel allows (``somaxconn``, at most 4,096), so
    that one user's burst of connections does not fill it for the others."""
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return max(128, min(int(f.read()), 4096))
    except (OSError, ValueError):
        return 1024


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(_CHUNK):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            dst.write_eof()
