"""The learning gate: which report windows of a job teach its loader model something, and which
call for a decision at once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dloader.predictor import LoaderModel, LoaderObservation

__all__ = [
    "CHANGE_Z",
    "COST_CHANGE",
    "COST_HISTORY",
    "DRIFT_WINDOWS",
    "FIRST_WINDOW_S",
    "MIN_WINDOW_S",
    "SETTLE_S",
    "SPLIT_MOVED_CHANGE",
    "STEADY_AFTER",
    "STEADY_EVERY",
    "SURPRISE",
    "CostChange",
    "Learning",
    "cost_change",
    "learning_gate",
    "run_queue_wait",
    "steady_window",
    "timed",
]


SETTLE_S = 1.5
"""After a worker-count change: time to apply it and start the workers before a window counts."""

MIN_WINDOW_S = 1.0
"""The shortest report window that counts."""

FIRST_WINDOW_S = 0.5
"""The shortest window that counts for a job its model has not seen yet: its workers' timings
over half a second place it (the agent reports four times a second at first); later, longer
windows correct the model. A placement a second sooner is worth more than the first window's
noise: a job waits for it at the count its user guessed."""

SURPRISE = 0.1
"""``|log(measured / predicted)|`` of a window that makes the policy re-decide at once."""

DRIFT_WINDOWS = 3
"""Surprising windows in a row, all one way, after which a job's model forgets the older ones:
its costs changed (a pipeline slower or faster than all it did before). Only for windows its
workers did not fully time (:func:`timed`): the timings say a change of costs in one window."""

COST_CHANGE = 1.4
"""A steady window whose workers' time per sample (their CPU, plus their wait for storage where
their wait for a CPU is measured) is this many times the typical one (the median) of the job's
recent windows its model learnt from at the same split of the node, or this many times less,
and beyond ``CHANGE_Z`` times their spread, says the job's costs changed: its model restarts
from that window at once, keeping its shape. Two windows' times per sample at one split of a
steady pipeline vary by a few per cent; a pipeline whose cost doubles moves them by 100%.
Where the timings cannot tell (none, or I/O with an unmeasured wait for a CPU, which contention
inflates), ``DRIFT_WINDOWS`` surprising windows are the route."""

SPLIT_MOVED_CHANGE = 1.7
"""The bound of :data:`COST_CHANGE` for a window whose only comparable ones are at another
split of the node (just after it moved), on CPU time per sample alone: the split moves a
worker's CPU time per sample by what sharing a core does to it, +15-25% measured here (a 2-core
node, three busy neighbours) and up to ~1.6x where two hardware threads of one core are both
busy (each runs at ~60-65% of its speed alone: common on GPU nodes). A change beyond that is
the job's own: a doubled or halved cost is seen in that window; a smaller one in the next
window at the new split, where the comparison is against the same split again."""

CHANGE_Z = 3.0
"""Standard deviations of a job's own recent windows (their time per sample, or their
throughput at one split) a window must lie from their centre, beyond the fixed share, to say
that something changed. Some pipelines vary far more than a few per cent between 1-s windows
with nothing changed: packed text, whose samples' cost has a heavy tail (a 4,000-word document
in one sample), measured 240-450 samples/s in the windows of one split on a crowded 2-core
node, and its workers' time per sample moved by -37% and +40% in two windows; a fixed 40%
restarted its model four times in 120 s on noise alone. With a single earlier window there is
no spread: the fixed share alone decides."""

COST_HISTORY = 8
"""Recent windows at the job's split the cost comparison looks at (:func:`cost_change`)."""

STEADY_AFTER = 10
"""Windows at one allocation after which the model takes only one in ``STEADY_EVERY``."""

STEADY_EVERY = 5


@dataclass(frozen=True)
class Learning:
    """What to do with one report window of a job (:func:`learning_gate`)."""

    observe: bool
    """Feed the window to the job's model."""
    run_length: int
    """Windows observed in a row at the job's current worker count, after this one."""
    redecide_now: bool
    """News (the first window at a new allocation, or a throughput the model did not expect):
    decide at once rather than at the next period."""
    surprise: float = 0.0
    """``log(measured / predicted)`` of a window at a known allocation beyond ``SURPRISE``
    (0: none). Several in a row, one way, say the job's costs changed (``DRIFT_WINDOWS``)."""


def steady_window(
    window_s: float,
    workers: int,
    directed_workers: int,
    busy_workers: int,
    since_directive_s: float,
    since_node_change_s: float,
    min_window_s: float = MIN_WINDOW_S,
) -> bool:
    """Whether a report window shows the job steady at its directed count: a window of at
    least ``min_window_s``, at that count, (with workers) some worker delivering a batch, and
    all of it after the job's last change and the node's (any job's) plus ``SETTLE_S``."""
    return (
        window_s >= min_window_s
        and workers == directed_workers
        and (workers == 0 or busy_workers > 0)
        and min(since_directive_s, since_node_change_s) >= window_s + SETTLE_S
    )


def learning_gate(
    model: LoaderModel,
    obs: LoaderObservation,
    *,
    window_s: float,
    directed_workers: int,
    busy_workers: int,
    since_directive_s: float,
    reports: int,
    run_length: int,
    since_node_change_s: float = math.inf,
) -> Learning:
    """Whether a report window teaches the model something.

    Only steady windows at the allocation the job was told to run count: the whole window must
    lie after the last change plus ``SETTLE_S``, of this job's worker count and of any other
    job's on the node (``since_node_change_s``: a neighbour's change shifts the CPU contention,
    which would be credited to this job's own count), and (with workers) some worker must have
    delivered a batch. A job the model has not seen yet is the exception to the neighbours'
    rule: its first window places it (a job arriving on a busy node, whose neighbours move
    as it arrives, would otherwise wait at its own count for a quiet moment), and a window of
    ``FIRST_WINDOW_S`` does (later windows correct it). One observation per window, not one
    per report. An allocation the model knows and predicts well (within ``SURPRISE``) is
    sampled one window in ``STEADY_EVERY`` after ``STEADY_AFTER``.
    """
    k = obs.num_workers
    usable = (
        obs.samples_per_s > 0
        and obs.step_s > 0
        and steady_window(
            window_s,
            k,
            directed_workers,
            busy_workers,
            since_directive_s,
            since_node_change_s if model.observations else math.inf,
            MIN_WINDOW_S if model.observations else FIRST_WINDOW_S,
        )
    )
    if not usable:
        return Learning(False, run_length, False)
    same = bool(model.observations) and model.observations[-1].num_workers == k
    if same and reports % max(int(window_s), 1):
        return Learning(False, run_length, False)
    predicted = model.predict(k, obs.cores, obs.batch_size).samples_per_s if same else 0.0
    off = math.log(obs.samples_per_s / predicted) if predicted > 0 else math.inf
    surprise = same and abs(off) > SURPRISE
    run = run_length + 1 if same else 0
    if same and not surprise and run > STEADY_AFTER and run % STEADY_EVERY:
        return Learning(False, run, False)
    return Learning(True, run, not same or surprise, off if surprise else 0.0)


def run_queue_wait(
    timed: Sequence[float | None],
    share: float | None,
    fetch: float | None,
    cpu: float | None,
    worker_s_per_batch: float,
) -> float | None:
    """A job's workers' wait for a CPU per batch in a report's window (None: unknown): what
    separates a CPU-bound worker on a crowded node from one waiting for storage. At most the
    part of a batch's wall time (``fetch``) that was not CPU work (``cpu``).

    ``timed``: each busy worker's mean wait per batch over the window, as it timed it (Linux
    schedstat around each batch); used when every worker timed it. Else ``share``, the share
    of wall time the job's workers waited runnable, from the sidecar's last two process-tree
    walks (None before the second): workers wait only while they work on a batch, and each
    delivers one every ``worker_s_per_batch`` seconds (workers x batch size / samples/s), so
    each batch waited ``share * worker_s_per_batch``, not ``share * fetch`` (that would
    undercount by the share of time the workers sit idle with their queues full)."""
    if fetch is None:
        return None
    room = max(fetch - (cpu or 0.0), 0.0)
    if timed and all(t is not None for t in timed):
        return min(sum(t for t in timed if t is not None) / len(timed), room)
    if share is None:
        return None
    return min(share * worker_s_per_batch, room)


class CostChange(NamedTuple):
    """A window's time per sample against the job's recent windows (:func:`cost_change`)."""

    change: float
    """``log(now / typical)`` (0: they cannot tell)."""
    threshold: float
    """How far ``change`` must go to say the costs changed: ``log(COST_CHANGE)`` (across a
    move of the split, ``log(SPLIT_MOVED_CHANGE)``), or
    ``CHANGE_Z`` times the spread of the recent windows' log time per sample if that is wider."""

    @property
    def moved(self) -> bool:
        return abs(self.change) > self.threshold


def cost_change(
    before: Sequence[LoaderObservation], obs: LoaderObservation, *, split_moved: bool = False
) -> CostChange:
    """The workers' time per sample in window ``obs`` against the median of the job's recent
    windows ``before`` at the same worker count (others are skipped; no change where none
    compares, or ``obs`` has no timings or no workers). CPU time per sample alone where any of
    those windows' wait for a CPU is unknown (wall time then mixes storage with contention), or
    ``split_moved``; CPU and storage time where all are known. Measured against measured windows,
    not the model's fitted costs: on a real pipeline the fit's ``t_io`` and ``t_cpu`` are
    whatever reproduces its throughput curve best, and may sit far (2-7x, seen) from what its
    workers time. Storage time is compared at the same split of the node only (the caller passes
    ``split_moved`` where ``before`` is at another split: cores shared by other workers move the
    wall time); CPU time per sample moves less with the split, and is compared against the wider
    :data:`SPLIT_MOVED_CHANGE`. At the same count only, since a change of count moves
    the time per sample for the curve's own reasons (storage answering more requests at once)."""
    fixed = math.log(SPLIT_MOVED_CHANGE if split_moved else COST_CHANGE)
    same = [
        b for b in before if b.num_workers == obs.num_workers and None not in (b.cpu_s, b.fetch_s)
    ]
    if not same or obs.num_workers == 0 or None in (obs.cpu_s, obs.fetch_s):
        return CostChange(0.0, fixed)
    storage = (
        not split_moved
        and obs.cpu_wait_s is not None
        and all(b.cpu_wait_s is not None for b in same)
    )
    measured = _per_sample(obs, storage)
    then = [t for t in (_per_sample(b, storage) for b in same) if t > 0]
    if not (measured > 0 and then):
        return CostChange(0.0, fixed)
    logs = np.log(then)
    spread = float(np.std(logs, ddof=1)) if len(logs) >= 2 else 0.0
    return CostChange(math.log(measured) - float(np.median(logs)), max(fixed, CHANGE_Z * spread))


def timed(obs: LoaderObservation) -> bool:
    """Whether a window's workers timed all :func:`cost_change` needs to see a change of the
    job's costs (CPU, wall and the wait for a CPU). Where they did, a window unlike the model's
    prediction with unchanged timings is the model's error, which learning that window
    corrects: the ``DRIFT_WINDOWS`` restart is for windows without them (it once restarted the
    models of real pipelines 28 times in 120 s, each time throwing their curves away)."""
    return obs.num_workers > 0 and None not in (obs.cpu_s, obs.fetch_s, obs.cpu_wait_s)


def _per_sample(o: LoaderObservation, storage: bool) -> float:
    """A window's worker CPU time per sample, plus (``storage``) its wait for storage."""
    assert o.cpu_s is not None and o.fetch_s is not None
    t = o.cpu_s / o.batch_size
    if storage:
        assert o.cpu_wait_s is not None
        t += max(o.fetch_s - o.cpu_wait_s - o.cpu_s, 0.0) / o.batch_size
    return t
