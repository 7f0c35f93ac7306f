"""The sidecar's SQLite store: report retention."""

from __future__ import annotations

from pathlib import Path

import pytest

import dloader._daemon.store as base_store
import dloader.sidecar.store as store_mod
from dloader.sidecar.node_policy import PolicyEvent
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


def test_a_report_is_stored_small_whatever_it_carries(tmp_path: Path) -> None:
    """A report may carry 4,096 workers (about 500 KB of JSON); one report stream grew the file
    by 350 MB in 45 s. A stored report keeps 16 of them and their count."""
    store = SidecarStore(tmp_path / "s.db")
    worker = {"pid": 123456, "fetch_seconds": 0.1, "cpu_seconds": 0.05, "batches": 10}
    before = (tmp_path / "s.db").stat().st_size
    for _ in range(200):
        store.add_report("a", {"samples_per_second": 1.0, "workers": [worker] * 4096})
    store.close()
    grown = (tmp_path / "s.db").stat().st_size + _wal(tmp_path) - before
    assert grown < 2_000_000, grown  # 200 reports, not 100 MB
    store = SidecarStore(tmp_path / "s.db")
    (body,) = {r[0] for r in store._exec("SELECT body FROM reports")}
    assert '"workers_reported": 4096' in body
    store.close()


def _wal(folder: Path) -> int:
    wal = folder / "s.db-wal"
    return wal.stat().st_size if wal.exists() else 0


def test_an_ended_jobs_history_is_pruned(tmp_path: Path) -> None:
    """Its reports go when it ends; its row, model and decisions after HISTORY_KEEP_S; an
    active job's stay."""
    from dloader._daemon.store import HISTORY_KEEP_S
    from dloader._shared.node_messages import JobLimits
    from dloader.sidecar.store import StoredJob

    s = SidecarStore(tmp_path / "s.db")
    for job_id in ("old", "live"):
        s.add_job(StoredJob(job_id, job_id, "t", JobLimits(), [1], [], 1, 8, 0.0))
        s.add_report(job_id, {"i": 1})
        s.save_model(job_id, {"m": 1})
        s.add_decision(job_id, 2, 8, [], "why")
    s.flush()
    s.end_job("old")
    assert {r[0] for r in s._exec("SELECT job_id FROM reports")} == {"live"}
    now = __import__("time").time()
    assert s.prune(now) == 0  # ended just now: kept
    assert s.prune(now + HISTORY_KEEP_S + 60) > 0
    assert {r[0] for r in s._exec("SELECT job_id FROM jobs")} == {"live"}
    assert {r[0] for r in s._exec("SELECT job_id FROM models")} == {"live"}
    assert s._exec("SELECT COUNT(*) FROM decisions")[0][0] == 0  # older than the window
    assert [r.job_id for r in s.active_jobs()] == ["live"]
    s.close()


def test_decisions_and_events_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base_store, "MAX_DECISIONS", 50)
    s = SidecarStore(tmp_path / "s.db")
    for i in range(120):
        s.add_decision("a", i, 8, [], "why")
        s.add_events([PolicyEvent("directed", "a", i, None)])
    s.prune()
    kept = [r[0] for r in s._exec("SELECT num_workers FROM decisions ORDER BY id")]
    assert kept == list(range(70, 120))
    assert [e.num_workers for _, e in s.events()] == list(range(70, 120))
    s.add_events([PolicyEvent("directed", "a", 1, None)], at=0.0)  # older than a week
    s.prune()
    assert len(s.events()) == 50
    s.close()


def test_events_read_back_by_kind_in_order(tmp_path: Path) -> None:
    s = SidecarStore(tmp_path / "s.db")
    s.add_events([PolicyEvent("expected", "a", 3, 120.5), PolicyEvent("placed", "b", 2)], at=10.0)
    s.add_events([PolicyEvent("expected", "b", 2, 80.0)], at=11.0)
    assert s.events("expected") == [
        (10.0, PolicyEvent("expected", "a", 3, 120.5)),
        (11.0, PolicyEvent("expected", "b", 2, 80.0)),
    ]
    assert [e.kind for _, e in s.events()] == ["expected", "placed", "expected"]
    s.close()
