"""The node policy: how many loader workers each job gets. Pure code: plain values in and out.

``even``: the node's worker budget split equally (the baseline), within each job's limits.

``adaptive`` (A-Dloader's knob): maximise the sum over jobs of predicted throughput normalised
by the job's accelerator limit (equivalently: minimise accelerator idle), subject to

* the node's loader-worker budget ``sum k_j <= W``;
* the node's CPU budget ``sum T_j(k_j) * cpu_j <= C`` (``cpu_j``: CPU seconds per sample of job
  ``j``'s loader, from its model), so that jobs do not starve each other of cores. The budget is
  shared, as the OS shares cores: a worker whose CPU demand does not fit is credited with the
  share of its gain that the remaining CPU can pay for;
* each job's own limits, and a floor of one worker (no job is starved).

It allocates greedily: every job starts at its floor and the next worker goes to the job with
the highest predicted gain in normalised throughput per share of the remaining budgets it uses
(``extra_cpu / cpu_left + 1 / workers_left``: the scarcer resource dominates), until no worker
adds more than ``min_gain``. Throughput curves saturate, so the greedy choice is close to
optimal and it is fast (jobs x workers predictions). A job whose model has fewer than
``warmup`` observations is explored instead (:func:`predictor.exploration_plan`). A new
allocation replaces the previous one only if its predicted objective is higher by
``hysteresis`` (no thrashing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from predictor import LoaderModel, exploration_plan

__all__ = ["Budget", "Candidate", "Decision", "JobView", "decide"]


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


@dataclass(frozen=True)
class Budget:
    """The node's loader resources."""

    workers: int
    """Loader worker processes, all jobs together."""
    cores: float
    """Cores loader work may use, all jobs together."""


@dataclass(frozen=True)
class Candidate:
    """One worker count considered for a job."""

    num_workers: int
    predicted: float
    relative_std: float
    normalized: float
    cpu_cores: float


@dataclass(frozen=True)
class Decision:
    """The policy's answer for one job."""

    job_id: str
    num_workers: int
    reason: str
    accelerator_limit: float = 0.0
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)


def _bounds(job: JobView, budget: Budget) -> tuple[int, int]:
    high = min(job.max_workers or budget.workers, budget.workers)
    low = min(max(job.min_workers, 1), high) if high > 0 else 0
    return low, max(high, low)


def _even(jobs: Sequence[JobView], budget: Budget) -> dict[str, Decision]:
    share = max(budget.workers // max(len(jobs), 1), 1)
    out = {}
    for job in jobs:
        low, high = _bounds(job, budget)
        k = min(max(share, low), high)
        out[job.job_id] = Decision(
            job.job_id,
            k,
            f"even split: {budget.workers} workers / {len(jobs)} jobs, within [{low}, {high}]",
        )
    return out


def _curve(job: JobView, budget: Budget, high: int) -> tuple[Candidate, ...]:
    model = job.model
    assert model is not None
    limit = model.accelerator_limit(job.batch_size)
    cpu = model.cpu_seconds_per_sample
    out = []
    for k in range(high + 1):
        p = model.predict(k, budget.cores, job.batch_size)
        out.append(
            Candidate(
                k,
                p.samples_per_s,
                p.relative_std,
                p.samples_per_s / limit,
                p.samples_per_s * cpu if k > 0 else 0.0,
            )
        )
    return tuple(out)


def decide(
    policy: str,
    jobs: Sequence[JobView],
    budget: Budget,
    *,
    warmup: int = 3,
    min_gain: float = 0.005,
    hysteresis: float = 0.03,
) -> dict[str, Decision]:
    """Worker counts for every job under ``policy`` (``"adaptive"`` or ``"even"``).

    Raises:
        ValueError: an unknown policy or an empty budget.
    """
    if policy not in ("adaptive", "even"):
        raise ValueError(f"policy={policy!r} is not one of 'adaptive', 'even'")
    if budget.workers < 0 or not budget.cores > 0:
        raise ValueError(f"budget {budget} needs workers >= 0 and cores > 0")
    if policy == "even" or not jobs:
        return _even(jobs, budget)

    out: dict[str, Decision] = {}
    planned: list[JobView] = []
    for job in jobs:
        low, high = _bounds(job, budget)
        model = job.model
        seen = model.observations if model is not None else ()
        if len(seen) < warmup:
            k = exploration_plan(
                seen,
                cores=max(int(budget.cores), 1),
                max_workers=high,
                min_workers=low,
                start=job.initial_workers or None,
            )
            if k is not None:
                out[job.job_id] = Decision(
                    job.job_id,
                    k,
                    f"exploring (cold start, {len(seen)} observations): trying {k} workers",
                )
                continue
        if model is None:
            out[job.job_id] = Decision(
                job.job_id,
                min(max(job.current_workers, low), high),
                "no model yet: keeping the current worker count",
            )
            continue
        planned.append(job)

    used_workers = sum(d.num_workers for d in out.values())
    remaining = Budget(max(budget.workers - used_workers, 0), budget.cores)
    curves = {j.job_id: _curve(j, budget, _bounds(j, budget)[1]) for j in planned}
    alloc = {j.job_id: _bounds(j, budget)[0] for j in planned}
    cpu_used = sum(curves[j][alloc[j]].cpu_cores for j in alloc)  # exploring jobs: unknown
    workers_used = sum(alloc.values())
    while True:
        best: tuple[float, float, str] | None = None
        for job in planned:
            jid, k = job.job_id, alloc[job.job_id]
            curve = curves[jid]
            if k + 1 >= len(curve) or workers_used + 1 > remaining.workers:
                continue
            gain = curve[k + 1].normalized - curve[k].normalized
            extra_cpu = max(curve[k + 1].cpu_cores - curve[k].cpu_cores, 0.0)
            left = budget.cores - cpu_used
            if left <= 0:
                continue
            if extra_cpu > left:  # the OS shares the cores: the worker gets what is left
                gain *= left / extra_cpu
                extra_cpu = left
            if gain < min_gain:
                continue
            # Gain per share of what is left of each budget: whichever resource is scarcer
            # (worker slots or CPU) dominates the cost, as in dominant-resource fairness.
            workers_left = remaining.workers - workers_used
            score = gain / (extra_cpu / left + 1.0 / workers_left)
            if best is None or score > best[0]:
                best = (score, extra_cpu, jid)
        if best is None:
            break
        alloc[best[2]] += 1
        workers_used += 1
        cpu_used += best[1]

    objective_new = sum(curves[j][alloc[j]].normalized for j in alloc)
    current = {j.job_id: min(j.current_workers, len(curves[j.job_id]) - 1) for j in planned}
    objective_old = sum(curves[j][current[j]].normalized for j in current)
    keep = (
        objective_new < objective_old * (1 + hysteresis)
        and all(_bounds(j, budget)[0] <= current[j.job_id] for j in planned)
        and sum(current.values()) <= remaining.workers
    )
    for job in planned:
        jid = job.job_id
        k = current[jid] if keep else alloc[jid]
        c = curves[jid][k]
        why = (
            f"kept: the best allocation predicts a sum of {objective_new:.3f} vs "
            f"{objective_old:.3f} now (< {hysteresis:.0%} better)"
            if keep
            else f"{k} workers: predicted {c.predicted:,.0f} samples/s = {c.normalized:.0%} of "
            f"the accelerator limit, {c.cpu_cores:.2f} cores; node sum "
            f"{objective_new:.3f} (was {objective_old:.3f})"
        )
        out[jid] = Decision(
            jid,
            k,
            why,
            job.model.accelerator_limit(job.batch_size) if job.model else 0.0,
            curves[jid],
        )
    return out
