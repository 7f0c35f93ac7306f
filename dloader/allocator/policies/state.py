"""What a cluster policy sees and answers: a job's state, the decision, the policy's interface."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dloader.allocator.optimizer import DEFAULT_RESTART_S, Cluster
from dloader.errors import AllocatorError
from dloader.predictor import GradientNoise, InputModel, ScalingModel

__all__ = [
    "ClusterDecision",
    "JobState",
    "Policy",
    "held_placements",
]


@dataclass(frozen=True)
class JobState:
    """A job as the policies see it: its limits, its models and what it runs on now."""

    job_id: str
    arrival: float
    """Submission time in seconds (orders the queue)."""
    model: ScalingModel = field(repr=False)
    requested_gpus: int
    requested_batch: int
    batch_range: tuple[int, int]
    """Smallest and largest global batch size the job accepts."""
    local_bsz_range: tuple[int, int]
    """Smallest and largest per-GPU batch; above the largest, gradients are accumulated."""
    min_gpus: int = 1
    max_gpus: int = 1 << 20
    noise: GradientNoise | None = field(default=None, repr=False)
    """Latest gradient-noise statistics (for ``goodput-dp``)."""
    priority: float = 1.0
    placement: tuple[int, ...] = ()
    """GPUs per node it holds now (empty: waiting)."""
    batch_size: int | None = None
    """Global batch it runs with now."""
    restart_s: float = DEFAULT_RESTART_S
    age_s: float | None = None
    """Seconds since submission (None: unknown; the restart cost is then amortised over the
    policy's horizon)."""
    restarts: int = 0
    """Times its placement changed after its first start."""
    explored_gpus: int | None = None
    """The most GPUs its model has seen measurements for, when the model is learned online: it
    may then get at most twice that (None: the model is trusted everywhere)."""
    explored_nodes: int | None = None
    """The most nodes its model has seen one step span, when learned online (None: trusted
    everywhere). A model that has only seen one node cannot price a spread placement."""
    attained_gpu_s: float = 0.0
    """GPU-seconds it has held so far (``pollux`` serves the least-served first)."""
    input: InputModel | None = field(default=None, repr=False)
    """Its input pipeline: samples/s on ``c`` cores (None: not known yet, taken as never
    limiting: a CPU-aware policy decides for it as a CPU-blind one)."""
    remote_max: float = 0.0
    """The most cores of the cluster's CPU pool its loaders can use (remote workers; 0: none,
    its loaders have no remote workers configured)."""
    done: float | None = None
    """The share of the work it declared (its epochs or steps) that it has done, 0-1 (None: it
    declared none). With :attr:`attained_gpu_s` it gives the GPU-seconds it still needs
    (:attr:`remaining_gpu_s`), which ``goodput-dp`` weighs."""
    done_origin: tuple[float, float] = (0.0, 0.0)
    """(:attr:`attained_gpu_s`, :attr:`done`) when its share done was first known: a job that
    resumed from a checkpoint, or a service that restarted and counts GPU-seconds from 0 again,
    extrapolates from there."""

    def __post_init__(self) -> None:
        lo, hi = self.batch_range
        if not 1 <= lo <= hi:
            raise AllocatorError(f"job {self.job_id!r}: batch_range={self.batch_range} invalid")
        llo, lhi = self.local_bsz_range
        if not 1 <= llo <= lhi:
            raise AllocatorError(
                f"job {self.job_id!r}: local_bsz_range={self.local_bsz_range} invalid"
            )
        if not self.attained_gpu_s >= 0:
            raise AllocatorError(
                f"job {self.job_id!r}: attained_gpu_s={self.attained_gpu_s} must be >= 0"
            )
        if self.done is not None and not 0.0 <= self.done <= 1.0:
            raise AllocatorError(
                f"job {self.job_id!r}: done={self.done}: expected a share in [0, 1]"
            )
        if self.requested_gpus < 1 or self.requested_batch < 1:
            raise AllocatorError(
                f"job {self.job_id!r}: requested_gpus={self.requested_gpus} and "
                f"requested_batch={self.requested_batch} must be >= 1"
            )

    @property
    def gpus(self) -> int:
        """GPUs it holds now."""
        return sum(self.placement)

    @property
    def remaining_gpu_s(self) -> float | None:
        """The GPU-seconds it still needs, extrapolated from what its share done has cost since
        :attr:`done_origin` (None: it declared no length, or has not run since)."""
        served, done = self.done_origin
        if self.done is None or not self.done > done or not self.attained_gpu_s > served:
            return None
        return (self.attained_gpu_s - served) * (1.0 - self.done) / (self.done - done)


@dataclass(frozen=True)
class ClusterDecision:
    """A policy's answer for every active job."""

    placements: dict[str, tuple[int, ...]]
    """GPUs per node for each job that runs (jobs absent here wait)."""
    batch_sizes: dict[str, int]
    reasons: dict[str, str]
    waiting: tuple[str, ...]
    cores: dict[str, tuple[float, ...]] = field(default_factory=dict)
    """CPU cores per node for each job that runs (empty: the cluster's cores are unlimited)."""
    remote: dict[str, float] = field(default_factory=dict)
    """Cores of the cluster's CPU pool for each job that gets some (its remote workers)."""
    lent: tuple[float, ...] = ()
    """Cores of each node lent to the pool for this decision (its jobs' spare, serving other
    nodes' jobs' remote workers; empty: none lent)."""


class Policy(Protocol):
    """Decides placements and batch sizes for the active jobs (in arrival order)."""

    name: str

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        """The new placements and batch sizes."""
        ...


def held_placements(jobs: Sequence[JobState]) -> dict[str, tuple[int, ...]]:
    return {j.job_id: j.placement for j in jobs if j.placement}
