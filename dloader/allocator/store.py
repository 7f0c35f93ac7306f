"""The allocator's SQLite state: jobs (spec, allocation), nodes, decisions, settings.

One file in the state directory (WAL mode). A restarted allocator reads back every job that has
not completed, with its allocation, and every node, so nothing is lost and running jobs are not
disturbed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dloader._daemon import store as base
from dloader._daemon.store import HISTORY_KEEP_S, SETTINGS_TABLE, SqliteState
from dloader.errors import finite_within

__all__ = [
    "MIGRATIONS",
    "AllocatorStore",
    "JobRow",
    "NodeRow",
    "Service",
    "placement_of",
    "service_of",
]

#: The schema, one migration per version (see :class:`dloader._daemon.SqliteState`).
MIGRATIONS = (
    """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec BLOB NOT NULL,
    submitted_at REAL NOT NULL,
    placement TEXT NOT NULL DEFAULT '{}',
    batch_size INTEGER NOT NULL DEFAULT 0,
    completed_at REAL,
    failed INTEGER NOT NULL DEFAULT 0,
    model TEXT,
    token TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    rendezvous TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    gpus INTEGER NOT NULL,
    free INTEGER NOT NULL,
    address TEXT NOT NULL,
    last_seen REAL NOT NULL,
    host TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    version INTEGER NOT NULL,
    job_id TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    placement TEXT NOT NULL,
    batch_size INTEGER NOT NULL,
    reason TEXT NOT NULL,
    dry_run INTEGER NOT NULL
);
"""
    + SETTINGS_TABLE,
    # 2: history is pruned by age (AllocatorStore.prune)
    """
CREATE INDEX IF NOT EXISTS decisions_at ON decisions (at);
CREATE INDEX IF NOT EXISTS jobs_completed ON jobs (completed_at);
""",
    # 3: a node's cores for its jobs' input pipelines (0: not limited)
    """
ALTER TABLE nodes ADD COLUMN cpus REAL NOT NULL DEFAULT 0;
""",
    # 4: a job's service (attained GPU-seconds, share done) survives a restart
    """
ALTER TABLE jobs ADD COLUMN attained_gpu_s REAL NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN counted_at REAL;
ALTER TABLE jobs ADD COLUMN done REAL;
ALTER TABLE jobs ADD COLUMN done_origin_gpu_s REAL NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN done_origin REAL NOT NULL DEFAULT 0;
""",
    # 5: a node whose Ray node hosts other nodes' jobs' remote workers (goodput-dp-lend)
    """
ALTER TABLE nodes ADD COLUMN lends INTEGER NOT NULL DEFAULT 0;
""",
)


@dataclass
class JobRow:
    """A job that has not completed, as stored."""

    job_id: str
    seq: int
    spec: bytes
    """The serialised ``dloader.v1.JobSpec`` (with every measurement received)."""
    submitted_at: float
    placement: str
    """GPUs per node as stored (JSON text: read, and checked, by :func:`placement_of`)."""
    batch_size: int
    model: str | None = None
    """The fitted ``ScalingModel.to_dict()`` as JSON (None: fit it from the spec)."""
    token: str = ""
    """The job's credential."""
    generation: int = 0
    """How many times its placement changed."""
    rendezvous: str = ""
    """``host:port`` of its rendezvous while it spans nodes."""
    owner: str = ""
    """Who submitted it (``uid N`` or a TCP token's role; "": an operator)."""
    attained_gpu_s: float = 0.0
    counted_at: float | None = None
    done: float | None = None
    done_origin_gpu_s: float = 0.0
    done_origin: float = 0.0
    """Its service as last stored (:class:`Service`; checked by :func:`service_of`)."""


@dataclass(frozen=True)
class Service:
    """What a job has had and done, stored at each decision so that a restarted allocator
    neither serves the most served again as new (``las``, ``pollux``) nor forgets how far a
    job that declared its length has come (:class:`dloader.allocator.jobs.SubmittedJob`)."""

    job_id: str
    attained_gpu_s: float
    counted_at: float | None
    done: float | None
    done_origin: tuple[float, float]


def service_of(row: JobRow) -> Service:
    """A stored row's service; :class:`dloader.errors.InvalidArgument` naming the value that
    is out of range."""
    return Service(
        row.job_id,
        finite_within("attained_gpu_s", row.attained_gpu_s, 0.0, 1e15),
        None if row.counted_at is None else finite_within("counted_at", row.counted_at, 0.0, 1e15),
        None if row.done is None else finite_within("done", row.done, 0.0, 1.0),
        (
            finite_within("done_origin_gpu_s", row.done_origin_gpu_s, 0.0, 1e15),
            finite_within("done_origin", row.done_origin, 0.0, 1.0),
        ),
    )


def placement_of(text: str) -> dict[str, int]:
    """A stored placement (``{"node": gpus}``); ``ValueError`` saying what is wrong with it."""
    value = json.loads(text)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1 << 20
        for k, v in value.items()
    ):
        raise ValueError(f"placement {text[:80]!r} is not a map of node ids to GPU counts")
    return value


@dataclass
class NodeRow:
    """A registered node."""

    node_id: str
    gpus: int
    free: int
    address: str
    last_seen: float
    host: str = ""
    cpus: float = 0.0
    lends: bool = False


class AllocatorStore(SqliteState):
    """The allocator's state database at ``path``."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, MIGRATIONS)

    def add_job(
        self,
        job_id: str,
        seq: int,
        spec: bytes,
        model: str | None = None,
        token: str = "",
        submitted_at: float | None = None,
        owner: str = "",
    ) -> None:
        """Stores a submitted job (its fitted model, its token, its submission time: a restarted
        allocator keeps the job's age; who submitted it: per-caller caps count it)."""
        when = time.time() if submitted_at is None else submitted_at
        self._exec(
            "INSERT INTO jobs (job_id, seq, spec, submitted_at, model, token, owner) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job_id, seq, spec, when, model, token, owner),
        )

    def update_spec(self, job_id: str, spec: bytes, model: str | None = None) -> None:
        """Replaces a job's spec (new measurements, priority) and, if given, its model."""
        if model is None:
            self._exec("UPDATE jobs SET spec = ? WHERE job_id = ?", (spec, job_id))
        else:
            self._exec(
                "UPDATE jobs SET spec = ?, model = ? WHERE job_id = ?", (spec, model, job_id)
            )

    def complete_job(self, job_id: str, failed: bool) -> None:
        """Marks a job done; it is not restored after a restart. Only what names it is kept
        (its id, owner and times, so that the id is not taken again): its spec (up to 2,000
        measurements, ~200 KB), model and token go (10,000 kept jobs once held ~2 GB)."""
        self._exec(
            "UPDATE jobs SET completed_at = ?, failed = ?, placement = '{}', spec = x'', "
            "model = NULL, token = '' WHERE job_id = ?",
            (time.time(), int(failed), job_id),
        )

    def set_aside(self, job_id: str) -> None:
        """Takes a job whose stored row no longer validates out of the schedule; the row stays
        (``failed`` = 2: set aside)."""
        self._exec(
            "UPDATE jobs SET completed_at = ?, failed = 2, placement = '{}' WHERE job_id = ?",
            (time.time(), job_id),
        )

    def known_job(self, job_id: str) -> bool:
        """Whether ``job_id`` was submitted (completed ones included, until :meth:`prune`)."""
        return bool(self._exec("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)))

    def active_jobs(self) -> list[JobRow]:
        """Jobs not completed, in submission order."""
        rows = self._exec(
            "SELECT job_id, seq, spec, submitted_at, placement, batch_size, model, token, "
            "generation, rendezvous, owner, attained_gpu_s, counted_at, done, done_origin_gpu_s, "
            "done_origin FROM jobs WHERE completed_at IS NULL ORDER BY seq"
        )
        return [JobRow(*r) for r in rows]

    def max_seq(self) -> int:
        """The highest submission number used."""
        return int(self._exec("SELECT COALESCE(MAX(seq), 0) FROM jobs")[0][0])

    def upsert_node(
        self,
        node_id: str,
        gpus: int,
        free: int,
        address: str,
        host: str = "",
        cpus: float = 0.0,
        lends: bool = False,
    ) -> None:
        """Adds or refreshes a node."""
        self._exec(
            "INSERT INTO nodes (node_id, gpus, free, address, last_seen, host, cpus, lends) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(node_id) DO UPDATE SET gpus = excluded.gpus, free = excluded.free, "
            "address = excluded.address, last_seen = excluded.last_seen, host = excluded.host, "
            "cpus = excluded.cpus, lends = excluded.lends",
            (node_id, gpus, free, address, time.time(), host, cpus, int(lends)),
        )

    def nodes(self) -> list[NodeRow]:
        """Every registered node, by id."""
        rows = self._exec(
            "SELECT node_id, gpus, free, address, last_seen, host, cpus, lends FROM nodes "
            "ORDER BY 1"
        )
        return [
            NodeRow(node, gpus, free, address, seen, host, cpus, bool(lends))
            for node, gpus, free, address, seen, host, cpus, lends in rows
        ]

    def add_decisions(
        self,
        version: int,
        rows: list[tuple[str, int, dict[str, int], int, str]],
        dry_run: bool,
        applied: Sequence[tuple[str, dict[str, int], int, int, str]] = (),
    ) -> None:
        """Logs a decision, (job, GPUs, placement, batch, reason) per changed job, and stores
        the allocations it applied, (job, placement, batch, generation, rendezvous), in one
        transaction."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO decisions (at, version, job_id, gpus, placement, batch_size, reason, "
                "dry_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(now, version, j, g, json.dumps(p), b, r, int(dry_run)) for j, g, p, b, r in rows],
            )
            self._db.executemany(
                "UPDATE jobs SET placement = ?, batch_size = ?, generation = ?, rendezvous = ? "
                "WHERE job_id = ?",
                [(json.dumps(p), b, g, rv, j) for j, p, b, g, rv in applied],
            )
            self._db.execute("COMMIT")

    def save_service(self, rows: Sequence[Service]) -> None:
        """Stores the jobs' service (:class:`Service`), in one transaction."""
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "UPDATE jobs SET attained_gpu_s = ?, counted_at = ?, done = ?, "
                "done_origin_gpu_s = ?, done_origin = ? WHERE job_id = ?",
                [(r.attained_gpu_s, r.counted_at, r.done, *r.done_origin, r.job_id) for r in rows],
            )
            self._db.execute("COMMIT")

    def decisions(self, job_id: str | None = None) -> list[tuple[int, str, int, int, str, bool]]:
        """Logged decisions (version, job, GPUs, batch, reason, dry run), oldest first."""
        sql = "SELECT version, job_id, gpus, batch_size, reason, dry_run FROM decisions"
        rows = (
            self._exec(sql + " WHERE job_id = ? ORDER BY id", (job_id,))
            if job_id
            else self._exec(sql + " ORDER BY id")
        )
        return [(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]

    def prune(self, now: float | None = None) -> int:
        """Drops jobs completed more than ``HISTORY_KEEP_S`` ago or past what is kept of each
        owner's and of all (:func:`dloader._daemon.store.ended_jobs_to_drop`), decisions older
        than that, and decisions past the newest ``MAX_DECISIONS``; returns the rows deleted.
        The file keeps its size (SQLite reuses the freed pages)."""
        cutoff = (time.time() if now is None else now) - HISTORY_KEEP_S
        with self._lock:
            self._db.execute("BEGIN")
            deleted = self._db.execute(
                "DELETE FROM jobs WHERE job_id IN ("
                + base.ended_jobs_to_drop("completed_at", "owner")
                + ")",
                (cutoff,),
            ).rowcount
            deleted += self._prune_decisions(cutoff)
            self._db.execute("COMMIT")
        return deleted
