"""The messages of the cluster allocator's API (``proto/dloader/v1/allocator.proto``), typed.

Each class is the Python form of the message of the same name, with the same field names, and
one conversion per transport: ``to_pb``/``from_pb`` for gRPC, ``to_json``/``from_json`` for
the allocator's state file. The servicer converts a request once, on arrival; the core, the
launcher and the sidecar's allocator link see only these classes. The limits the API accepts
(:data:`MAX_GPUS`, ...) live here too, and the checks that need nothing but the message itself
(a measurement's ranges; a job's fields, :meth:`JobSpec.normalised`).

No gRPC or protobuf at import: ``to_pb``/``from_pb`` import the generated messages when first
called.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dloader.errors import InvalidArgument, finite_within, shown

if TYPE_CHECKING:
    from dloader.v1 import allocator_pb2

__all__ = [
    "ID_MAX",
    "MAX_BATCH",
    "MAX_CORES",
    "MAX_GAMMA",
    "MAX_GPUS",
    "MAX_INPUT_POINTS",
    "MAX_INPUT_RATE",
    "MAX_JOBS_PER_REPORT",
    "MAX_MEASUREMENTS_PER_CALL",
    "MAX_PRIORITY",
    "MAX_SCALING_PARAM",
    "MIN_CORES",
    "MIN_INPUT_RATE",
    "SCALING_FIELDS",
    "Allocation",
    "AllocationSet",
    "GradientStats",
    "InputCurve",
    "JobSpec",
    "Measurement",
    "NodeJobReport",
    "check_input_curve",
    "check_scaling",
    "job_key",
    "key_digest",
    "split_batch",
]

ID_MAX = 200  # characters of a job or node id
MAX_GPUS = 1 << 16  # per job and per cluster
MAX_BATCH = 1 << 24  # samples per global or local batch
MAX_PRIORITY = 1000.0
MAX_MEASUREMENTS_PER_CALL = 1000
MAX_JOBS_PER_REPORT = 1024
MAX_CORES = 4096.0  # per node, and per point of an input curve
MIN_CORES = 1e-3  # of a point of an input curve
MAX_INPUT_RATE = 1e9  # samples/s of an input curve's point
#: Samples/s of an input curve's point at the least: a pipeline slower than one sample in
#: 1,000 s is no pipeline, and a rate near zero (5e-324 at 4,096 cores) once made every
#: decision fail ("predicted throughput is 0") or divide by zero.
MIN_INPUT_RATE = 1e-3
MAX_INPUT_POINTS = 16  # points of an input curve (= dloader.predictor.MAX_INPUT_POINTS)
#: The fields of ``ScalingParams`` (the scaling model's parameters).
SCALING_FIELDS = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
MAX_SCALING_PARAM = 1e6  # seconds (per step, per sample): far beyond any real job
MAX_GAMMA = 10.0  # the scaling model's overlap exponent lies in [1, MAX_GAMMA]


def check_scaling(scaling: Mapping[str, float]) -> None:
    """Stated scaling parameters: exactly the :data:`SCALING_FIELDS`, each finite, ``gamma``
    within ``[1, MAX_GAMMA]`` and the others within ``[0, MAX_SCALING_PARAM]``, with a compute
    time (``alpha_c + beta_c > 0``); else ``INVALID_ARGUMENT`` naming the field."""
    unknown = sorted(set(scaling) - set(SCALING_FIELDS))
    missing = [f for f in SCALING_FIELDS if f not in scaling]
    if unknown or missing:
        raise InvalidArgument(
            "job.scaling",
            f"unknown {unknown}, missing {missing}: expected {', '.join(SCALING_FIELDS)}",
        )
    for name in SCALING_FIELDS:
        if name == "gamma":
            finite_within("job.scaling.gamma", scaling[name], 1.0, MAX_GAMMA)
        else:
            finite_within(f"job.scaling.{name}", scaling[name], 0.0, MAX_SCALING_PARAM)
    if scaling["alpha_c"] + scaling["beta_c"] <= 0:
        raise InvalidArgument("job.scaling", "alpha_c + beta_c must be > 0 (compute time)")


def _pb() -> Any:
    from dloader.v1 import allocator_pb2

    return allocator_pb2


def check_id(name: str, value: str) -> str:
    """``value`` as a job or node id: 1-:data:`ID_MAX` printable characters, no outer spaces."""
    if not value or len(value) > ID_MAX or not value.isprintable() or value.strip() != value:
        raise InvalidArgument(name, f"{shown(value)} must be 1-{ID_MAX} printable characters")
    return value


@dataclass(frozen=True)
class Measurement:
    """One measured step of a job: ``step_seconds`` on ``replicas`` GPUs over ``nodes`` nodes at
    ``local_batch_size`` per GPU. Checked on creation (``INVALID_ARGUMENT`` naming the values)."""

    nodes: int
    replicas: int
    local_batch_size: int
    step_seconds: float
    sync_seconds: float = 0.0
    """The gradient-synchronisation part of ``step_seconds`` (0: unknown)."""

    def __post_init__(self) -> None:
        n, r, b = self.nodes, self.replicas, self.local_batch_size
        if not 1 <= n <= r <= MAX_GPUS or not 1 <= b <= MAX_BATCH:
            raise InvalidArgument(
                "measurements",
                f"nodes={n}, replicas={r}, local_batch_size={b}: need 1 <= nodes <= "
                f"replicas <= {MAX_GPUS} and 1 <= local_batch_size <= {MAX_BATCH}",
            )
        step, sync = self.step_seconds, self.sync_seconds
        if not (
            math.isfinite(step) and 0 < step <= 86400 and math.isfinite(sync) and 0 <= sync <= step
        ):
            raise InvalidArgument(
                "measurements",
                f"step_seconds={step}, sync_seconds={sync}: need 0 < step <= 86400 and "
                "0 <= sync <= step",
            )

    def to_pb(self) -> allocator_pb2.Measurement:
        """As a ``dloader.v1.Measurement``."""
        return _pb().Measurement(**asdict(self))

    @classmethod
    def from_pb(cls, m: allocator_pb2.Measurement) -> Measurement:
        """From a ``dloader.v1.Measurement``."""
        return cls(m.nodes, m.replicas, m.local_batch_size, m.step_seconds, m.sync_seconds)

    @classmethod
    def many_from_pb(cls, items: Sequence[allocator_pb2.Measurement]) -> tuple[Measurement, ...]:
        """A repeated field, refused whole (before any is converted) past
        :data:`MAX_MEASUREMENTS_PER_CALL`."""
        if len(items) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "measurements", f"{len(items)} measurements: at most {MAX_MEASUREMENTS_PER_CALL}"
            )
        return tuple(cls.from_pb(m) for m in items)


@dataclass(frozen=True)
class GradientStats:
    """Gradient-noise statistics of a job, measured at ``base_batch_size``."""

    base_batch_size: int
    grad_sqr: float
    grad_var: float

    def to_pb(self) -> allocator_pb2.GradientStats:
        """As a ``dloader.v1.GradientStats``."""
        return _pb().GradientStats(**asdict(self))

    @classmethod
    def from_pb(cls, m: Any, present: bool = True) -> GradientStats | None:
        """From a ``dloader.v1.GradientStats`` field (None where the message lacks it)."""
        return cls(m.base_batch_size, m.grad_sqr, m.grad_var) if present else None


def _gradient_of(m: Any) -> GradientStats | None:
    return GradientStats.from_pb(m.gradient, m.HasField("gradient"))


InputCurve = tuple[tuple[float, float], ...]
"""A job's input pipeline: ``(cores, samples/s)`` points, cores increasing (``InputPoint``)."""


def check_input_curve(name: str, points: Sequence[tuple[float, float]]) -> InputCurve:
    """``points`` as an input curve: at most :data:`MAX_INPUT_POINTS`, each with cores in
    ``[MIN_CORES, MAX_CORES]`` and samples/s in ``[MIN_INPUT_RATE, MAX_INPUT_RATE]``, cores
    increasing; else ``INVALID_ARGUMENT`` naming ``name`` (the whole list refused before any
    point is read)."""
    if len(points) > MAX_INPUT_POINTS:
        raise InvalidArgument(name, f"{len(points)} points: at most {MAX_INPUT_POINTS}")
    out: list[tuple[float, float]] = []
    for i, (cores, rate) in enumerate(points):
        c = finite_within(f"{name}[{i}].cores", cores, MIN_CORES, MAX_CORES)
        r = finite_within(f"{name}[{i}].samples_per_second", rate, MIN_INPUT_RATE, MAX_INPUT_RATE)
        if out and c <= out[-1][0]:
            raise InvalidArgument(name, f"point {i}: cores {c} must exceed the point before's")
        out.append((c, r))
    return tuple(out)


def _curve_pb(curve: InputCurve) -> list[Any]:
    return [_pb().InputPoint(cores=c, samples_per_second=r) for c, r in curve]


def _curve_of(items: Sequence[Any], name: str) -> InputCurve:
    if len(items) > MAX_INPUT_POINTS:  # refused before any is converted
        raise InvalidArgument(name, f"{len(items)} points: at most {MAX_INPUT_POINTS}")
    return check_input_curve(name, [(p.cores, p.samples_per_second) for p in items])


@dataclass(frozen=True)
class NodeJobReport:
    """A node's report of one job running on it."""

    job_id: str
    samples_per_second: float
    batch_size: int = 0
    measurements: tuple[Measurement, ...] = ()
    gradient: GradientStats | None = None
    input_curve: InputCurve = ()
    """The node's model of the job's input pipeline there (empty: none yet)."""
    remote_cores_max: float = 0.0
    """The most CPU-pool cores the job's loaders on the node can use (0: none)."""
    done: float = 0.0
    """The share of its declared epochs done, as its loaders there report it (0: none)."""

    def to_pb(self) -> allocator_pb2.NodeJobReport:
        """As a ``dloader.v1.NodeJobReport``."""
        return _pb().NodeJobReport(
            job_id=self.job_id,
            samples_per_second=self.samples_per_second,
            batch_size=self.batch_size,
            measurements=[m.to_pb() for m in self.measurements],
            gradient=self.gradient.to_pb() if self.gradient else None,
            input_curve=_curve_pb(self.input_curve),
            remote_cores_max=self.remote_cores_max,
            done=self.done,
        )

    @classmethod
    def from_pb(cls, m: allocator_pb2.NodeJobReport) -> NodeJobReport:
        """From a ``dloader.v1.NodeJobReport`` (the input curve checked)."""
        return cls(
            m.job_id,
            m.samples_per_second,
            m.batch_size,
            Measurement.many_from_pb(m.measurements),
            _gradient_of(m),
            _curve_of(m.input_curve, "jobs.input_curve"),
            finite_within("jobs.remote_cores_max", m.remote_cores_max, 0.0, MAX_CORES),
            finite_within("jobs.done", m.done, 0.0, 1.0),
        )


@dataclass(frozen=True)
class JobSpec:
    """A job as submitted (``dloader.v1.JobSpec``): 0 means "the default" for every bound, as
    in the proto; :meth:`normalised` fills the defaults in and checks every field."""

    job_id: str
    batch_size: int
    min_gpus: int = 0
    max_gpus: int = 0
    requested_gpus: int = 0
    min_batch_size: int = 0
    max_batch_size: int = 0
    min_local_batch_size: int = 0
    max_local_batch_size: int = 0
    priority: float = 0.0
    restart_seconds: float = 0.0
    scaling: Mapping[str, float] | None = None
    """``ScalingParams`` by field name (:data:`SCALING_FIELDS`), or None."""
    measurements: tuple[Measurement, ...] = ()
    gradient: GradientStats | None = None
    input_curve: InputCurve = ()
    """Its input pipeline on ``c`` cores, if known at submission (an earlier run's)."""

    def normalised(self, default_restart_seconds: float) -> JobSpec:
        """Defaults filled in and every field checked (errors name the field)."""
        check_id("job.job_id", self.job_id)
        for name in ("batch_size", "min_batch_size", "max_batch_size"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_BATCH)
        for name in ("min_local_batch_size", "max_local_batch_size"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_BATCH)
        for name in ("min_gpus", "max_gpus", "requested_gpus"):
            finite_within(f"job.{name}", getattr(self, name), 0, MAX_GPUS)
        if len(self.measurements) > MAX_MEASUREMENTS_PER_CALL:
            raise InvalidArgument(
                "job.measurements",
                f"{len(self.measurements)} measurements: at most {MAX_MEASUREMENTS_PER_CALL} "
                "per call (send more with UpdateJob)",
            )
        if self.batch_size < 1:
            raise InvalidArgument("job.batch_size", f"{self.batch_size} must be >= 1")
        lo_g = self.min_gpus or 1
        hi_g = self.max_gpus or MAX_GPUS
        if lo_g > hi_g:
            raise InvalidArgument("job.min_gpus", f"{lo_g} is above max_gpus={hi_g}")
        lo_b = self.min_batch_size or self.batch_size
        hi_b = self.max_batch_size or self.batch_size
        if not lo_b <= self.batch_size <= hi_b:
            raise InvalidArgument(
                "job.batch_size",
                f"{self.batch_size} must lie within [min_batch_size={lo_b}, max_batch_size={hi_b}]",
            )
        lo_l = self.min_local_batch_size or 1
        hi_l = self.max_local_batch_size or hi_b
        if lo_l > hi_l:
            raise InvalidArgument(
                "job.min_local_batch_size", f"{lo_l} is above max_local_batch_size={hi_l}"
            )
        prio = self.priority or 1.0
        finite_within("job.priority", prio, 1e-3, MAX_PRIORITY)
        restart = self.restart_seconds or default_restart_seconds
        finite_within("job.restart_seconds", restart, 0, 86400)
        check_input_curve("job.input_curve", self.input_curve)
        if self.scaling:
            check_scaling(self.scaling)
        return replace(
            self,
            min_gpus=lo_g,
            max_gpus=hi_g,
            requested_gpus=min(max(self.requested_gpus or lo_g, lo_g), hi_g),
            min_batch_size=lo_b,
            max_batch_size=hi_b,
            min_local_batch_size=lo_l,
            max_local_batch_size=hi_l,
            priority=prio,
            restart_seconds=restart,
        )

    def to_pb(self) -> allocator_pb2.JobSpec:
        """As a ``dloader.v1.JobSpec``."""
        pb = _pb()
        d = asdict(self)
        d["measurements"] = [m.to_pb() for m in self.measurements]
        d["gradient"] = self.gradient.to_pb() if self.gradient else None
        d["scaling"] = pb.ScalingParams(**self.scaling) if self.scaling else None
        d["input_curve"] = _curve_pb(self.input_curve)
        return pb.JobSpec(**d)

    @classmethod
    def from_pb(cls, m: allocator_pb2.JobSpec) -> JobSpec:
        """From a ``dloader.v1.JobSpec``."""
        scaling = None
        if m.HasField("scaling"):
            scaling = {name: getattr(m.scaling, name) for name in SCALING_FIELDS}
        return cls(
            job_id=m.job_id,
            batch_size=m.batch_size,
            min_gpus=m.min_gpus,
            max_gpus=m.max_gpus,
            requested_gpus=m.requested_gpus,
            min_batch_size=m.min_batch_size,
            max_batch_size=m.max_batch_size,
            min_local_batch_size=m.min_local_batch_size,
            max_local_batch_size=m.max_local_batch_size,
            priority=m.priority,
            restart_seconds=m.restart_seconds,
            scaling=scaling,
            measurements=Measurement.many_from_pb(m.measurements),
            gradient=_gradient_of(m),
            input_curve=_curve_of(m.input_curve, "job.input_curve"),
        )

    def to_json(self) -> bytes:
        """As stored in the allocator's state file."""
        d = asdict(self)
        d["scaling"] = dict(self.scaling) if self.scaling else None
        return json.dumps(d).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> JobSpec:
        """From :meth:`to_json`."""
        d = json.loads(raw)
        d["measurements"] = tuple(Measurement(**m) for m in d.get("measurements", ()))
        g = d.get("gradient")
        d["gradient"] = GradientStats(**g) if g is not None else None
        d["input_curve"] = tuple((float(c), float(r)) for c, r in d.get("input_curve", ()))
        return cls(**d)


@dataclass(frozen=True)
class Allocation:
    """One job's allocation (or, in dry-run mode, recommendation)."""

    job_id: str
    gpus: int
    """0: waiting."""
    nodes: Mapping[str, int]
    """GPUs per node id."""
    batch_size: int
    """Global batch size."""
    reason: str
    queue_position: int = 0
    """For a waiting job, 0-based."""
    rendezvous: str = ""
    """``host:port`` of the job's c10d rendezvous while it spans nodes."""
    generation: int = 0
    """Rises whenever the job's placement changes."""
    cpus: Mapping[str, float] = field(default_factory=dict)
    """Its cores per node id, where the nodes' cores are limited (empty: not limited)."""
    local_batch_size: int = 0
    """Each process's batch (0: waiting): what its loaders run with, as given (no enactor
    computes it again)."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: ``batch_size`` is about ``gpus x local_batch_size x
    accumulation_steps`` (:func:`split_batch`)."""
    key_digest: str = ""
    """:func:`key_digest` of the job's key: what a node's sidecar ties its local jobs to."""
    remote_cpus: float = 0.0
    """Cores of the cluster's CPU pool for its remote loader workers (0: none)."""
    done: float = 0.0
    """The share of its declared work done when this was decided (0: none declared or done)."""
    lent_cpus: Mapping[str, float] = field(default_factory=dict)
    """Of ``remote_cpus``: the cores other nodes lend it, by node id (``goodput-dp-lend``: its
    remote workers there; the rest are the CPU pool's)."""

    def to_pb(self) -> allocator_pb2.Allocation:
        """As a ``dloader.v1.Allocation``."""
        pb = _pb()
        d = asdict(self)
        del d["cpus"]
        d["nodes"] = [
            pb.NodeShare(node_id=n, gpus=g, cpus=self.cpus.get(n, 0.0))
            for n, g in sorted(self.nodes.items())
        ]
        return pb.Allocation(**d)

    @classmethod
    def from_pb(cls, m: allocator_pb2.Allocation) -> Allocation:
        """From a ``dloader.v1.Allocation``."""
        return cls(
            m.job_id,
            m.gpus,
            {n.node_id: n.gpus for n in m.nodes},
            m.batch_size,
            m.reason,
            m.queue_position,
            m.rendezvous,
            m.generation,
            {n.node_id: n.cpus for n in m.nodes if n.cpus > 0},
            m.local_batch_size,
            max(m.accumulation_steps, 1),
            m.key_digest,
            m.remote_cpus,
            m.done,
            dict(m.lent_cpus),
        )


def split_batch(batch_size: int, gpus: int, max_local: int = 0) -> tuple[int, int]:
    """``(local batch, accumulation steps)`` of a global ``batch_size`` over ``gpus``
    processes: the fewest micro-batches of at most ``max_local`` samples each (0: no limit), as
    the policies' throughput model splits it; ``(0, 1)`` for no GPUs."""
    if gpus < 1 or batch_size < 1:
        return 0, 1
    per = batch_size / gpus
    steps = max(math.ceil(per / max_local - 1e-9), 1) if max_local > 0 else 1
    return max(batch_size // (gpus * steps), 1), steps


_KEY_PREFIX = b"dloader job key\0"


def job_key(token: str) -> str:
    """The job's key, which ``dloader-launch`` gives its training script (``DLOADER_JOB_KEY``)
    and the script's loaders give their node's sidecar: derived from the job's token, and not
    the token (a holder of the key cannot act on the job at the allocator)."""
    return hashlib.sha256(_KEY_PREFIX + token.encode()).hexdigest()


def key_digest(key: str) -> str:
    """What the allocator publishes of a job's key (in every ``Allocation``): its SHA-256. A
    sidecar matches a local job whose key has this digest; a reader of allocations learns
    neither key nor token ("" for no key)."""
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


@dataclass(frozen=True)
class AllocationSet:
    """Every job's allocation after one decision."""

    version: int
    """Rises with every decision."""
    dry_run: bool
    """Recommendations only: nothing was applied."""
    policy: str
    allocations: tuple[Allocation, ...] = field(default_factory=tuple)
    decided_at: float = 0.0
    """Seconds since the epoch."""
    decision_ms: float = 0.0
    """The policy's wall time."""

    def get(self, job_id: str) -> Allocation | None:
        """The allocation of ``job_id`` (None: not in this set)."""
        return next((a for a in self.allocations if a.job_id == job_id), None)

    def to_pb(self, job_id: str = "", node_id: str = "") -> allocator_pb2.AllocationSet:
        """As a ``dloader.v1.AllocationSet``, optionally only one job's or one node's
        allocations (a node's: those of its jobs, and of the jobs it lends cores to)."""
        return _pb().AllocationSet(
            version=self.version,
            dry_run=self.dry_run,
            policy=self.policy,
            allocations=[
                a.to_pb()
                for a in self.allocations
                if (not job_id or a.job_id == job_id)
                and (not node_id or node_id in a.nodes or node_id in a.lent_cpus)
            ],
            decided_at=self.decided_at,
            decision_ms=self.decision_ms,
        )

    @classmethod
    def from_pb(cls, m: allocator_pb2.AllocationSet) -> AllocationSet:
        """From a ``dloader.v1.AllocationSet``."""
        return cls(
            m.version,
            m.dry_run,
            m.policy,
            tuple(Allocation.from_pb(a) for a in m.allocations),
            m.decided_at,
            m.decision_ms,
        )
