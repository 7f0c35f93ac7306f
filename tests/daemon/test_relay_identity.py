"""S1: a relayed caller's identity cannot be presented on the public TCP port.

The Unix front relays each connection to a private loopback port and knows its caller by the
relay's source address. An unprivileged process once got the operator role, with no token, by
connecting to the public ``--listen`` port from a source port equal to a live relay's (the
kernel shares ephemeral ports between connections to different destinations; 2,206 connects
found one). These tests build exactly that state (a relay entry with the attacker's own source
address) and check that the public port still asks for a token, and that the private port
refuses whatever did not come through the front.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import psutil
import pytest

from dloader._allocator_messages import SCALING_FIELDS, JobSpec
from dloader._daemon.peer import Caller, Role
from dloader._daemon.server import ListenConfig
from dloader.allocator.config import Settings
from dloader.allocator.core import AllocatorCore
from dloader.allocator.server import build_server
from dloader.allocator.store import AllocatorStore
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc
from tests._daemon import free_port

pytestmark = pytest.mark.integration

TOKEN = "client-secret-token"


def _source_port_to(port: int) -> int:
    """The local port of this process's one TCP connection to 127.0.0.1:``port``."""
    mine = [
        c.laddr.port
        for c in psutil.Process().net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]
    assert len(mine) == 1, mine
    return mine[0]


def test_a_relay_source_port_gives_nothing_on_the_public_port(tmp_path: Path) -> None:
    async def scenario() -> None:
        core = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
        scaling = dict.fromkeys(SCALING_FIELDS, 0.001) | {"gamma": 1.5}
        core.submit(JobSpec("users-job", batch_size=32, scaling=scaling))
        public = free_port()
        serving = await build_server(
            core,
            ListenConfig(
                socket=str(tmp_path / "a.sock"),
                tcp=f"127.0.0.1:{public}",
                token="operator-token",
                client_token=TOKEN,
            ),
        )
        assert serving.front is not None
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{public}") as channel:
                stub = pb_grpc.ClusterAllocatorStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as no_token:
                    await stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
                assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # the state the attack reached: a live relay connection whose source address is
                # this connection's (an operator's, say root's, behind the Unix socket)
                port = _source_port_to(public)
                serving.front.peers[f"ipv4:127.0.0.1:{port}"] = Caller(Role.OPERATOR, 0, 1)
                for call in (
                    lambda: stub.Configure(
                        pb.ConfigureRequest(
                            config=pb.AllocatorConfig(dry_run=True), set_dry_run=True
                        ),
                        timeout=5,
                    ),
                    lambda: stub.CompleteJob(pb.CompleteJobRequest(job_id="users-job"), timeout=5),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call()
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # with its own token it is a client, and only a client
                md = (("authorization", f"Bearer {TOKEN}"),)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.CompleteJob(
                        pb.CompleteJobRequest(job_id="users-job"), metadata=md, timeout=5
                    )
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert not core.settings.dry_run and "users-job" in core.jobs
        finally:
            await serving.stop()

    asyncio.run(scenario())


def test_the_private_port_refuses_what_did_not_come_through_the_front(tmp_path: Path) -> None:
    async def scenario() -> None:
        core = AllocatorCore(AllocatorStore(tmp_path / "a.db"), Settings(interval_s=60))
        serving = await build_server(
            core, ListenConfig(socket=str(tmp_path / "a.sock"), token="operator-token")
        )
        assert serving.front is not None
        try:
            direct = f"127.0.0.1:{serving.front.port}"
            async with grpc.aio.insecure_channel(direct) as channel:
                stub = pb_grpc.ClusterAllocatorStub(channel)
                for md in ((), (("authorization", "Bearer operator-token"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.GetAllocations(
                            pb.GetAllocationsRequest(), metadata=md, timeout=5
                        )
                    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # through the front (this process's uid: an operator) it answers
            async with grpc.aio.insecure_channel(f"unix://{tmp_path / 'a.sock'}") as channel:
                stub = pb_grpc.ClusterAllocatorStub(channel)
                await stub.GetAllocations(pb.GetAllocationsRequest(), timeout=5)
        finally:
            await serving.stop()

    asyncio.run(scenario())
