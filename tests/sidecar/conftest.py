"""A real sidecar (gRPC server, SQLite store, policy loop) on a Unix socket, in a thread."""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from sidecar.cli import parser, serve


class Sidecar:
    """A sidecar daemon running in a background thread (its own event loop)."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.socket = str(tmp / "run" / "sidecar.sock")
        self.state_dir = str(tmp / "state")
        self.args: argparse.Namespace = parser().parse_args(
            ["--socket", self.socket, "--state-dir", self.state_dir, "--period", "0.2", *extra]
        )
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()
        self._thread.start()
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        grpc.channel_ready_future(channel).result(timeout=10)
        self.channel = channel
        self.stub = pb_grpc.NodeServiceStub(channel)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            # signal handlers only work in the main thread: serve() is given its stop event
            loop = asyncio.get_running_loop()
            loop.add_signal_handler = lambda *a, **k: None  # type: ignore[method-assign]
            await serve(self.args, self._stop)

        self._loop.run_until_complete(main())

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self.channel.close()


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = Sidecar(tmp_path)
    yield s
    s.stop()


def register(stub: pb_grpc.NodeServiceStub, pid: int, **kw: object) -> pb.RegisterJobResponse:
    req = pb.RegisterJobRequest(
        name=str(kw.pop("name", "job")),
        pids=[pid],
        num_workers=int(kw.pop("num_workers", 2)),  # type: ignore[call-overload]
        batch_size=int(kw.pop("batch_size", 32)),
        **kw,
    )  # type: ignore[arg-type,call-overload]
    return stub.RegisterJob(req, timeout=5)
