"""A real sidecar (gRPC server, SQLite store, policy loop) on a Unix socket, in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dloader.sidecar.cli import parser, serve
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc
from tests._daemon import ThreadedDaemon


class Sidecar(ThreadedDaemon):
    """A sidecar daemon running in a background thread (its own event loop)."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        socket = str(tmp / "run" / "sidecar.sock")
        self.state_dir = str(tmp / "state")
        args = parser().parse_args(
            ["--socket", socket, "--state-dir", self.state_dir, "--period", "0.2", *extra]
        )
        super().__init__(serve, args, socket)
        self.stub = pb_grpc.NodeServiceStub(self.channel)


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
