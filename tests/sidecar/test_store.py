"""The sidecar's SQLite store: report retention."""

from __future__ import annotations

from pathlib import Path

import pytest

import dloader.sidecar.store as store_mod
from dloader.sidecar.store import SidecarStore


def test_reports_are_pruned_to_the_most_recent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_mod, "_KEEP_REPORTS", 10)
    monkeypatch.setattr(store_mod, "_PRUNE_EVERY", 5)
    store = SidecarStore(tmp_path / "s.db")
    for i in range(33):
        store.add_report("a", {"i": i})
        store.add_report("b", {"i": i})
        if i % 3 == 2:
            store.flush()
    assert len(store._exec("SELECT * FROM reports")) < 2 * 33  # 3 still queued
    store.close()  # flushes
    store = SidecarStore(tmp_path / "s.db")
    rows = store._exec("SELECT job_id, body FROM reports ORDER BY at")
    store.close()
    for job in ("a", "b"):
        kept = [body for j, body in rows if j == job]
        assert 10 <= len(kept) < 10 + 5  # pruned every 5 reports to the newest 10
        assert kept[-1] == '{"i": 32}'  # the newest is always there


def test_a_row_that_no_longer_reads_is_ended_not_fatal(tmp_path: Path) -> None:
    from dloader._shared.node_messages import JobLimits
    from dloader.sidecar.store import StoredJob

    s = SidecarStore(tmp_path / "s.db")
    good = StoredJob("good", "a", "t", JobLimits(), [1], [], 1, 8, 0.0)
    bad = StoredJob("bad", "b", "t", JobLimits(), [1], [], 1, 8, 0.0)
    s.add_job(good)
    s.add_job(bad)
    s._exec("UPDATE jobs SET limits = '{\"bogus\": 1}' WHERE job_id = 'bad'")
    assert [r.job_id for r in s.active_jobs()] == ["good"]
    assert [r.job_id for r in s.active_jobs()] == ["good"]  # ended, not retried
    s.close()
