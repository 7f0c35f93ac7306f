"""A daemon's ``serve(args, stop)`` run for real (gRPC server, SQLite) in a background thread."""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import grpc


def free_port() -> int:
    """A TCP port the OS just gave out on 127.0.0.1 (bound to 0, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadedDaemon:
    """Runs ``serve(args, stop)`` on its own event loop; ``stop()`` ends it like SIGTERM would."""

    def __init__(
        self,
        serve: Callable[[argparse.Namespace, asyncio.Event], Coroutine[Any, Any, None]],
        args: argparse.Namespace,
        socket: str,
    ) -> None:
        self.args = args
        self.socket = socket
        self._serve = serve
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        channel = grpc.insecure_channel(f"unix://{socket}")
        grpc.channel_ready_future(channel).result(timeout=10)
        self.channel = channel

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            # signal handlers only work in the main thread: serve() is given its stop event
            loop = asyncio.get_running_loop()
            loop.add_signal_handler = lambda *a, **k: None  # type: ignore[method-assign]
            await self._serve(self.args, self._stop)

        self._loop.run_until_complete(main())

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.channel.close()
