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
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import psutil
import pytest

from dloader._daemon.peer import Caller, Role
from dloader._daemon.server import ListenConfig
from dloader._shared.allocator_messages import SCALING_FIELDS, JobSpec
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


ATTACKER = r"""
import json, os, sys, grpc, psutil
from dloader.v1 import allocator_pb2 as pb, allocator_pb2_grpc as pbg
os.setgroups([]); os.setgid(65534); os.setuid(65534)
target, relays, tries = sys.argv[1], set(json.loads(sys.argv[2])), int(sys.argv[3])
port = int(target.rsplit(":", 1)[1])
me = psutil.Process()
codes, collisions = {}, 0
for _ in range(tries):
    ch = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    stub = pbg.ClusterAllocatorStub(ch)
    try:
        req = pb.ConfigureRequest(config=pb.AllocatorConfig(dry_run=True), set_dry_run=True)
        stub.Configure(req, timeout=5)
        code = "OK"
    except grpc.RpcError as e:
        code = e.code().name
    mine = {c.laddr.port for c in me.net_connections("tcp") if c.raddr and c.raddr.port == port}
    collisions += bool(mine & relays)
    codes[code] = codes.get(code, 0) + 1
    ch.close()
print(json.dumps({"codes": codes, "collisions": collisions}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # the attacker's 3,000 connections may take 400 s (its own limit)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the attacker as another user")
def test_an_unprivileged_process_trying_source_ports_gets_no_role(tmp_path: Path) -> None:
    """The attack itself: while operator connections are relayed, an unprivileged process
    connects to the public port again and again (the kernel picks its source ports, sharing
    them across destinations) and calls Configure without a token. It never gets a role."""
    from tests.allocator.test_service import Allocator

    shared = Path(tempfile.mkdtemp(prefix="dloader-s1-"))
    os.chmod(shared, 0o755)
    public = free_port()
    a = Allocator(shared, "--listen", f"127.0.0.1:{public}", "--token", "operator-token")
    holders = []
    try:
        for _ in range(16):  # operator connections, relayed for the whole test
            ch = grpc.insecure_channel(
                f"unix://{a.socket}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            stream = pb_grpc.ClusterAllocatorStub(ch).WatchAllocations(pb.WatchAllocationsRequest())
            next(stream)
            holders.append((ch, stream))
        me = psutil.Process()
        listening = {
            c.laddr.port for c in me.net_connections("tcp") if c.status == psutil.CONN_LISTEN
        }
        relays = sorted(
            c.laddr.port
            for c in me.net_connections("tcp")
            if c.raddr and c.raddr.port in listening - {public} and c.laddr.ip == "127.0.0.1"
        )
        assert len(relays) >= 16, relays
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HOME": "/tmp"}
        out = subprocess.run(
            [sys.executable, "-c", ATTACKER, f"127.0.0.1:{public}", json.dumps(relays), "3000"],
            env=env, cwd="/", capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        got = json.loads(out.stdout.splitlines()[-1])
        print(f"attacker: {got}")  # how many of its connections shared a relay's source port
        assert set(got["codes"]) == {"UNAUTHENTICATED"}, got
        assert not a.stub.Configure(pb.ConfigureRequest(), timeout=5).dry_run
    finally:
        for ch, stream in holders:
            stream.cancel()
            ch.close()
        a.stop()
