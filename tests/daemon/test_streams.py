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
