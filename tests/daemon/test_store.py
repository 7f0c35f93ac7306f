"""The daemons' SQLite base: schema versions and migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dloader._daemon.store import SETTINGS_TABLE, SqliteState
from dloader.allocator.store import MIGRATIONS as ALLOCATOR_MIGRATIONS
from dloader.allocator.store import AllocatorStore
from dloader.errors import ConfigError
from dloader.sidecar.store import MIGRATIONS as SIDECAR_MIGRATIONS
from dloader.sidecar.store import SidecarStore

V1 = "CREATE TABLE IF NOT EXISTS things (id INTEGER PRIMARY KEY);\n" + SETTINGS_TABLE
V2 = "ALTER TABLE things ADD COLUMN name TEXT NOT NULL DEFAULT '';"


def version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_new_file_gets_every_migration(tmp_path: Path) -> None:
    s = SqliteState(tmp_path / "a.db", [V1, V2])
    s._exec("INSERT INTO things (id, name) VALUES (1, 'x')")
    s.close()
    assert version(tmp_path / "a.db") == 2


def test_older_file_is_migrated_in_place(tmp_path: Path) -> None:
    s = SqliteState(tmp_path / "a.db", [V1])
    s._exec("INSERT INTO things (id) VALUES (7)")
    s.set_setting("k", "v")
    s.close()
    s = SqliteState(tmp_path / "a.db", [V1, V2])
    assert s._exec("SELECT id, name FROM things") == [(7, "")]
    assert s.get_setting("k") == "v"
    s.close()
    assert version(tmp_path / "a.db") == 2


def test_a_file_from_a_newer_dloader_is_refused_by_name(tmp_path: Path) -> None:
    SqliteState(tmp_path / "a.db", [V1, V2]).close()
    with pytest.raises(
        ConfigError, match=r"a\.db has schema version 2, newer than this dloader's 1"
    ):
        SqliteState(tmp_path / "a.db", [V1])


def test_a_failed_migration_leaves_the_file_at_its_version(tmp_path: Path) -> None:
    SqliteState(tmp_path / "a.db", [V1]).close()
    with pytest.raises(ConfigError, match="not usable"):
        SqliteState(tmp_path / "a.db", [V1, "ALTER TABLE nowhere ADD COLUMN x TEXT;"])
    assert version(tmp_path / "a.db") == 1


@pytest.mark.parametrize(
    ("store", "migrations"),
    [(SidecarStore, SIDECAR_MIGRATIONS), (AllocatorStore, ALLOCATOR_MIGRATIONS)],
)
def test_daemon_stores_are_versioned(
    tmp_path: Path, store: type, migrations: tuple[str, ...]
) -> None:
    s = store(tmp_path / "state.db")
    assert s.schema_version == len(migrations)
    s.close()
    assert version(tmp_path / "state.db") == len(migrations)


def test_the_allocators_history_is_pruned_by_age(tmp_path: Path) -> None:
    """A completed job's row and the decisions older than a week go (its id may then be
    submitted again); running jobs and recent history stay."""
    from dloader._daemon.store import HISTORY_KEEP_S

    s = AllocatorStore(tmp_path / "a.db")
    for seq, job_id in enumerate(("done", "running"), 1):
        s.add_job(job_id, seq, b"spec", token="t")
    s.add_decisions(1, [("done", 1, {"n": 1}, 8, "why")], False)
    s.complete_job("done", failed=False)
    now = __import__("time").time()
    assert s.prune(now) == 0
    assert s.prune(now + HISTORY_KEEP_S + 60) == 2  # the job and its decision
    assert not s.known_job("done") and [r.job_id for r in s.active_jobs()] == ["running"]
    s.close()


def test_an_older_file_is_brought_to_the_pruning_schema(tmp_path: Path) -> None:
    """Files of the version before pruning (1) migrate in place to the latest, their rows
    kept."""
    for migrations, store in (
        (ALLOCATOR_MIGRATIONS, AllocatorStore),
        (SIDECAR_MIGRATIONS, SidecarStore),
    ):
        path = tmp_path / f"{store.__name__}.db"
        SqliteState(path, migrations[:1]).close()
        assert version(path) == 1
        store(path).close()
        assert version(path) == len(migrations) >= 2


def test_ended_jobs_are_capped_by_count_in_both_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that registers and ends jobs in a loop grows neither file past
    ``MAX_ENDED_JOBS`` ended jobs: the most recent stay, active jobs always."""
    from dloader._daemon import store as base
    from dloader._shared.node_messages import JobLimits
    from dloader.sidecar.store import StoredJob

    monkeypatch.setattr(base, "MAX_ENDED_JOBS", 3)
    side = SidecarStore(tmp_path / "s.db")
    alloc = AllocatorStore(tmp_path / "a.db")
    for i in range(8):
        side.add_job(StoredJob(f"j{i}", f"j{i}", "t", JobLimits(), [1], [], 1, 8, 0.0))
        alloc.add_job(f"j{i}", i + 1, b"spec", token="t")
        if i < 7:  # j7 stays active
            side.end_job(f"j{i}")
            alloc.complete_job(f"j{i}", failed=False)
            __import__("time").sleep(0.01)  # distinct end times
    side.flush()
    side.prune()
    alloc.prune()
    assert {r[0] for r in side._exec("SELECT job_id FROM jobs")} == {"j4", "j5", "j6", "j7"}
    assert {r[0] for r in alloc._exec("SELECT job_id FROM jobs")} == {"j4", "j5", "j6", "j7"}
    side.close()
    alloc.close()


def test_one_users_churn_evicts_its_own_history_not_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#49 §1 (medium): one user evicted every user's stored history and models by churning
    10,050 ended jobs (the cap was global). What is kept is kept per owner and, past the
    total, round-robin over the owners: the churner loses its own oldest."""
    import time

    from dloader._daemon import store as base
    from dloader._shared.node_messages import JobLimits
    from dloader.sidecar.store import StoredJob

    monkeypatch.setattr(base, "MAX_ENDED_JOBS", 6)
    monkeypatch.setattr(base, "MAX_ENDED_JOBS_PER_OWNER", 4)
    side = SidecarStore(tmp_path / "s.db")
    alloc = AllocatorStore(tmp_path / "a.db")
    seq = iter(range(1, 100))

    def ended(job_id: str, uid: int) -> None:
        side.add_job(StoredJob(job_id, job_id, "t", JobLimits(), [1], [], 1, 8, 0.0, uid=uid))
        alloc.add_job(job_id, next(seq), b"spec", token="t", owner=f"uid {uid}")
        side.end_job(job_id)
        alloc.complete_job(job_id, failed=False)
        time.sleep(0.005)  # distinct end times

    for i in range(2):
        ended(f"alice{i}", 1001)
    ended("bob0", 1002)
    for i in range(30):  # mallory churns
        ended(f"mallory{i}", 1003)
    side.flush()
    side.prune()
    alloc.prune()
    kept = {"alice0", "alice1", "bob0", "mallory29", "mallory28", "mallory27"}
    assert {r[0] for r in side._exec("SELECT job_id FROM jobs")} == kept
    assert {r[0] for r in alloc._exec("SELECT job_id FROM jobs")} == kept
    side.close()
    alloc.close()


def test_a_completed_allocator_job_keeps_only_what_names_it(tmp_path: Path) -> None:
    """#49 §1 (medium): a completed job kept its whole spec (~200 KB with 2,000 measurements:
    ~2 GB at the 10,000 cap); now its id and owner stay (the id is not taken again), the spec,
    model and token go."""
    alloc = AllocatorStore(tmp_path / "a.db")
    alloc.add_job("big", 1, b"x" * 200_000, token="t", owner="uid 7")
    alloc.complete_job("big", failed=False)
    assert alloc.known_job("big")
    ((spec, token, owner),) = alloc._exec("SELECT spec, token, owner FROM jobs")
    assert len(spec) == 0 and token == "" and owner == "uid 7"
    alloc.close()
