"""The messages that cross a process boundary between a loader and its sidecar, defined once.

A loader's agent (training process) -> its helper process (JSON lines on a pipe) -> the
sidecar's servicer (gRPC) -> the sidecar's core: each message is one frozen dataclass here,
with one conversion per transport (``to_json``/``from_json`` for the pipe, ``to_pb``/
``from_pb`` for gRPC). Nothing on the far side reads a dict.

No gRPC or protobuf at import: the training process imports this module, and ``to_pb``/
``from_pb`` import the generated messages when they are first called (in the helper and the
sidecar).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "MAX_NICE",
    "Directive",
    "JobLimits",
    "JobReport",
    "Registration",
    "WorkerReport",
    "fit_remote",
]

MAX_NICE = 19
"""The highest nice value (Linux: -20..19)."""


def _pb() -> Any:
    from dloader.v1 import node_pb2

    return node_pb2


@dataclass(frozen=True)
class JobLimits:
    """What the job's owner allows the sidecar to choose (0: no limit stated)."""

    min_workers: int = 0
    max_workers: int = 0
    min_batch_size: int = 0
    max_batch_size: int = 0
    may_change_batch_size: bool = False
    max_remote_workers: int = 0
    """Remote (Ray) workers its loader may have (``RayWorkers.max_workers``; 0: none)."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobLimits:
        """From :func:`dataclasses.asdict` output (the pipe and the sidecar's store)."""
        return cls(**d)

    def to_pb(self) -> Any:
        """As a ``dloader.v1.JobLimits``."""
        return _pb().JobLimits(**asdict(self))

    @classmethod
    def from_pb(cls, m: Any) -> JobLimits:
        """From a ``dloader.v1.JobLimits``."""
        return cls(
            m.min_workers,
            m.max_workers,
            m.min_batch_size,
            m.max_batch_size,
            m.may_change_batch_size,
            m.max_remote_workers,
        )


@dataclass(frozen=True)
class WorkerReport:
    """One loader worker over the report's window."""

    pid: int
    fetch_seconds: float
    """Mean wall time per batch: over the window's batches, the worker's first batch left out
    (``WorkerStats.window_fetch_seconds``), or its moving average where the window has none."""
    cpu_seconds: float
    """Mean CPU time per batch (the same batches)."""
    batches: int
    """Batches it has ever delivered."""
    run_delay_seconds: float | None = None
    """Mean time per batch it waited, runnable, for a CPU, over the window's batches (Linux
    schedstat); ``None``: unknown."""
    window_batches: int | None = None
    """Batches in the window the means are over; 0: none (the means are then its moving
    average, as old as its last batch); ``None``: unknown (a loader older than the field)."""

    @property
    def in_window(self) -> bool:
        """Whether it delivered a batch in the window (unknown: whether it ever did)."""
        return bool(self.batches if self.window_batches is None else self.window_batches)

    @classmethod
    def from_stats(cls, w: Any) -> WorkerReport:
        """From a loader's ``dloader.WorkerStats``."""
        if w.window_batches:
            return cls(
                w.pid or 0,
                w.window_fetch_seconds,
                w.window_cpu_seconds,
                w.batches,
                w.window_run_delay_seconds,
                w.window_batches,
            )
        return cls(w.pid or 0, w.fetch_seconds, w.cpu_seconds, w.batches, window_batches=0)

    @classmethod
    def from_pb(cls, m: Any) -> WorkerReport:
        """From a ``dloader.v1.WorkerReport``."""
        delay = m.run_delay_seconds if m.HasField("run_delay_seconds") else None
        window = m.window_batches if m.HasField("window_batches") else None
        return cls(m.pid, m.fetch_seconds, m.cpu_seconds, m.batches, delay, window)


@dataclass(frozen=True)
class JobReport:
    """One loader's telemetry over a recent window (``dloader.LoaderStats``, as sent)."""

    timestamp: float
    num_workers: int
    batch_size: int
    samples_per_second: float
    idle_share: float
    step_seconds: float
    wait_seconds: float
    window_seconds: float
    samples: int
    workers: tuple[WorkerReport, ...] = ()
    done: float = 0.0
    """The share of its declared epochs done (``DataLoader(epochs=N)``; 0: none declared)."""

    @classmethod
    def from_stats(cls, stats: Any, timestamp: float) -> JobReport:
        """From a loader's ``dloader.LoaderStats`` (whose fields carry the same names; this
        module imports nothing of the loader's, so it takes the object as it is)."""
        own = ("timestamp", "batch_size", "workers", "done")
        names = [f.name for f in fields(cls) if f.name not in own]
        return cls(
            timestamp=timestamp,
            batch_size=stats.batch_size or 1,
            done=stats.done or 0.0,
            workers=tuple(WorkerReport.from_stats(w) for w in stats.workers if not w.remote),
            **{name: getattr(stats, name) for name in names},
        )

    def to_json(self) -> dict[str, Any]:
        """As a JSON-compatible dict (the agent -> helper pipe, the sidecar's store; built
        field by field: ``asdict`` deep-copies, and the sidecar stores every report)."""
        d = {f.name: getattr(self, f.name) for f in _REPORT_FIELDS}
        d["workers"] = [dict(vars(w)) for w in self.workers]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobReport:
        """From :meth:`to_json` output."""
        d = dict(d)
        d["workers"] = tuple(WorkerReport(**w) for w in d.get("workers", ()))
        return cls(**d)

    def to_pb(self, job_id: str, token: str) -> Any:
        """As a ``dloader.v1.JobReport`` of ``job_id``."""
        pb = _pb()
        d = asdict(self)
        d["workers"] = [
            pb.WorkerReport(**{k: v for k, v in w.items() if v is not None}) for w in d["workers"]
        ]
        return pb.JobReport(job_id=job_id, token=token, **d)

    @classmethod
    def from_pb(cls, m: Any) -> JobReport:
        """From a ``dloader.v1.JobReport`` (its job id and token are the servicer's to check)."""
        return cls(
            timestamp=m.timestamp,
            num_workers=m.num_workers,
            batch_size=m.batch_size,
            samples_per_second=m.samples_per_second,
            idle_share=m.idle_share,
            step_seconds=m.step_seconds,
            wait_seconds=m.wait_seconds,
            window_seconds=m.window_seconds,
            samples=m.samples,
            workers=tuple(WorkerReport.from_pb(w) for w in m.workers),
            done=m.done,
        )


_REPORT_FIELDS = [f for f in fields(JobReport) if f.name != "workers"]


@dataclass(frozen=True)
class Registration:
    """A job joining a sidecar."""

    name: str
    pids: tuple[int, ...]
    num_workers: int
    batch_size: int
    limits: JobLimits = field(default_factory=JobLimits)
    gpus: tuple[int, ...] = ()
    job_key: str = ""
    """``DLOADER_JOB_KEY`` (dloader-launch sets it): ties the job to its allocator job."""

    def to_json(self) -> dict[str, Any]:
        """As a JSON-compatible dict (the agent -> helper pipe)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Registration:
        """From :meth:`to_json` output."""
        d = dict(d)
        d["pids"] = tuple(d.get("pids", ()))
        d["gpus"] = tuple(d.get("gpus", ()))
        d["limits"] = JobLimits.from_json(d.get("limits", {}))
        return cls(**d)

    def to_pb(self) -> Any:
        """As a ``dloader.v1.RegisterJobRequest``."""
        return _pb().RegisterJobRequest(
            name=self.name,
            pids=list(self.pids),
            gpus=list(self.gpus),
            num_workers=self.num_workers,
            batch_size=self.batch_size,
            limits=self.limits.to_pb(),
            job_key=self.job_key,
        )

    @classmethod
    def from_pb(cls, m: Any) -> Registration:
        """From a ``dloader.v1.RegisterJobRequest``."""
        return cls(
            name=m.name,
            pids=tuple(m.pids),
            gpus=tuple(m.gpus),
            num_workers=m.num_workers,
            batch_size=m.batch_size,
            limits=JobLimits.from_pb(m.limits),
            job_key=m.job_key,
        )


def fit_remote(
    pool: int, lent: Mapping[str, int], most: int
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Remote workers within ``most`` in all: the CPU pool's (``pool``) first, then each lending
    node's (``lent``, by node id) in node-id order; a count below 0 counts 0, and a node left
    with none is dropped. As :attr:`Directive.remote_workers` and :attr:`Directive.remote_lent`
    carry them."""
    n = min(max(pool, 0), most)
    room, on = most - n, []
    for node, k in sorted(lent.items()):
        k = min(max(k, 0), room)
        room -= k
        if k:
            on.append((node, k))
    return n, tuple(on)


@dataclass(frozen=True)
class Directive:
    """What the sidecar tells a job to run with."""

    num_workers: int
    batch_size: int = 0
    """0: unchanged."""
    cpus: tuple[int, ...] = ()
    """CPU set for the loader workers; empty: unchanged."""
    reason: str = ""
    revision: int = 0
    remote_workers: int | None = None
    """Remote (Ray) loader workers; None: unchanged (the sidecar directs them only for the
    cluster allocator's CPU pool)."""
    worker_nice: int | None = None
    """The nice value (1-19) the job's local loader workers run at, so that every job's
    training process, at its own, comes before every job's workers for a core; None:
    unchanged."""
    tune_up_to: int | None = None
    """The guided policy: the job's own tuner chooses its count within ``[its minimum,
    tune_up_to]`` (``num_workers`` then only applies to a loader that cannot tune itself, e.g.
    an iterable dataset's); None: the sidecar sets the count."""
    remote_lent: tuple[tuple[str, int], ...] = ()
    """With ``remote_workers``: more remote workers, on nodes that lend the job their spare
    cores, as ``(node id, workers)`` sorted by node id (the cluster allocator's lending)."""

    def __post_init__(self) -> None:
        if self.worker_nice is not None and not 1 <= self.worker_nice <= MAX_NICE:
            raise ValueError(f"worker_nice={self.worker_nice}: expected 1..{MAX_NICE} or none")
        if self.tune_up_to is not None and self.tune_up_to < 1:
            raise ValueError(f"tune_up_to={self.tune_up_to}: expected >= 1 or none")

    def to_json(self) -> dict[str, Any]:
        """As a JSON-compatible dict (the helper -> agent pipe)."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Directive:
        """From :meth:`to_json` output."""
        d = dict(d)
        d["cpus"] = tuple(d.get("cpus", ()))
        d["remote_lent"] = tuple((str(node), int(n)) for node, n in d.get("remote_lent", ()))
        return cls(**d)

    def to_pb(self, job_id: str) -> Any:
        """As a ``dloader.v1.Directive`` for ``job_id``."""
        fields = {**asdict(self), "cpus": list(self.cpus), "remote_lent": dict(self.remote_lent)}
        for name in ("remote_workers", "worker_nice", "tune_up_to"):
            if fields[name] is None:
                del fields[name]
        return _pb().Directive(job_id=job_id, **fields)

    @classmethod
    def from_pb(cls, m: Any) -> Directive:
        """From a ``dloader.v1.Directive``."""
        remote = m.remote_workers if m.HasField("remote_workers") else None
        nice = m.worker_nice if m.HasField("worker_nice") else None
        up_to = m.tune_up_to if m.HasField("tune_up_to") else None
        lent = tuple(sorted(m.remote_lent.items()))
        return cls(
            m.num_workers,
            m.batch_size,
            tuple(m.cpus),
            m.reason,
            m.revision,
            remote,
            nice,
            up_to,
            lent,
        )
