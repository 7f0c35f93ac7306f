"""What the node policy sees and answers: a job's view, the node's budget, a decision.

Plain values only; the policy's modules (:mod:`.allocation`, :mod:`.measured`) take these in and
give these out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from dloader.errors import InvalidArgument
from dloader.predictor import LoaderModel

__all__ = [
    "POLICIES",
    "Budget",
    "Candidate",
    "JobView",
    "ReportWindow",
    "TreeSample",
    "WorkerDecision",
    "bounds",
    "check_policy",
]


POLICIES = ("adaptive", "even", "guided")


def check_policy(name: str, field: str = "policy") -> str:
    """``name`` if it is a node policy; else :class:`InvalidArgument` naming ``field``."""
    if name not in POLICIES:
        raise InvalidArgument(field, f"{name!r} is not one of {', '.join(POLICIES)}")
    return name


@dataclass(frozen=True)
class JobView:
    """What the policy knows of a job."""

    job_id: str
    batch_size: int
    current_workers: int
    min_workers: int = 0
    max_workers: int = 0
    """0: no limit of its own (the node budget)."""
    model: LoaderModel | None = None
    initial_workers: int = 0
    """The count the job started with: exploration goes up from there (0: from 1 worker)."""
    main_cpu_per_sample: float = 0.0
    """CPU seconds its training process spends per sample (receiving and collating batches);
    it competes for the same cores as the loader workers (0: unknown)."""
    worker_memory_bytes: float = 0.0
    """What one more of its workers costs in memory (0: nothing known: not limited)."""
    worker_memory_bound: float = 0.0
    """While its workers' memory still grows (they copy the trainer's pages as they read them):
    the most one worker may come to hold. Workers beyond its current count are counted at
    this (0: its workers' memory has settled; ``worker_memory_bytes`` applies to all)."""
    worker_upkeep_cores: float = 0.0
    """Cores each of its workers takes beyond its samples' work (waking, sending batches,
    idling), measured: part of its CPU demand at every count (0: unknown)."""
    worker_activity: float = 1.0
    """How its workers claim cores when cores are short: ``k`` workers count as ``k **
    worker_activity`` runnable threads (1: all always runnable; measured from its run-queue
    wait: workers blocked on a full queue or a slow trainer claim none)."""
    started: bool = True
    """Its loader runs: it has loader workers or has delivered a batch. False for a loader
    created and never iterated (its agent registers it at creation): it holds no workers, so
    its count is not reserved against the node's budget until they run."""


@dataclass(frozen=True)
class Budget:
    """The node's loader resources."""

    workers: int
    """Loader worker processes, all jobs together."""
    cores: float
    """Cores loader work may use, all jobs together."""
    memory_bytes: float = math.inf
    """Memory the loader workers of all jobs may use together."""
    trainer_weight: float = 1.0
    """How the kernel weighs a training process against one loader worker for a core (above 1
    when the sidecar nices the workers: :func:`~.sharing.trainer_weight`)."""


class Candidate(NamedTuple):
    """One worker count considered for a job (a named tuple: a decision makes one per job and
    count, thousands at 50 jobs)."""

    num_workers: int
    predicted: float
    relative_std: float
    normalized: float
    cpu_cores: float


@dataclass(frozen=True)
class WorkerDecision:
    """The policy's answer for one job."""

    job_id: str
    num_workers: int
    reason: str
    accelerator_limit: float = 0.0
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    cpu_share: float = 0.0
    """Cores the job gets under the node's CPU sharing (workers and training process; 0:
    unknown, e.g. while exploring)."""
    memory_limited: bool = False
    """Memory, not CPU, stops it from getting a worker the model says would help."""
    placed: bool = True
    """The job's model placed it (False: it is explored, or has no model yet)."""


@dataclass(frozen=True)
class ReportWindow:
    """One report window of a job's loader, as the policy reads it."""

    num_workers: int
    batch_size: int
    samples_per_s: float
    idle_share: float
    """Of the window: the training step waiting for data."""
    step_s: float
    window_s: float
    fetch_s: tuple[float, ...] = ()
    """Each worker that delivered a batch in the window: its mean wall time per batch."""
    cpu_s: tuple[float, ...] = ()
    """The same workers: their mean CPU time per batch."""
    run_delay_s: tuple[float | None, ...] = ()
    """The same workers: their mean wait for a CPU per batch, as each timed it (None: not
    timed)."""

    @property
    def busy(self) -> int:
        """Workers that delivered a batch in the window."""
        return len(self.fetch_s)


@dataclass(frozen=True)
class TreeSample:
    """One walk of a job's process tree (its training processes and their loader workers), as
    the policy reads it."""

    cpu_cores: float
    """The whole tree's CPU use."""
    main_cores: float
    """The training processes' CPU use, without their workers."""
    run_delay_s: dict[int, float] = field(default_factory=dict)
    """Per loader worker (by PID): seconds it has ever waited, runnable, for a CPU."""
    worker_uss: tuple[float, ...] = ()
    """Each loader worker's private memory (USS), where measured."""
    worker_anon: tuple[float, ...] = ()
    """Each loader worker's anonymous resident memory, where measured."""
    main_uss: tuple[float, ...] = ()
    """Each training process's private memory, where measured."""
    main_anon: float = 0.0
    """The training processes' anonymous resident memory, together."""
    has_workers: bool = False
    """It has loader workers now."""


def bounds(job: JobView, budget: Budget) -> tuple[int, int]:
    high = min(job.max_workers or budget.workers, budget.workers)
    low = min(max(job.min_workers, 1), high) if high > 0 else 0
    return low, max(high, low)
