"""Measured truth over the model: what each split of the node measured, the guard that lets
measurements overrule the model's proposals, and the probes that measure near-ties."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from dloader.sidecar.node_policy.allocation import (
    ModelledNode,
    cpu_bound,
    fits,
    heavier,
    modelled,
    row_sums,
)
from dloader.sidecar.node_policy.learning import CHANGE_Z
from dloader.sidecar.node_policy.views import Budget, JobView, WorkerDecision, bounds

__all__ = [
    "MAX_SPLITS",
    "MEASURE_CHANGED",
    "MEASURE_MARGIN",
    "MEASURE_STALE_S",
    "MEASURE_WINDOWS",
    "NOISE_Z",
    "PROBE_AFTER_S",
    "PROBE_GAIN",
    "PROBE_HOLD_S",
    "PROBE_LOSS",
    "PROBE_MAX_WAIT_S",
    "PROBE_REACH",
    "PROBE_WINDOWS",
    "RELEASE_LOSS",
    "WINDOW_SPREAD",
    "MeasuredTruth",
    "Measurements",
    "Probe",
    "Split",
    "measured_guard",
    "probe",
    "same_jobs",
    "show_split",
    "split_of",
    "undecided",
]


MEASURE_MARGIN = 0.03
"""A split measured worse than another by more than this share of its score is left, or not
taken (the node's throughput measured over a few windows varies by about this much)."""

MEASURE_WINDOWS = 2
"""Steady report windows each job needs at a split before the split's measured score counts."""

NOISE_Z = 2.0
"""Standard errors of a difference between two splits' measured scores (from the spread of
their windows: :meth:`Measurements.spread`) within which the difference is noise: a split is
left, or a probe kept, only past both this and the fixed margins (``MEASURE_MARGIN``,
``PROBE_GAIN``)."""

WINDOW_SPREAD = 0.03
"""A job's window-to-window spread at one split (relative standard deviation) before its own
windows say what it is: a steady window of most jobs varies by a few per cent
(:meth:`Measurements.spread` pools the job's windows with ``_PRIOR_WINDOWS`` of these)."""

_PRIOR_WINDOWS = 2
"""Degrees of freedom the ``WINDOW_SPREAD`` prior counts for: a job's first two windows at a
split do not yet say its spread alone (two windows' standard deviation, one degree of freedom,
is under half the true spread 38% of the time), a dozen outweigh it."""

PROBE_WINDOWS = 6
"""Steady windows per job over which a probe is measured at most while its difference from the
split it left lies within the noise of its bar (:func:`undecided`): a close call is measured
longer, each window narrowing the noise, rather than decided on the first two."""

MEASURE_STALE_S = 90.0
"""A split's measurements older than this are forgotten: the jobs' costs may have changed."""

MEASURE_CHANGED = 0.25
"""A steady window of a job this far (as a share) from the mean of what it measured before at
the same split, and ``CHANGE_Z`` times those windows' spread, says the node changed under that
split (a pipeline's cost, a neighbour's): every split's measurements are forgotten at once,
since each was taken under the old costs (a window of most jobs varies by a few per cent; a
pipeline whose cost doubles moves by 40-50%; one whose windows vary more says a change only
past their own spread)."""

PROBE_AFTER_S = 5.0
"""Steady this long at a measured split: try the untried neighbour the model ranks best (a
split is measured about 4 s after a change: ``SETTLE_S`` and ``MEASURE_WINDOWS`` windows)."""

PROBE_HOLD_S = 15.0
"""A split moved to (a probe, or the model's move) is held against the model's next proposals
until it is measured, at most this long."""

PROBE_MAX_WAIT_S = 160.0
"""Probes that do not pay double the wait before the next, up to this."""

PROBE_LOSS = 0.05
"""Neighbours the model predicts worse than the current split by more than this are not tried
(the model is the prior: only near-ties are worth measuring; its errors on this node are a few
per cent, so a near-tie is within 5%)."""

RELEASE_LOSS = 0.15
"""On a full node, a neighbour that gives a CPU-bound job a worker less (and none more) is worth
measuring if the model predicts it within this share of the current split: there the model
overrates such workers by more than its usual error (on the real mix at budget 12 it put
image_jpeg's second worker at +11 points of its limit; measured, it added none)."""

PROBE_GAIN = 0.01
"""A probed split is kept only if it measures better than the split it left by this share."""

PROBE_REACH = 2
"""A split measured within this many workers (summed over jobs) of an untried one estimates it
(its measurement plus the model's difference): one that falls clearly short is not probed."""

_REACH_SPLITS = 32
"""Measured splits (the most recent) a probe's estimate looks at."""

MAX_SPLITS = 256
"""Splits whose measurements are kept at most (the oldest go first)."""

_KEEP_SAMPLES = 8

Split = tuple[tuple[str, int], ...]
"""A node's allocation: (job id, worker count) for every job, sorted by job id."""


def split_of(counts: dict[str, int]) -> Split:
    """The :data:`Split` of job id -> worker count."""
    return tuple(sorted(counts.items()))


def same_jobs(a: Split, b: Split) -> bool:
    """Whether two splits are of the same jobs (none came or went between them)."""
    return [j for j, _ in a] == [j for j, _ in b]


@dataclass
class Measurements:
    """What each split measured: per job, its samples/s over steady windows at that split
    (after the last change of any job plus ``SETTLE_S``: the same neighbours throughout)."""

    samples: dict[Split, dict[str, list[float]]] = field(default_factory=dict)
    last: dict[Split, float] = field(default_factory=dict)

    def add(self, split: Split, job_id: str, samples_per_s: float, now: float) -> bool:
        """One steady window of ``job_id`` at ``split``. True when it says the node changed
        (``MEASURE_CHANGED``, ``CHANGE_Z``): everything measured before is forgotten, and this
        window starts anew."""
        per = self.samples.setdefault(split, {})
        values = per.setdefault(job_id, [])
        if len(values) >= MEASURE_WINDOWS:
            before = sum(values) / len(values)
            spread = CHANGE_Z * float(np.std(values, ddof=1)) / before if before > 0 else 0.0
            if before > 0 and abs(samples_per_s / before - 1) > max(MEASURE_CHANGED, spread):
                self.samples, self.last = {split: {job_id: [samples_per_s]}}, {split: now}
                return True
        values.append(samples_per_s)
        del values[:-_KEEP_SAMPLES]
        self.last[split] = now
        for old in [s for s, t in self.last.items() if now - t > MEASURE_STALE_S]:
            self.forget(old)
        while len(self.last) > MAX_SPLITS:
            self.forget(min(self.last, key=self.last.__getitem__))
        return False

    def forget(self, split: Split) -> None:
        self.samples.pop(split, None)
        self.last.pop(split, None)

    def spread(self, job_id: str) -> float:
        """The relative standard deviation of one steady window of ``job_id`` at a split: its
        windows' deviations from their split's mean, pooled over every split it was measured
        at (the same job under the same costs: the measurements are forgotten when those
        change), with ``_PRIOR_WINDOWS`` degrees of freedom at ``WINDOW_SPREAD``. Two windows
        of one split alone give a spread of one degree of freedom, under half the truth 38%
        of the time."""
        squares, dof = _PRIOR_WINDOWS * WINDOW_SPREAD**2, float(_PRIOR_WINDOWS)
        for per in self.samples.values():
            values = per.get(job_id, ())
            if len(values) >= 2:
                v = np.asarray(values, dtype=float)
                mean = float(v.mean())
                if mean > 0:
                    squares += float(((v / mean - 1.0) ** 2).sum())
                    dof += len(v) - 1
        return (squares / dof) ** 0.5

    def windows(self, split: Split) -> int:
        """The fewest steady windows any job of ``split`` has there (0: one has none)."""
        per = self.samples.get(split, {})
        return min((len(per.get(job_id, ())) for job_id, _ in split), default=0)

    def error(self, split: Split, limits: dict[str, float]) -> float:
        """The standard error of ``split``'s score (:meth:`score`): per job, its window spread
        (:meth:`spread`) times its mean there over its limit, over the root of its windows'
        count; the jobs' added in quadrature."""
        total = 0.0
        for job_id, values in self.samples.get(split, {}).items():
            limit = limits.get(job_id, 0.0)
            if values and limit > 0:
                level = sum(values) / len(values) / limit
                total += (self.spread(job_id) * level) ** 2 / len(values)
        return total**0.5

    def score(self, split: Split, limits: dict[str, float], now: float) -> float | None:
        """The sum over jobs of measured samples/s / accelerator limit at ``split``; None
        unless every job has ``MEASURE_WINDOWS`` windows there within ``MEASURE_STALE_S``."""
        per = self.samples.get(split)
        if per is None or now - self.last[split] > MEASURE_STALE_S:
            return None
        total = 0.0
        for job_id, _ in split:
            values = per.get(job_id, [])
            limit = limits.get(job_id, 0.0)
            if len(values) < MEASURE_WINDOWS or not limit > 0:
                return None
            total += sum(values) / len(values) / limit
        return total


def _apart(measured: Measurements, a: Split, b: Split, limits: dict[str, float]) -> float:
    """How far two splits' scores must differ to tell them apart: ``NOISE_Z`` standard errors
    of their difference."""
    return NOISE_Z * (measured.error(a, limits) ** 2 + measured.error(b, limits) ** 2) ** 0.5


def measured_guard(
    current: Split,
    proposed: Split,
    previous: Split | None,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
    *,
    trial: bool = False,
    lighter: bool = False,
    heavier: bool = False,
) -> tuple[Split, str]:
    """The split to run, and why when it is not the model's ``proposed``: the model proposes,
    measurements decide. A proposal measured worse than the current split (by
    ``MEASURE_MARGIN``) is not taken; a current split measured worse than the ``previous`` one
    (the split left for it) goes back to that. A ``trial`` split (a probe's) must earn its
    place: it is kept only if measured better than the previous one by ``PROBE_GAIN``; a
    ``lighter`` trial (a CPU-bound worker less on a full node) only if not measured worse by
    that much: a tie goes to the split with fewer threads competing for the cores. A
    ``heavier`` proposal (a CPU-bound worker more on a full node: :func:`heavier`) measured
    already is taken only if it measured better by ``PROBE_GAIN``."""
    here = measured.score(current, limits, now)
    if proposed != current:
        there = measured.score(proposed, limits, now)
        noise = _apart(measured, current, proposed, limits)
        if (
            here is not None
            and there is not None
            and (
                there < here + max(PROBE_GAIN * here, noise)
                if heavier
                else there < here - max(MEASURE_MARGIN * here, noise)
            )
        ):
            return current, (
                f"kept: measured {here:.3f} (sum of throughput / limit) at this split, "
                f"{there:.3f} at the model's choice {show_split(proposed)}"
            )
        return proposed, ""
    if previous is not None and previous != current and same_jobs(previous, current):
        before = measured.score(previous, limits, now)
        if here is not None and before is not None:
            # a probe must measure better (a lighter one, no worse); a model's move, not
            # measurably worse
            noise = _apart(measured, previous, current, limits)
            if trial:
                need = _probe_need(before, noise, lighter)
            else:
                need = before - max(MEASURE_MARGIN * before, noise)
            if here < need:
                return previous, (
                    f"back to {show_split(previous)}: measured {before:.3f} there, {here:.3f} at "
                    f"{show_split(current)}" + (" (a probe that did not pay)" if trial else "")
                )
    return current, ""


def undecided(
    current: Split,
    previous: Split,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
    *,
    lighter: bool = False,
) -> bool:
    """Whether a probe at ``current`` (which left ``previous``), measured and failing its bar
    (:func:`measured_guard`: ``PROBE_GAIN`` better than ``previous``; a ``lighter`` one, no
    worse by it), fails it by less than the noise of the difference, with fewer than
    ``PROBE_WINDOWS`` windows per job: more windows can tell it."""
    here = measured.score(current, limits, now)
    before = measured.score(previous, limits, now)
    if here is None or before is None or measured.windows(current) >= PROBE_WINDOWS:
        return False
    noise = _apart(measured, previous, current, limits)
    return _probe_need(before, noise, lighter) > here > _probe_need(before, 0.0, lighter) - noise


def _probe_need(before: float, noise: float, lighter: bool) -> float:
    """What a probe must measure to stay, the split it left having measured ``before``:
    ``PROBE_GAIN`` and ``noise`` better (a ``lighter`` one: no worse by both); ``noise`` 0:
    the bar itself."""
    gain = max(PROBE_GAIN * before, noise)
    return before - gain if lighter else before + gain


def show_split(split: Split) -> str:
    """``job=k`` for each job (the job ids' first 6 characters: enough to tell them apart)."""
    return "(" + ", ".join(f"{j[:6]}={k}" for j, k in split) + ")"


class Probe(NamedTuple):
    """A split worth measuring (:func:`probe`)."""

    split: Split
    why: str
    lighter: bool
    """It gives a CPU-bound job a worker less on a full node (and none more): it stays unless
    it measures worse than the split it left (:func:`measured_guard`)."""


def probe(
    jobs: Sequence[JobView],
    budget: Budget,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
    again: dict[str, int] | None = None,
) -> Probe | None:
    """A neighbour of the current split worth measuring: one worker added to, removed from or
    moved between jobs, within the budgets, not measured lately, predicted by the model within
    ``PROBE_LOSS`` of the current split; the best predicted first. On a full node, those that
    give a CPU-bound job a worker less (and none more) come first, within ``RELEASE_LOSS``.
    ``again``: the move (job id -> workers added) of a probe that just paid: made once more
    first, if it is such a neighbour (a slope measured to pay is followed before the model's
    next guess). None: no neighbour is worth measuring."""
    if any(j.model is None or not j.model.observations for j in jobs):
        return None
    ids = [j.job_id for j in jobs]
    node = modelled(jobs, budget)
    current = node.row({j.job_id: j.current_workers for j in jobs})
    if not node.valid(current[None])[0]:
        return None
    n = len(ids)
    rows = np.arange(n)
    # each job's predicted share of its limit here, the node's objective their sum
    shares = node.normalized[rows, current] * node.scale(current[None])[0]
    base = float(row_sums(shares[None])[0])
    one = np.eye(n, dtype=int)
    shifts = [one, -one] + [one[b] - one[a] for a in range(n) for b in range(n) if a != b]
    trials = current + np.vstack(shifts).reshape(-1, n)
    ranges = np.array([bounds(j, budget) for j in jobs]).reshape(-1, 2)
    ok = (
        (trials >= ranges[:, 0]).all(axis=1)
        & (trials <= ranges[:, 1]).all(axis=1)
        & (trials.sum(axis=1) <= budget.workers)
    )
    ok[ok] = node.memory_of(trials[ok]) <= budget.memory_bytes
    # No probe gives a worker to a job whose room to its accelerator limit is under PROBE_GAIN
    # of the node's score: that worker can raise only its own job, by less than a probe must
    # gain to stay, and it takes cores from the others. A worker added alone only unsettles
    # every job's measurements; moved there from another job, it is the other job's worker
    # less (a trial of its own) with one more thread.
    ok &= ~((trials > current) & (1.0 - shares < PROBE_GAIN * base)).any(axis=1)
    for t in np.flatnonzero(ok):  # not measured lately
        split = split_of(dict(zip(ids, trials[t].tolist(), strict=True)))
        ok[t] = measured.score(split, limits, now) is None
    values = np.full(len(trials), -np.inf)
    values[ok] = node.objective(trials[ok])
    # On a full node, a worker less for a CPU-bound job (one whose workers each compute half
    # the time or more) comes first: the model shares the cores as if that were free, but a
    # node with more runnable threads than cores also pays for their switching, and its
    # trainers wait longer for a core, so the model overrates such workers where it matters.
    bound, full = cpu_bound(node, current, budget)
    fewer = ((trials < current) & bound).any(axis=1) & ~((trials > current) & bound).any(axis=1)
    # neither: those a measured neighbour says would not stay
    short = _measured_short(node, trials, values, fewer & full, current, measured, limits, now)
    values[short] = -np.inf
    near = values >= base * (1 - PROBE_LOSS)
    release = fewer & (values >= base * (1 - RELEASE_LOSS)) & full
    if not (near.any() or release.any()):
        return None
    pool = release if release.any() else near
    follow = np.zeros_like(near)
    if again:
        step = np.array([again.get(j, 0) for j in ids])
        follow = (near | release) & (trials == current + step).all(axis=1)
    if follow.any():
        pool, why = follow, " (the move that just paid, once more)"
    else:
        why = " (a CPU-bound worker less on a full node)" if release.any() else ""
    i = int(np.argmax(np.where(pool, values, -np.inf)))  # the best predicted (first of equals)
    split = split_of(dict(zip(ids, trials[i].tolist(), strict=True)))
    return Probe(
        split,
        f"probing {show_split(split)}: the model predicts {values[i]:.3f} there vs "
        f"{base:.3f} here, too close to call without measuring{why}",
        bool(fewer[i]) and full,
    )


def _measured_short(
    node: ModelledNode,
    trials: np.ndarray,
    values: np.ndarray,
    lighter: np.ndarray,
    current: np.ndarray,
    measured: Measurements,
    limits: dict[str, float],
    now: float,
) -> np.ndarray:
    """Trials (rows of ``trials``, predicted ``values``) a measured neighbour already answers:
    estimated as a split measured lately within ``PROBE_REACH`` workers of the trial plus the
    model's difference between the two, the best such estimate falls short of what the trial
    must measure to stay (:func:`measured_guard`: ``PROBE_GAIN`` better than the current
    split's measurement; a ``lighter`` one, no worse by it) by more than ``MEASURE_MARGIN``.
    The model ranks splits; a measured neighbour corrects its level (it overrates a CPU-bound
    worker on a full node: having measured one worker less there, the next split with that
    worker less needs no probe of its own)."""
    out = np.zeros(len(trials), dtype=bool)
    ids = node.ids
    here_split = split_of(dict(zip(ids, current.tolist(), strict=True)))
    here = measured.score(here_split, limits, now)
    if here is None:
        return out
    known = []  # the most recently measured splits of these jobs, this one aside
    for split in sorted(measured.last, key=measured.last.__getitem__, reverse=True):
        if split != here_split and same_jobs(split, here_split):
            score = measured.score(split, limits, now)
            if score is not None:
                known.append((dict(split), score))
        if len(known) >= _REACH_SPLITS:
            break
    if not known:
        return out
    rows = np.array([[k[j] for j in ids] for k, _ in known], dtype=int)
    valid = node.valid(rows)
    if not valid.any():
        return out
    rows, scores = rows[valid], np.array([v for (_, v), ok in zip(known, valid, strict=True) if ok])
    offset = scores - node.objective(rows)  # measured less predicted, per known split
    idx = np.flatnonzero(np.isfinite(values))  # the trials still in the running
    estimate = np.full(len(idx), -np.inf)
    for row, off in zip(rows, offset, strict=True):  # a few splits: no (trials, splits, jobs)
        near = np.abs(trials[idx] - row).sum(axis=1) <= PROBE_REACH
        estimate = np.maximum(estimate, np.where(near, values[idx] + off, -np.inf))
    need = np.where(lighter[idx], here / (1 + PROBE_GAIN), here * (1 + PROBE_GAIN))
    out[idx] = np.isfinite(estimate) & (estimate < need - MEASURE_MARGIN * here)
    return out


@dataclass
class MeasuredTruth:
    """The measured truth of one node: what each split measured, and the probe state machine
    that decides, decision by decision, whether the model's proposal runs, the split left for
    it comes back, or a near-tie neighbour is probed (:meth:`steer`). Mutable, and pure: the
    time comes in as ``now``, the node's state as arguments.

    States: at a split the model moved to, or a probe's (``probed``), the split is held until
    it is measured (at most ``PROBE_HOLD_S``), then judged against the split left for it
    (``previous``), a close call only once more windows tell it (:func:`undecided`); steady
    for ``probe_wait`` at a measured split, the model's best untried near-tie is probed. A
    probe that does not pay doubles ``probe_wait`` (up to ``PROBE_MAX_WAIT_S``); one that pays
    resets it and is followed by the same move once more (``paid``). A job arriving or leaving
    starts afresh (a new node); a change of costs that forgets the measurements drops the probe
    under way (:meth:`forget`)."""

    measured: Measurements = field(default_factory=Measurements)
    previous: Split | None = None
    """The split left for the current one."""
    probed: Split | None = None
    """The split the last probe (or the model's heavier move, on trial) moved to."""
    lighter: bool = False
    """That probe took a CPU-bound worker on a full node."""
    paid: dict[str, int] | None = None
    """The move of the last probe (job id -> workers added), if it paid."""
    probe_wait: float = PROBE_AFTER_S
    """Steady seconds before the next probe."""

    def record(self, split: Split, job_id: str, samples_per_s: float, now: float) -> bool:
        """One steady window of a job at ``split`` (:meth:`Measurements.add`); True when it
        says the node changed: every split's measurements were forgotten but this window, which
        starts anew, and the probe state goes as in :meth:`forget`."""
        changed = self.measured.add(split, job_id, samples_per_s, now)
        if changed:
            self._drop_probe()
        return changed

    def known(self, split: Split, limits: dict[str, float], now: float) -> bool:
        """Whether ``split`` has a measured score now."""
        return self.measured.score(split, limits, now) is not None

    def forget(self) -> None:
        """Forgets every split's measurements (the jobs' costs changed under them), and the
        probe under way with the split it left and the move a probe measured to pay: they were
        judged under the old costs (a probe judged after the forgetting would "pay" only because
        the split it left has no measurement left to beat), so the model's next proposal runs.
        The wait before the next probe is kept (a job whose windows often look changed would
        otherwise be probed every few seconds)."""
        self.measured = Measurements()
        self._drop_probe()

    def _drop_probe(self) -> None:
        self.previous, self.probed, self.paid = None, None, None

    def steer(
        self,
        jobs: Sequence[JobView],
        budget: Budget,
        decisions: dict[str, WorkerDecision],
        current: Split,
        limits: dict[str, float],
        now: float,
        changed_at: float,
    ) -> dict[str, WorkerDecision]:
        """The model proposes (``decisions``), measurements decide (:func:`measured_guard`):
        the decisions to run at the node's ``current`` split, ``changed_at`` the time of its
        last change. Steady for ``probe_wait`` at a measured split, a near-tie neighbour is
        tried (:func:`probe`). The model's own move that gives a CPU-bound job a worker more on
        a full node (:func:`~.allocation.heavier`) is on trial like a probe: it stays only if
        it measures better. A split moved to (by a probe or the model, the jobs the same) is
        held until it is measured, at most ``PROBE_HOLD_S``, unless it no longer fits the
        budgets. Only once every job is placed by its model."""
        if any(j.model is None or not j.model.observations for j in jobs) or not all(
            d.placed for d in decisions.values()
        ):
            self.previous, self.probe_wait = None, PROBE_AFTER_S
            return decisions
        if self.previous is not None and not same_jobs(self.previous, current):
            # a job came or went: a new node
            self.previous, self.probed, self.probe_wait = None, None, PROBE_AFTER_S
            self.paid = None
        proposed = split_of({j: d.num_workers for j, d in decisions.items()})
        heavy = proposed != current and heavier(jobs, budget, dict(current), dict(proposed))
        chosen, why = measured_guard(
            current,
            proposed,
            self.previous,
            self.measured,
            limits,
            now,
            trial=current == self.probed,
            lighter=self.lighter,
            heavier=heavy,
        )
        known = self.known(current, limits, now)
        held = now - changed_at < PROBE_HOLD_S
        moved = self.previous is not None and same_jobs(self.previous, current)
        if moved and not known and proposed != current and held:
            # a split moved to (by a probe or the model) runs until it is measured (within
            # PROBE_HOLD_S): the model's next proposal, on a fit of the move's first noisy
            # windows, would end it before anything was learnt
            shown = show_split(current)
            chosen, why = (
                current,
                (
                    f"probing {shown}: measuring it"
                    if current == self.probed
                    else f"measuring {shown} before the next move"
                ),
            )
        if (
            current == self.probed
            and known
            and held
            and self.previous is not None
            and undecided(current, self.previous, self.measured, limits, now, lighter=self.lighter)
        ):  # a close call: measured longer before it is judged
            chosen, why = current, f"probing {show_split(current)}: within the noise, measuring it"
        elif current == self.probed and known:  # the probe is judged
            paid = chosen == current
            left = dict(self.previous or ())
            self.paid = {j: k - left.get(j, k) for j, k in current} if paid else None
            self.probed = None
            self.probe_wait = PROBE_AFTER_S if paid else min(2 * self.probe_wait, PROBE_MAX_WAIT_S)
        steady = now - changed_at >= self.probe_wait
        if chosen == current == proposed and steady and known and current != self.probed:
            tried = probe(jobs, budget, self.measured, limits, now, again=self.paid)
            self.paid = None
            if tried is not None:
                chosen, why, self.lighter = tried
                self.probed = chosen
        if chosen == proposed != current and heavy:
            # the model overrates a CPU-bound worker more on a full node: on trial, as a probe
            self.probed, self.lighter = proposed, False
        if chosen != proposed and not fits(jobs, budget, dict(chosen)):
            return decisions  # e.g. memory grew since that split was run
        if chosen != current:
            self.previous = current
        if chosen == proposed:
            return decisions
        counts = dict(chosen)
        return {j: replace(d, num_workers=counts[j], reason=why) for j, d in decisions.items()}
