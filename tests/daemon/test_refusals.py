"""Refused connections are logged at most once per 10 s per user, with a count of the rest
(40,000 refused connects once wrote 40,000 warning lines and starved other users' connects)."""

from __future__ import annotations

import logging

import pytest

from dloader._daemon.peer import RefusalLog


def test_refusals_are_logged_once_per_window_per_user(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    refusals = RefusalLog(every_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="dloader._daemon.peer"):
        logged = [refusals.note(1000, "uid 1000 holds 256 connections") for _ in range(40_000)]
        assert refusals.note(1001, "uid 1001 holds 256 connections")  # another user: its own
        now[0] = 10.5
        assert refusals.note(1000, "uid 1000 holds 256 connections")
    assert sum(logged) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[-1].endswith("(39999 more refused since the last such line)")


def test_a_connection_that_closes_at_once_costs_no_relay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """#49 §1 (low): another user's connect flood failed a third user's new connection 1 time
    in 3: each flood connection opened a relay to the gRPC server. The front now opens it only
    once a client speaks; and it holds each relay task itself, so that none is collected while
    pending when its client goes away ("Task was destroyed but it is pending!")."""
    import asyncio
    import gc
    import socket

    from dloader._daemon.peer import UnixFront

    async def scenario() -> tuple[int, bytes]:
        upstream: list[asyncio.StreamWriter] = []

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            upstream.append(writer)
            writer.write(await reader.read(100))
            await writer.drain()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        front = UnixFront(tmp_path / "s.sock", port, {})
        await front.start()
        for _ in range(200):  # the flood: connect and close
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(tmp_path / "s.sock"))
            s.close()
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "s.sock"))
        writer.write(b"hello")
        answer = await asyncio.wait_for(reader.read(100), 10)
        # clients that go away while their relay waits on the server
        for _ in range(20):
            _, w = await asyncio.open_unix_connection(str(tmp_path / "s.sock"))
            w.write(b"x")
            await w.drain()
            w.close()
        await asyncio.sleep(0.2)
        gc.collect()
        await asyncio.sleep(0.1)
        relays = len(upstream)
        writer.close()
        await front.stop()
        server.close()
        return relays, answer

    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("asyncio").addHandler(handler)
    try:
        relays, answer = asyncio.run(scenario())
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    assert answer == b"hello"
    assert relays == 1 + 20  # the one that spoke and the twenty that did; none of the flood
    assert not [m for m in messages if "destroyed but it is pending" in m], messages
