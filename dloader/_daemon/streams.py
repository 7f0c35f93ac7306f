"""Server streams (``WatchAllocations``, ``WatchDirectives``): capped per caller, and each
keeping only the newest value.

One user's 2,000 ``WatchAllocations`` streams once took the operator's ``GetAllocations`` from
2.4 ms to 2 s (every decision was queued and serialised for every stream, and a stream that
was never read kept every decision). Now the streams a daemon serves are places shared by the
rule of :class:`~dloader._daemon.peer.Shares` (``MAX_STREAMS`` in all, ``OPERATOR_STREAMS`` of
them kept for operators, ``MAX_STREAMS_PER_CALLER`` for each other caller: a local user by uid,
a TCP caller by its credential), and each stream's mailbox holds one value: a slow reader gets
the newest, not a backlog.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Generic, TypeVar

from dloader._daemon.peer import Shares, current_caller
from dloader.errors import ResourceExhausted

__all__ = [
    "MAX_STREAMS",
    "MAX_STREAMS_PER_CALLER",
    "OPERATOR_STREAMS",
    "Mailbox",
    "Streams",
]

MAX_STREAMS = 512
OPERATOR_STREAMS = 32
MAX_STREAMS_PER_CALLER = 16

T = TypeVar("T")


class Mailbox(Generic[T]):
    """One stream's mailbox: the newest value put, until it is taken."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._value: T | None = None
        self._ready = asyncio.Event()

    def put(self, value: T) -> None:
        """Replaces any value not yet taken."""
        self._value = value
        self._ready.set()

    async def get(self) -> T:
        """The newest value put since the last ``get`` (waits for one)."""
        await self._ready.wait()
        self._ready.clear()
        value, self._value = self._value, None
        return value  # type: ignore[return-value]


class Streams(Generic[T]):
    """The open streams of one kind, for one daemon: opened by the current caller within the
    shares (:data:`MAX_STREAMS`, :data:`OPERATOR_STREAMS`, :data:`MAX_STREAMS_PER_CALLER`),
    or RESOURCE_EXHAUSTED naming the bound."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._open: set[Mailbox[T]] = set()

    def open(self) -> Mailbox[T]:
        owner = current_caller().owner
        shares = Shares(MAX_STREAMS, OPERATOR_STREAMS, MAX_STREAMS_PER_CALLER)
        refused = shares.refusal(Counter(m.owner or None for m in self._open), owner or None)
        if refused is not None:
            bound, n = refused
            raise ResourceExhausted(
                self.what,
                {
                    "all": f"{n} streams open, the most this daemon serves",
                    "users": f"callers hold {n} streams (the last {OPERATOR_STREAMS} are kept "
                    "for operators)",
                    "owner": f"{owner} holds {n} open streams, the most one caller may",
                }[bound],
            )
        box: Mailbox[T] = Mailbox(owner)
        self._open.add(box)
        return box

    def close(self, box: Mailbox[T]) -> None:
        self._open.discard(box)

    def __iter__(self) -> Iterator[Mailbox[T]]:
        return iter(list(self._open))

    def __len__(self) -> int:
        return len(self._open)

    def publish(self, value: T) -> None:
        """Puts ``value`` in every open stream's mailbox."""
        for box in list(self._open):
            box.put(value)
