"""A submitted job in the live allocator: its spec, its fitted model, and the policy's view of it.

Model fitting is CPU work (a least-squares fit over up to :data:`MAX_MEASUREMENTS` steps): the
servicer runs :func:`fit_model` off the event loop. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dloader._shared.allocator_messages import MAX_BATCH, GradientStats, JobSpec, check_scaling
from dloader.allocator.optimizer import Cluster
from dloader.allocator.policies import JobState, Policy
from dloader.allocator.store import Service
from dloader.errors import InvalidArgument, finite_within
from dloader.predictor import (
    GradientNoise,
    InputModel,
    PredictorError,
    ScalingModel,
    ScalingParams,
    ScalingPoint,
)

__all__ = [
    "MAX_MEASUREMENTS",
    "SubmittedJob",
    "fit_model",
    "gradient_noise",
    "unusable",
]

MAX_MEASUREMENTS = 2000  # kept per job; the oldest are dropped beyond
GRADIENT_RANGE = (1e-30, 1e30)


def fit_model(spec: JobSpec) -> ScalingModel:
    """The job's scaling model: learned from its measurements (>= 1) as the simulator learns
    online (:meth:`ScalingModel.fit_observed`), else its stated parameters."""
    try:
        points = [
            ScalingPoint(
                m.nodes, m.replicas, m.local_batch_size, m.step_seconds, m.sync_seconds or None
            )
            for m in spec.measurements
        ]
    except PredictorError as exc:
        raise InvalidArgument("job.measurements", str(exc)) from None
    if points:
        try:
            return ScalingModel.fit_observed(points)
        except (PredictorError, ValueError) as exc:
            raise InvalidArgument("job.measurements", f"cannot fit a model: {exc}") from None
    if spec.scaling:
        check_scaling(spec.scaling)
        return ScalingModel(ScalingParams(**spec.scaling))
    raise InvalidArgument(
        "job.scaling", "need scaling parameters or at least 1 measurement to predict throughput"
    )


def gradient_noise(gradient: GradientStats | None, where: str) -> GradientNoise | None:
    """The statistical-efficiency model of the job's gradient statistics (None: none sent)."""
    if gradient is None:
        return None
    finite_within(f"{where}.base_batch_size", gradient.base_batch_size, 1, MAX_BATCH)
    finite_within(f"{where}.grad_sqr", gradient.grad_sqr, *GRADIENT_RANGE)
    if gradient.grad_var != 0:
        finite_within(f"{where}.grad_var", gradient.grad_var, *GRADIENT_RANGE)
    try:
        return GradientNoise(gradient.base_batch_size, gradient.grad_sqr, gradient.grad_var)
    except PredictorError as exc:
        raise InvalidArgument(where, str(exc)) from None


@dataclass
class SubmittedJob:
    """A job the allocator holds: what was submitted, what it learned, where the job runs."""

    spec: JobSpec
    """As submitted (normalised), with every measurement received since."""
    seq: int
    """Submission order (the policy decides in this order)."""
    model: ScalingModel
    noise: GradientNoise | None
    token: str = ""
    """The job's credential, returned at submission."""
    placement: dict[str, int] = field(default_factory=dict)
    """GPUs per node id (empty: waiting)."""
    batch_size: int = 0
    samples_per_second: float = 0.0
    generation: int = 0
    """How many times its placement changed: its launchers restart into each new one."""
    rendezvous: str = ""
    """``host:port`` of the c10d rendezvous of the current generation while it spans nodes."""
    submitted_at: float = 0.0
    """Clock time of its submission (stored: a restarted allocator keeps the job's age)."""
    owner: str = ""
    """Who submitted it: ``uid N`` (a local user), the role of a TCP token, or "" (an
    operator); per-caller caps count it."""
    input: InputModel | None = field(default=None, repr=False)
    """Its input pipeline on ``c`` cores as a node last reported it (None: none reported)."""
    cores: dict[str, float] = field(default_factory=dict)
    """Its cores per node id, where the nodes' cores are limited (the policy's last word)."""
    remote_max: dict[str, float] = field(default_factory=dict)
    """Per node id: the most CPU-pool cores its loaders there can use (their reports)."""
    remote_cpus: float = 0.0
    """Its cores of the CPU pool (the policy's last word), lent ones included."""
    lent_cpus: dict[str, float] = field(default_factory=dict)
    """Of those, the cores other nodes lend it, by node id (``goodput-dp-lend``)."""
    attained_gpu_s: float = 0.0
    """GPU-seconds it has held, counted at each decision (:meth:`count_service`; stored with
    the decision, :meth:`service`: a restarted allocator goes on from there)."""
    counted_at: float | None = None
    """The clock time its GPU-seconds were last counted (None: not yet)."""
    done: float | None = None
    """The share of its declared work done, as it last reported (UpdateJob ``done``, or its
    nodes' reports; None: never reported; stored, as :attr:`attained_gpu_s`)."""
    done_origin: tuple[float, float] = (0.0, 0.0)
    """(GPU-seconds, share done) at its first report of a share done (``JobState.done_origin``:
    it may have resumed from a checkpoint, or this service restarted)."""

    def report_done(self, done: float) -> None:
        """Takes the share of its declared work done (checked by the caller)."""
        if self.done is None:
            self.done_origin = (self.attained_gpu_s, done)
        self.done = done

    def count_service(self, now: float) -> None:
        """Adds the GPU-seconds of its placement since the last count (the ``las`` admission
        and ``pollux`` serve the least served first)."""
        if self.counted_at is None:
            self.counted_at = now
        elif now > self.counted_at:  # a clock that steps back counts nothing, nor twice
            self.attained_gpu_s += sum(self.placement.values()) * (now - self.counted_at)
            self.counted_at = now

    def service(self) -> Service:
        """What it has had and done, as stored (:meth:`restore_service` takes it back)."""
        return Service(
            self.job_id, self.attained_gpu_s, self.counted_at, self.done, self.done_origin
        )

    def restore_service(self, s: Service) -> None:
        """Takes back a stored :meth:`service`: the time since ``counted_at`` (the allocator
        down, its allocations kept) is counted at the next decision, at the stored placement."""
        self.attained_gpu_s, self.counted_at = s.attained_gpu_s, s.counted_at
        self.done, self.done_origin = s.done, s.done_origin

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def state(self, node_ids: list[str], now: float) -> JobState:
        """The policy's view of the job on the nodes ``node_ids`` (in that order) at ``now``."""
        r = self.spec
        return JobState(
            r.job_id,
            float(self.seq),
            self.model,
            requested_gpus=r.requested_gpus,
            requested_batch=r.batch_size,
            batch_range=(r.min_batch_size, r.max_batch_size),
            local_bsz_range=(r.min_local_batch_size, r.max_local_batch_size),
            min_gpus=r.min_gpus,
            max_gpus=r.max_gpus,
            noise=self.noise,
            priority=r.priority,
            placement=tuple(self.placement.get(n, 0) for n in node_ids) if self.placement else (),
            batch_size=self.batch_size or None,
            restart_s=r.restart_seconds,
            age_s=max(now - self.submitted_at, 0.0),
            restarts=max(self.generation - 1, 0),
            # a model learned from measurements is trusted up to twice the GPUs they cover
            explored_gpus=max(m.replicas for m in r.measurements) if r.measurements else None,
            explored_nodes=max(m.nodes for m in r.measurements) if r.measurements else None,
            input=self.input or (InputModel.of(r.input_curve) if r.input_curve else None),
            remote_max=sum(self.remote_max.get(n, 0.0) for n in self.placement),
            attained_gpu_s=self.attained_gpu_s,
            done=self.done,
            done_origin=self.done_origin,
        )


def unusable(policy: Policy, state: JobState, cluster: Cluster | None = None) -> str | None:
    """Why ``policy`` cannot decide for the job alone (None: it can), on ``cluster`` (the one
    being decided, cores included) or, without one, on its minimum GPUs. Any exception counts:
    a job the policy cannot place is set aside whatever the reason, never the cluster's
    decision with it."""
    if cluster is None:
        need = max(state.min_gpus, 1)
        cluster = Cluster((need,)) if need <= 64 else Cluster.uniform(-(-need // 8), 8)
    try:
        policy.decide([replace(state, placement=(), batch_size=None)], cluster)
    except Exception as exc:  # whatever the policy raised, the job is the cause
        return str(exc) or type(exc).__name__
    return None
