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
