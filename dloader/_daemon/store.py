"""The daemons' SQLite base: one file in WAL mode, a lock, a settings table, a schema version.

The file is the daemon user's alone: its folder 0700 (an existing folder must be the user's and
not writable by others), the file and its WAL 0600. A file that exists but is empty (0 bytes:
truncated, or never written) is refused, not silently started afresh; the error says how to
start afresh on purpose (move the file away).

The schema is a list of migrations: ``migrations[i]`` takes the file from version ``i`` to
``i + 1`` (``PRAGMA user_version``), in one transaction. A new file runs them all; a file from
an older dloader runs the ones it lacks; a file from a newer dloader is refused with an error
naming the file and both versions, never half-read. Files written before versioning (version 0)
have the tables of the first migration, which uses ``CREATE TABLE IF NOT EXISTS``.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dloader._daemon.paths import own_folder, private_file
from dloader.errors import ConfigError

__all__ = [
    "HISTORY_KEEP_S",
    "MAX_DECISIONS",
    "MAX_ENDED_JOBS",
    "MAX_ENDED_JOBS_PER_OWNER",
    "SETTINGS_TABLE",
    "SqliteState",
    "ended_jobs_to_drop",
]

#: Every store has this table (create it in the first migration).
SETTINGS_TABLE = "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
#: Ended jobs and decisions are kept this long (a week), then pruned (the stores' ``prune``).
HISTORY_KEEP_S = 7 * 86400.0
#: Decisions kept at most (the newest), whatever their age.
MAX_DECISIONS = 100_000
#: Ended jobs kept at most, whatever their age: a client that registers and ends jobs in a loop
#: cannot grow the file past it. Kept fairly (:func:`ended_jobs_to_drop`): each owner's newest
#: first, so that one user's churn evicts that user's history, not every user's.
MAX_ENDED_JOBS = 10_000
#: Ended jobs kept at most per owner (a uid, a TCP role, the operators).
MAX_ENDED_JOBS_PER_OWNER = 1_000


def ended_jobs_to_drop(ended: str, owner: str) -> str:
    """The SELECT of the ended jobs a store drops (one parameter: the cutoff time): those that
    ended before the cutoff, those past their owner's ``MAX_ENDED_JOBS_PER_OWNER`` newest, and
    those past ``MAX_ENDED_JOBS`` in all, taken round-robin over the owners, newest first (each
    owner's newest, then each one's second newest, ...). ``ended``: the column of the end time,
    NULL while a job is active; ``owner``: the column naming the owner."""
    return (
        f"WITH ranked AS (SELECT job_id, {ended} AS e, ROW_NUMBER() OVER (PARTITION BY {owner} "
        f"ORDER BY {ended} DESC) AS rn FROM jobs WHERE {ended} IS NOT NULL), "
        f"kept AS (SELECT job_id FROM ranked WHERE e >= ? AND rn <= {MAX_ENDED_JOBS_PER_OWNER} "
        f"ORDER BY rn, e DESC LIMIT {MAX_ENDED_JOBS}) "
        "SELECT job_id FROM ranked WHERE job_id NOT IN (SELECT job_id FROM kept)"
    )


class SqliteState:
    """A thread-safe SQLite file in WAL mode, brought to the latest schema by ``migrations``."""

    def __init__(self, path: str | Path, migrations: Sequence[str]) -> None:
        self.path = Path(path)
        own_folder(self.path.parent, mode=0o700, what="state")
        if self.path.exists() and self.path.is_file() and self.path.stat().st_size == 0:
            raise ConfigError(
                f"state database {self.path} is empty (0 bytes): truncated or never written. "
                f"To start afresh on purpose, move it away (mv {self.path} {self.path}.empty)"
            )
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise ConfigError(f"state database {self.path} cannot be opened: {exc}") from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self.schema_version = self._migrate(migrations)
            self._check(migrations)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise ConfigError(
                f"state database {self.path} is not usable: {exc}. To start afresh, move it "
                f"away (mv {self.path} {self.path}.broken); its content is kept there"
            ) from None
        private_file(self.path)

    def _migrate(self, migrations: Sequence[str]) -> int:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > len(migrations):
            self._db.close()
            raise ConfigError(
                f"state database {self.path} has schema version {version}, newer than this "
                f"dloader's {len(migrations)}: upgrade dloader, or use another --state-dir"
            )
        for v in range(version, len(migrations)):
            # the migration and its version bump are one transaction: all or nothing
            try:
                self._db.executescript(
                    f"BEGIN;\n{migrations[v]}\nPRAGMA user_version = {v + 1};\nCOMMIT;"
                )
            except sqlite3.DatabaseError:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        return len(migrations)

    def _check(self, migrations: Sequence[str]) -> None:
        """``sqlite3.DatabaseError`` unless the file reads whole (``PRAGMA quick_check``) and
        every table of the schema has every column the schema gives it."""
        problems = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(problems[:3]))
        for table, columns in _schema("\n".join(migrations)).items():
            have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})").fetchall()}
            missing = [c for c in columns if c not in have]
            if missing:
                raise sqlite3.DatabaseError(f"table {table} lacks column(s) {', '.join(missing)}")

    def close(self) -> None:
        """Closes the database."""
        with self._lock:
            self._db.close()

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _prune_decisions(self, cutoff: float, table: str = "decisions") -> int:
        """In a transaction held by the caller: deletes the rows of ``table`` (a log with
        ``id`` and ``at`` columns: ``decisions``, or the sidecar's ``events``) logged before
        ``cutoff`` and those past the newest ``MAX_DECISIONS``; the rows deleted."""
        return int(
            self._db.execute(
                f"DELETE FROM {table} WHERE at < ? OR id <= (SELECT COALESCE(MAX(id), 0) FROM "
                f"{table}) - ?",
                (cutoff, MAX_DECISIONS),
            ).rowcount
        )

    def get_setting(self, key: str) -> str | None:
        """A stored setting."""
        rows = self._exec("SELECT value FROM settings WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def set_setting(self, key: str, value: str) -> None:
        """Stores a setting."""
        self._exec("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, value))


_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n?\);", re.S)  # one line or many
_ADD = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")


def _schema(sql: str) -> dict[str, list[str]]:
    """Each table the migrations create, with its columns (those added later included)."""
    tables = {
        name: [
            line.split()[0]
            for line in body.splitlines()
            if line.strip() and not line.split()[0].isupper()  # not PRIMARY KEY, UNIQUE, ...
        ]
        for name, body in _TABLE.findall(sql)
    }
    for table, column in _ADD.findall(sql):
        tables.setdefault(table, []).append(column)
    return tables
