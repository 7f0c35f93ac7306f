"""When the sidecar agent reports: its loop against a fake loader, a fake helper and a fake
clock (no process, no sleeping)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest

from dloader._agent import agent as agent_module
from dloader._agent.agent import EARLY_INTERVAL_S, EARLY_REPORTS, SidecarAgent


class FakeLoader:
    """Its first batch comes at ``first_batch_at`` s; it is gone after ``gone_at`` s."""

    def __init__(self, clock: list[float], first_batch_at: float, gone_at: float) -> None:
        self.clock, self.first_batch_at, self.gone_at = clock, first_batch_at, gone_at

    def stats(self) -> Any:
        if self.clock[0] >= self.gone_at:
            return None
        batches = 10 if self.clock[0] >= self.first_batch_at else 0
        return SimpleNamespace(
            num_workers=2,
            batch_size=8,
            samples_per_second=100.0 if batches else 0.0,
            idle_share=0.0,
            step_seconds=0.08 if batches else 0.0,
            wait_seconds=0.0,
            window_seconds=1.0 if batches else 0.0,
            samples=8 * batches,
            done=None,
            batches=batches,
            workers=(),
        )


def test_reports_come_four_a_second_from_the_first_batch_and_one_a_second_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job registers when its loader is created, which may be long before its first batch
    (a model to build): until that batch one report a second says it is alive; from it, four
    a second for ``EARLY_REPORTS`` reports (its first placement rests on them), then one a
    second. Counted from connecting, the early reports were spent before the first batch."""
    clock = [0.0]
    monkeypatch.setattr(agent_module.time, "monotonic", lambda: clock[0])
    loader = FakeLoader(clock, first_batch_at=5.0, gone_at=12.0)
    agent = SidecarAgent(loader, "unix:///nowhere.sock")  # type: ignore[arg-type]
    waits: list[float] = []

    def wait(timeout: float) -> bool:
        waits.append(timeout)
        clock[0] += timeout
        return False

    monkeypatch.setattr(agent._stop, "wait", wait)
    sent: list[float] = []

    class Stdin(io.StringIO):
        def write(self, s: str) -> int:
            sent.append(round(clock[0], 2))
            return len(s)

    proc = SimpleNamespace(stdin=Stdin(), poll=lambda: None)
    agent._report_until_done(proc)  # type: ignore[arg-type]
    assert set(waits[:20]) == {EARLY_INTERVAL_S}  # looking for the first batch
    before = [t for t in sent if t < 5.0]
    assert before == [0.0, 1.0, 2.0, 3.0, 4.0]
    after = [t for t in sent if t >= 5.0]
    early = [5.0 + EARLY_INTERVAL_S * i for i in range(EARLY_REPORTS)]
    assert after[:EARLY_REPORTS] == early
    assert after[EARLY_REPORTS:] == [early[-1] + EARLY_INTERVAL_S + i for i in range(4)]
    assert agent._stop.is_set()  # the loader is gone
