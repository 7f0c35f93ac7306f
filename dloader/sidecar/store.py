"""The sidecar's SQLite state: jobs, recent reports, fitted models, decisions, the node
policy's records (events), policy.

One file in the state directory (WAL mode). A restarted sidecar reads it back: registered jobs
(with their tokens, so running jobs reconnect without re-registering), each job's loader model
(nothing learned is lost) and the policy.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dloader._daemon import store as base
from dloader._daemon.store import HISTORY_KEEP_S, SETTINGS_TABLE, SqliteState
from dloader._shared.node_messages import JobLimits
from dloader.sidecar.node_policy import PolicyEvent

__all__ = ["MIGRATIONS", "SidecarStore", "StoredJob"]

#: The schema, one migration per version (see :class:`dloader._daemon.SqliteState`).
MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    token TEXT NOT NULL,
    limits TEXT NOT NULL,
    pids TEXT NOT NULL,
    gpus TEXT NOT NULL,
    num_workers INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    registered_at REAL NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    starts TEXT NOT NULL DEFAULT '[]',
    uid INTEGER
);
CREATE TABLE IF NOT EXISTS reports (
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS reports_job ON reports (job_id, at);
CREATE TABLE IF NOT EXISTS models (
    job_id TEXT PRIMARY KEY,
    payload TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job_id TEXT NOT NULL,
    num_workers INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    cpus TEXT NOT NULL,
    reason TEXT NOT NULL
);
"""
    + SETTINGS_TABLE,
    # 2: when a job ended (its history is pruned HISTORY_KEEP_S later)
    """
ALTER TABLE jobs ADD COLUMN ended_at REAL;
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at);
""",
    # 3: what ties a job to its job at the cluster allocator (the digest of its key)
    """
ALTER TABLE jobs ADD COLUMN allocator_key TEXT NOT NULL DEFAULT '';
""",
    # 4: the node policy's records (node_policy.PolicyEvent): placements, counts directed, the
    # model's expectation of each job at each new split, cost changes
    """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    num_workers INTEGER NOT NULL,
    samples_per_s REAL
);
CREATE INDEX IF NOT EXISTS events_at ON events (at);
""",
)

log = logging.getLogger(__name__)

_KEEP_REPORTS = 1000  # per job
_PRUNE_EVERY = 100  # reports of a job between two prunings
#: Per-worker entries a stored report keeps (a report may carry 4,096: 500 KB each, which grew
#: the file by 350 MB in 45 s); the count of all is kept.
_STORED_WORKERS = 16


@dataclass
class StoredJob:
    """A registered job as stored."""

    job_id: str
    name: str
    token: str
    limits: JobLimits
    pids: list[int]
    gpus: list[int]
    num_workers: int
    batch_size: int
    registered_at: float
    starts: list[int] = field(default_factory=list)
    """Each of ``pids``' start time (clock ticks after boot, ``/proc/PID/stat``): what pins a
    PID to the process that was registered, so that a PID the kernel reuses is not the job's."""
    uid: int | None = None
    """The local user who registered it (None: an operator or a TCP caller); per-user caps
    count it."""
    allocator_key: str = ""
    """The digest of the key it registered with (``DLOADER_JOB_KEY``, from dloader-launch):
    the allocator's allocation of the job carries the same digest ("": not an allocator job)."""


class SidecarStore(SqliteState):
    """The sidecar's state database at ``path``."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, MIGRATIONS)
        self._added: dict[str, int] = {}  # reports written per job since opening
        self._pending: list[tuple[str, float, str]] = []  # reports queued for flush()

    # ------------------------------------------------------------------ jobs

    def add_job(self, job: StoredJob) -> None:
        """Stores a newly registered job."""
        self._exec(
            "INSERT INTO jobs (job_id, name, token, limits, pids, gpus, num_workers, "
            "batch_size, registered_at, active, starts, uid, allocator_key) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)",
            (
                job.job_id,
                job.name,
                job.token,
                json.dumps(asdict(job.limits)),
                json.dumps(job.pids),
                json.dumps(job.gpus),
                job.num_workers,
                job.batch_size,
                job.registered_at,
                json.dumps(job.starts),
                job.uid,
                job.allocator_key,
            ),
        )

    def update_pids(self, job_id: str, pids: list[int], starts: list[int]) -> None:
        """Records a job's processes as they are now (some exited or were reused)."""
        self._exec(
            "UPDATE jobs SET pids = ?, starts = ? WHERE job_id = ?",
            (json.dumps(pids), json.dumps(starts), job_id),
        )

    def update_job(self, job_id: str, *, num_workers: int, batch_size: int) -> None:
        """Records a job's current worker count and batch size."""
        self._exec(
            "UPDATE jobs SET num_workers = ?, batch_size = ? WHERE job_id = ?",
            (num_workers, batch_size, job_id),
        )

    def end_job(self, job_id: str) -> None:
        """Marks a job gone (deregistered or dead): its reports go now (queued ones too); its
        row, model and decisions stay for ``HISTORY_KEEP_S`` (:meth:`prune`)."""
        with self._lock:
            self._pending = [r for r in self._pending if r[0] != job_id]
            self._added.pop(job_id, None)
            self._db.execute("BEGIN")
            self._db.execute(
                "UPDATE jobs SET active = 0, ended_at = ? WHERE job_id = ?", (time.time(), job_id)
            )
            self._db.execute("DELETE FROM reports WHERE job_id = ?", (job_id,))
            self._db.execute("COMMIT")

    def prune(self, now: float | None = None) -> int:
        """Drops what is older than ``HISTORY_KEEP_S``: ended jobs (row and model) and
        decisions, and ended jobs past what is kept of each user's and of all
        (:func:`dloader._daemon.store.ended_jobs_to_drop`) and decisions past the newest
        ``MAX_DECISIONS``; also reports of jobs no longer active (left by a crash).
        Returns the rows deleted. The file keeps its size (SQLite reuses the freed pages)."""
        cutoff = (time.time() if now is None else now) - HISTORY_KEEP_S
        with self._lock:
            self._db.execute("BEGIN")
            gone = [
                r[0]
                for r in self._db.execute(
                    base.ended_jobs_to_drop(
                        "CASE WHEN active = 0 THEN COALESCE(ended_at, 0) END", "uid"
                    ),
                    (cutoff,),
                ).fetchall()
            ]
            deleted = 0
            for table in ("models", "jobs"):
                deleted += self._db.executemany(
                    f"DELETE FROM {table} WHERE job_id = ?", [(j,) for j in gone]
                ).rowcount
            deleted += self._db.execute(
                "DELETE FROM reports WHERE job_id NOT IN (SELECT job_id FROM jobs WHERE active = 1)"
            ).rowcount
            deleted += self._prune_decisions(cutoff)
            deleted += self._prune_decisions(cutoff, "events")
            self._db.execute("COMMIT")
        return deleted

    def active_jobs(self) -> list[StoredJob]:
        """Jobs registered and not ended. A row that no longer reads is ended (it stays in the
        file) with an error naming the file and the row, instead of keeping the sidecar down."""
        rows = self._exec(
            "SELECT job_id, name, token, limits, pids, gpus, num_workers, "
            "batch_size, registered_at, starts, uid, allocator_key FROM jobs WHERE active = 1"
        )
        out = []
        for r in rows:
            try:
                rec = StoredJob(
                    r[0],
                    r[1],
                    r[2],
                    JobLimits.from_json(json.loads(r[3])),
                    [int(p) for p in json.loads(r[4])],
                    [int(g) for g in json.loads(r[5])],
                    int(r[6]),
                    int(r[7]),
                    float(r[8]),
                    [int(t) for t in json.loads(r[9])],
                    None if r[10] is None else int(r[10]),
                    str(r[11]),
                )
            except (ValueError, TypeError) as exc:
                log.error(
                    "state database %s: jobs row %r no longer reads (%s); it is ended (kept in "
                    "the file); the job's agent registers it again if it is still running",
                    self.path,
                    str(r[0])[:64],
                    exc,
                )
                self.end_job(r[0])
                continue
            out.append(rec)
        return out

    # ------------------------------------------------------------------ reports and models

    def add_report(self, job_id: str, body: dict[str, Any]) -> None:
        """Queues a report for :meth:`flush`, which writes the queue in one transaction (the
        sidecar flushes every period: a crash loses at most a period of report history, never
        a job, a model or a decision). The most recent 1,000 reports per job are kept, each with
        at most ``_STORED_WORKERS`` of its workers; older ones are pruned every
        ``_PRUNE_EVERY`` reports of the job, and all of them when the job ends."""
        workers = body.get("workers")
        if isinstance(workers, list) and len(workers) > _STORED_WORKERS:
            body = {**body, "workers": workers[:_STORED_WORKERS], "workers_reported": len(workers)}
        with self._lock:
            self._pending.append((job_id, time.time(), json.dumps(body)))

    def flush(self) -> None:
        """Writes the queued reports."""
        with self._lock:
            rows, self._pending = self._pending, []
            if not rows:
                return
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT INTO reports VALUES (?, ?, ?)", rows)
                for job_id, n in Counter(r[0] for r in rows).items():
                    before = self._added.get(job_id, 0)
                    after = self._added[job_id] = before + n
                    if after // _PRUNE_EVERY > before // _PRUNE_EVERY:
                        self._db.execute(
                            "DELETE FROM reports WHERE job_id = ? AND at < (SELECT at FROM "
                            "reports WHERE job_id = ? ORDER BY at DESC LIMIT 1 OFFSET ?)",
                            (job_id, job_id, _KEEP_REPORTS),
                        )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        """Writes the queued reports and closes the database."""
        self.flush()
        super().close()

    def save_model(self, job_id: str, payload: dict[str, Any]) -> None:
        """Stores a job's fitted model (``LoaderModel.to_dict()``)."""
        self._exec(
            "INSERT OR REPLACE INTO models VALUES (?, ?, ?)",
            (job_id, json.dumps(payload), time.time()),
        )

    def load_model(self, job_id: str) -> dict[str, Any] | None:
        """A job's stored model payload, if any."""
        rows = self._exec("SELECT payload FROM models WHERE job_id = ?", (job_id,))
        return json.loads(rows[0][0]) if rows else None

    def last_model_of(self, name: str, uid: int | None) -> tuple[str, dict[str, Any]] | None:
        """The most recently saved model of an ended job named ``name`` that the same local
        user (``uid``; None: an operator's) registered, with that job's id: a job that comes
        back starts from what it was. None: no such job, or its model does not read."""
        rows = self._exec(
            "SELECT m.job_id, m.payload FROM models m JOIN jobs j ON j.job_id = m.job_id "
            "WHERE j.name = ? AND j.uid IS ? AND j.active = 0 ORDER BY m.updated_at DESC LIMIT 1",
            (name, uid),
        )
        if not rows:
            return None
        try:
            payload = json.loads(rows[0][1])
        except ValueError:
            return None
        return (rows[0][0], payload) if isinstance(payload, dict) else None

    # ------------------------------------------------------------------ decisions, settings

    def add_events(self, events: Sequence[PolicyEvent], at: float | None = None) -> None:
        """Records what the node policy did or learnt, at ``at`` (``time.time()``; None: now),
        in one transaction."""
        if not events:
            return
        now = time.time() if at is None else at
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO events (at, job_id, kind, num_workers, samples_per_s) "
                "VALUES (?, ?, ?, ?, ?)",
                [(now, e.job_id, e.kind, e.num_workers, e.samples_per_s) for e in events],
            )
            self._db.execute("COMMIT")

    def registrations(self) -> list[tuple[str, str, float]]:
        """Every job the file holds, active or ended: (job id, name, registered at, as
        ``time.time()``), in the order they registered."""
        rows = self._exec("SELECT job_id, name, registered_at FROM jobs ORDER BY registered_at")
        return [(r[0], r[1], r[2]) for r in rows]

    def events(self, kind: str | None = None) -> list[tuple[float, PolicyEvent]]:
        """The node policy's records, oldest first, each with its time (``time.time()``);
        ``kind``: only those of that kind."""
        sql = "SELECT at, kind, job_id, num_workers, samples_per_s FROM events"
        rows = self._exec(
            sql + (" WHERE kind = ?" if kind else "") + " ORDER BY id", (kind,) if kind else ()
        )
        return [(r[0], PolicyEvent(r[1], r[2], r[3], r[4])) for r in rows]

    def add_decision(
        self, job_id: str, num_workers: int, batch_size: int, cpus: list[int], reason: str
    ) -> None:
        """Logs a directive sent to a job."""
        self._exec(
            "INSERT INTO decisions (at, job_id, num_workers, batch_size, cpus, reason) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (time.time(), job_id, num_workers, batch_size, json.dumps(cpus), reason),
        )
