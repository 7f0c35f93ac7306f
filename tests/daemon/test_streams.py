"""S6: a stream dropped while suspended is closed by asyncio's async-generator finalizer, in
another task's context. Resetting the caller there raised ``ValueError`` ("created in a
different Context"), which asyncio logged as "Task exception was never retrieved": any client
could flood the daemon's log by dropping streams."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from dloader._daemon.peer import Caller, Role, current_caller
from dloader._daemon.server import ErrorInterceptor


class _Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"

    def invocation_metadata(self) -> tuple[Any, ...]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def test_a_stream_closed_from_another_context_ends_quietly() -> None:
    interceptor = ErrorInterceptor(peers={"ipv4:127.0.0.1:5": Caller(Role.CLIENT, 1000, 7)})

    async def stream() -> Any:
        async with interceptor._serving(_Context(), "/dloader.v1.X/Watch"):  # type: ignore[arg-type]
            while True:
                yield current_caller()

    async def scenario() -> None:
        gen = stream()
        assert (await gen.__anext__()).uid == 1000  # the caller is known inside the stream
        # the finalizer's close runs in a task of its own: another Context; it must not raise
        await asyncio.create_task(gen.aclose())

    asyncio.run(scenario())


def test_streams_are_capped_per_caller_and_keep_only_the_newest() -> None:
    """One user's 2,000 WatchAllocations streams once slowed the operator's calls 1,000x: each
    caller may hold MAX_STREAMS_PER_CALLER streams (by uid; by credential on TCP), operators
    keep a reserve, and a stream never read holds one value, not a backlog."""
    import pytest

    from dloader._daemon.peer import CALLER
    from dloader._daemon.streams import MAX_STREAMS_PER_CALLER, Streams
    from dloader.errors import ResourceExhausted

    async def scenario() -> None:
        streams: Streams[int] = Streams("WatchAllocations")
        CALLER.set(Caller(Role.CLIENT, 1000, 7))
        mine = [streams.open() for _ in range(MAX_STREAMS_PER_CALLER)]
        with pytest.raises(ResourceExhausted, match="uid 1000 holds 16 open streams"):
            streams.open()
        CALLER.set(Caller(Role.CLIENT, 1001, 8))
        other = streams.open()  # another user is not held back
        CALLER.set(Caller(Role.CLIENT, None, None))  # a TCP client, counted by its token
        tcp = [streams.open() for _ in range(MAX_STREAMS_PER_CALLER)]
        with pytest.raises(ResourceExhausted, match="client token holds 16"):
            streams.open()
        CALLER.set(Caller(Role.OPERATOR, 0, 1))
        streams.open()  # operators always have a way in
        streams.close(mine[0])
        CALLER.set(Caller(Role.CLIENT, 1000, 7))
        streams.open()  # a closed stream frees its place
        for value in range(1000):
            streams.publish(value)
        assert await other.get() == 999  # the newest, not the first of a backlog
        assert len(streams) == 2 * MAX_STREAMS_PER_CALLER + 2 and tcp

    asyncio.run(scenario())
