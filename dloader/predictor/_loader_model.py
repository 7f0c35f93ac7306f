"""Loader throughput: what a job reaches with ``k`` loader workers on ``c`` cores at batch ``b``.

Physical part (per sample: ``t_io`` waiting for storage, ``t_cpu`` of CPU work)::

    A(b)      = b / (a0 + a1 * b)                        accelerator limit, samples/s
    L(k, c)   = softmin_q(k / (t_io + t_cpu), eta * c / t_cpu)   workers, then CPU, saturate
    T(k>=1)   = softmin_p(A, L)                           loading overlaps the step
    softmin_p(x, y) = (x^-p + y^-p)^(-1/p)                a min with a rounded knee
    T(0)      = 1 / (1/A + t_io + t_cpu / min(c, 1))     in-process loading: no overlap

``a0, a1`` come from the measured step time less the data wait; ``t_cpu`` from the workers' CPU
time per batch; ``t_io`` from their wall time per batch less CPU, taken at the least contended
observation. Without worker timings, ``t_io + t_cpu`` comes from loader-bound observations
(``k / T``) and the CPU share is fitted with the shape. ``eta`` (the share of the cores the
workers really get) and the knees' sharpness ``p`` and ``q`` are fitted by least squares on log
throughput once there are two observations, with a weak prior towards sharp knees and most of
the cores (``_PRIOR_WEIGHT``): it decides only where the observed counts leave the shape open.

Each window is compared with the physical part at its own trainer's pace (``b`` over its step
less its data wait) rather than at the fitted ``A(b)``: a window whose trainer was slow (starved
of CPU) and never waited for data measured the trainer, and says only that the loader gave at
least that much. The shape fit and the correction below see the loader, not the trainer's ups
and downs; predictions use the fitted ``A(b)``.

Learned part: a scikit-learn ``BayesianRidge`` fitted online to the log-residual
``log(measured / physical)`` over the features ``[x, x^2, k == 0]`` with ``x = log(L / A)`` (how
loader-bound the allocation is). It corrects the shape near the knee and gives a predictive
standard deviation, reported as a relative uncertainty so that a policy can choose to explore.
Before three observations, the correction is their mean log-residual: a model fitted to one
window reproduces that window (the first placement of a job rests on it).

Predictions are monotone non-decreasing in workers and cores by construction: the prediction
for ``(k, c)`` is the maximum over all ``k' <= k``, ``c' <= c`` on the integer grid.

Cold start: :func:`exploration_plan` (1 worker, then the core count, then doubling) reaches a
usable fit in a few reports; see its docstring.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.optimize import least_squares
from sklearn.linear_model import BayesianRidge

from dloader.errors import PredictorError
from dloader.predictor._serial import check_payload

__all__ = [
    "LoaderModel",
    "LoaderObservation",
    "LoaderPrediction",
    "exploration_plan",
]

_KIND = "loader"
_VERSION = 1
_MAX_SAMPLES = 1000  # observations kept (the most recent)
_SHAPE_REFIT_GROWTH = 1.25  # refit the shape of known allocations after this growth in reports
_GRID_ETA = (0.3, 0.6, 0.9, 1.2, 1.5)  # the shape fit's coarse grid: share of the cores
_GRID_KNEE = (1.5, 3.0, 6.0, 12.0, 25.0)  # ... sharpness of a knee
_GRID_SHARE = (0.05, 0.25, 0.5, 0.75, 0.95)  # ... CPU share of a sample's time
_MAX_NFEV = 60  # residual evaluations of one shape fit
_COLD_STD = 0.5  # relative uncertainty reported before there is anything to fit
_MAX_CORRECTION = 0.7  # the learned log correction, at most (a calibration, not new physics)
_MAX_UNFITTED = 5  # observations held back from the fit (said nothing new) before a refit anyway
_PRIOR_WEIGHT = 0.02
"""Weight of the shape fit's prior (log ``eta``, ``p``, ``q`` near their defaults), against an
allocation's log-throughput residual weighted 1 per observation's square root. Small: where
the observed allocations pin the shape, they decide. Where they do not (a job seen at one or
two worker counts), many shapes fit them exactly, and the prior picks the one nearest sharp
knees: a shortfall at the one count seen is read as the share of the cores the workers get
(``eta``), not as a knee so round that it predicts half the throughput at fewer workers."""


@dataclass(frozen=True)
class LoaderObservation:
    """One report of a job's loader, as the loader's ``stats()`` and the sidecar see it."""

    num_workers: int
    cores: float
    """CPU cores available to the job's loader: its CPU set or cgroup quota, or (the sidecar,
    on a node shared with other jobs) the cores its workers could have used in the window."""
    batch_size: int
    samples_per_s: float
    """Achieved throughput."""
    idle_share: float
    """Share of wall time the trainer waited for data."""
    step_s: float
    """Mean time between batch requests (the step, data wait included)."""
    fetch_s: float | None = None
    """Mean wall time a worker spends on one batch (``None`` with in-process loading)."""
    cpu_s: float | None = None
    """Mean CPU time a worker spends on one batch."""
    cpu_wait_s: float | None = None
    """Of ``fetch_s``: time a worker waited, runnable, for a CPU (run-queue delay: other
    processes' contention), when the sidecar measures it."""
    io_bytes_per_sample: float | None = None
    """Bytes read from storage per sample, when the sidecar measures it (informational)."""

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise PredictorError(f"num_workers={self.num_workers} must be >= 0")
        if not self.cores > 0:
            raise PredictorError(f"cores={self.cores} must be > 0")
        if self.batch_size < 1:
            raise PredictorError(f"batch_size={self.batch_size} must be >= 1")
        if not self.samples_per_s > 0 or not self.step_s > 0:
            raise PredictorError(
                f"samples_per_s={self.samples_per_s} and step_s={self.step_s} must be > 0"
            )
        if not 0.0 <= self.idle_share <= 1.0:
            raise PredictorError(f"idle_share={self.idle_share} must be within [0, 1]")
        for name in ("fetch_s", "cpu_s", "cpu_wait_s"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise PredictorError(f"{name}={v} must be >= 0")


@dataclass(frozen=True)
class LoaderPrediction:
    """A predicted throughput with its parts."""

    samples_per_s: float
    relative_std: float
    """Predictive standard deviation of ``log(samples_per_s)``: ~ relative uncertainty."""
    accelerator_limit: float
    """``A(b)``: samples/s if data were free."""
    loader_limit: float
    """``L(k, c)``: samples/s the loader could produce if the accelerator were free."""


@dataclass
class _Physics:
    a0: float = 0.0  # accelerator step: fixed seconds
    a1: float = 1e-3  # accelerator step: seconds per sample
    t_io: float = 0.0
    t_cpu: float = 1e-3
    eta: float = 0.9
    p: float = 6.0  # sharpness of the accelerator/loader knee
    q: float = 6.0  # sharpness of the workers/CPU knee


_PRIOR = _Physics()  # the shape fit's prior: sharp knees, most of the cores


def _soft_min(a: np.ndarray, b: np.ndarray, p: float | np.ndarray) -> np.ndarray:
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return lo * (1.0 + (lo / hi) ** p) ** (-1.0 / p)


class LoaderModel:
    """The loader-throughput model of one job. Feed it observations; ask it about allocations.

    Example::

        model = LoaderModel()
        model.update(LoaderObservation(num_workers=2, cores=2, batch_size=32,
                                       samples_per_s=230, idle_share=0.85, step_s=0.14,
                                       fetch_s=0.27, cpu_s=0.01))
        model.predict(num_workers=12, cores=2, batch_size=32).samples_per_s
    """

    def __init__(self) -> None:
        self._obs: deque[LoaderObservation] = deque(maxlen=_MAX_SAMPLES)
        self._phys = _Physics()
        self._ridge: BayesianRidge | None = None
        self._offset = 0.0  # before the ridge (< 3 observations): their mean log residual
        self._seen_x = (0.0, 0.0)  # the ridge's first feature, least and most among its windows
        self._shape_seen: set[tuple[int, int]] = set()
        """Allocations the last shape fit saw."""
        self._added = 0  # observations ever added
        self._shape_at = 0  # ... when the shape was last fitted
        self._curves: dict[tuple[float, int], list[LoaderPrediction]] = {}  # until the next fit
        self._prior = _PRIOR
        """The shape fit's prior: the default, or the shape kept by :meth:`keep_recent`."""
        self._unfitted = 0  # observations added since the last fit

    def keep_recent(self, n: int, *, keep_shape: bool = False) -> None:
        """Forgets all but the ``n`` most recent observations and refits from them alone: the
        job's costs changed (its pipeline, its data), and older windows describe another job.

        ``keep_shape``: the curve's shape as fitted on all the windows (the share of the cores
        the workers get, the knees' sharpness: how the node shares its cores and how loading
        overlaps the step, which a pipeline's cost does not change) becomes the shape fit's
        prior, so the recent windows refit the costs per sample and the step, and move the
        shape only as far as they show it moved. Without it, a model restarted from a window or
        two takes the default prior's shape (sharp knees, most of the cores), which once
        predicted a job 111% wrong at counts those windows did not see."""
        if n < 1:
            raise PredictorError(f"keep_recent({n}): expected at least 1 observation")
        recent = list(self._obs)[-n:]
        self._obs.clear()
        self._obs.extend(recent)
        old = self._phys
        self._prior = (
            _Physics(eta=old.eta, p=old.p, q=old.q) if keep_shape and self._shape_seen else _PRIOR
        )
        self._phys, self._ridge, self._offset = _Physics(), None, 0.0
        self._shape_seen, self._shape_at, self._added = set(), 0, len(recent)
        self._refit()

    # ------------------------------------------------------------------ fitting

    @property
    def observations(self) -> tuple[LoaderObservation, ...]:
        """The observations the model is fitted on (the most recent 1,000)."""
        return tuple(self._obs)

    def update(self, *observations: LoaderObservation, refit: bool = True) -> None:
        """Adds observations and refits (cost: a few ms for 1,000 observations).

        ``refit=False``: the observations say nothing new (an allocation the model knows, as
        it predicted): they are kept, and the predictions stay as they are until the next
        update with news, or until ``_MAX_UNFITTED`` such observations wait.
        """
        first = not self._obs
        for o in observations:
            if not isinstance(o, LoaderObservation):
                raise PredictorError(f"expected LoaderObservation, got {type(o).__name__}")
            self._obs.append(o)
            self._added += 1
            self._unfitted += 1
        if refit or first or self._unfitted >= _MAX_UNFITTED:
            self._refit()

    def _refit(self) -> None:
        self._curves.clear()
        self._unfitted = 0
        self._fit()

    def _fit(self) -> None:
        obs = list(self._obs)
        if not obs:
            return
        ph = _Physics()
        b = np.array([o.batch_size for o in obs], dtype=float)
        compute = np.array([o.step_s * (1.0 - o.idle_share) for o in obs])
        if len(set(b.tolist())) >= 2:
            a1, a0 = np.polyfit(b, compute, 1)
            ph.a1, ph.a0 = max(float(a1), 1e-9), max(float(a0), 0.0)
        else:
            ph.a1, ph.a0 = max(float(np.median(compute / b)), 1e-9), 0.0
        # Each window's own accelerator rate (its trainer's pace), samples/s, from the same
        # step less data wait that A(b) is fitted from. Where the trainer never waited for
        # data, it is what the window measured: its loader gave at least that much.
        pace = b / np.maximum(compute, 1e-9)
        cpu = [o.cpu_s / o.batch_size for o in obs if o.cpu_s is not None and o.num_workers > 0]
        walls = [  # a worker's wall time per sample without its wait for a CPU, and its CPU
            ((o.fetch_s - (o.cpu_wait_s or 0.0)) / o.batch_size, (o.cpu_s or 0.0) / o.batch_size)
            for o in obs
            if o.fetch_s is not None and o.num_workers > 0
        ]
        serial = [o.step_s * o.idle_share / o.batch_size for o in obs if o.num_workers == 0]
        if cpu:
            ph.t_cpu = max(float(np.median(cpu)), 1e-7)
        # Without worker timings, a loader-bound observation still gives the time per sample
        # of one worker: T ~ k / (t_io + t_cpu) while the accelerator mostly waits.
        bound = [
            o.num_workers / o.samples_per_s
            for o in obs
            if o.num_workers > 0 and o.fetch_s is None and o.idle_share > 0.3
        ]
        if walls:
            # Contention inflates wall time (beyond the measured run-queue wait, where there is
            # one): the least contended observation is closest to t_io.
            ph.t_io = max(min(w - c for w, c in walls), 0.0)
        elif bound:
            per_sample = float(min(bound))
            if cpu:
                ph.t_io = max(per_sample - ph.t_cpu, 0.0)
            else:  # the CPU share is fitted from the curve's shape below
                ph.t_cpu, ph.t_io = per_sample, 0.0
        elif serial:
            per_sample = float(np.median(serial))
            if cpu:
                ph.t_io = max(per_sample - ph.t_cpu, 0.0)
            else:  # nothing tells I/O from CPU: assume CPU (the cautious choice)
                ph.t_cpu, ph.t_io = max(per_sample, 1e-7), 0.0
        ph.eta, ph.p, ph.q = self._prior.eta, self._prior.p, self._prior.q  # until fitted
        if len(obs) >= 2:
            # a new worker count or batch size is news for the shape; the cores a job could
            # use move a little with its neighbours every window, and are not
            allocations = {(o.num_workers, o.batch_size) for o in obs}
            new = not allocations <= self._shape_seen
            if new or self._added >= max(_SHAPE_REFIT_GROWTH * self._shape_at, 10):
                # Refit the shape when an allocation is new, else on a geometric schedule of
                # reports: more reports of known allocations move it less and less (the
                # residual model below is refitted every time).
                self._fit_shape(ph, obs, pace, fit_cpu_share=not cpu, multi_start=new)
                self._shape_seen, self._shape_at = allocations, self._added
            else:
                prev = self._phys
                ph.eta, ph.p, ph.q = prev.eta, prev.p, prev.q
                if not cpu:  # keep the fitted CPU share of a sample
                    per, share = ph.t_io + ph.t_cpu, prev.t_cpu / (prev.t_io + prev.t_cpu)
                    ph.t_cpu, ph.t_io = per * share, per * (1.0 - share)
        self._phys = ph
        resid = np.log(np.array([o.samples_per_s for o in obs])) - np.log(self._physical(obs, pace))
        if len(obs) >= 3:
            ridge = BayesianRidge(fit_intercept=True)
            features = self._features(obs)
            ridge.fit(features, resid)
            self._ridge = ridge
            self._seen_x = float(features[:, 0].min()), float(features[:, 0].max())
        else:  # what the shape cannot explain in a window or two (the ridge's intercept)
            self._ridge = None
            self._offset = float(np.clip(resid.mean(), -_MAX_CORRECTION, _MAX_CORRECTION))

    def _fit_shape(
        self,
        ph: _Physics,
        obs: Sequence[LoaderObservation],
        pace: np.ndarray,
        *,
        fit_cpu_share: bool,
        multi_start: bool,
    ) -> None:
        """Fits ``eta``, ``p``, ``q`` (and, without CPU timings, the CPU share of a sample);
        ``pace``: each observation's own accelerator rate (see :meth:`_physical`)."""
        # Least squares over observations equals least squares over each allocation's mean
        # log throughput weighted by its count: fit the (few) allocations, not every report,
        # each at its windows' own trainer pace (their geometric mean), as in _physical.
        groups: dict[tuple[int, float, int], list[tuple[float, float]]] = {}
        for o, log_pace in zip(obs, np.log(pace), strict=True):
            key = (o.num_workers, o.cores, o.batch_size)
            groups.setdefault(key, []).append((math.log(o.samples_per_s), float(log_pace)))
        k, c = (np.array([g[i] for g in groups], dtype=float) for i in range(2))
        y, log_a = (
            np.array([sum(v[i] for v in g) / len(g) for g in groups.values()]) for i in (0, 1)
        )
        a = np.exp(log_a)
        weight = np.sqrt([len(v) for v in groups.values()])
        per = ph.t_io + ph.t_cpu
        fixed_share = ph.t_cpu / per

        prior = np.log([self._prior.eta, self._prior.p, self._prior.q])

        def resid(x: np.ndarray) -> np.ndarray:
            """Weighted residuals for parameters ``x`` (``[eta, p, q(, share)]``), or for a
            stack of them (``(n, 3 or 4)`` -> ``(n, allocations + 3)``): the allocations',
            then the prior's on ``eta, p, q``."""
            x = np.asarray(x)
            share = x[..., 3, None] if fit_cpu_share else fixed_share
            t_cpu = per * share
            e, sp, sq = (x[..., i, None] for i in range(3))  # each broadcasts over allocations
            tput = self._rates(per - t_cpu, t_cpu, k, c, a, e, sp, sq)
            data = weight * (np.log(tput[1]) - y)
            pull = _PRIOR_WEIGHT * (np.log(x[..., :3]) - prior)
            return np.concatenate([data, pull], axis=-1)

        lo, hi = [0.1, 1.0, 1.0], [1.5, 30.0, 30.0]
        if fit_cpu_share:
            lo, hi = [*lo, 0.01], [*hi, 1.0]
        # The problem has local minima. When an allocation appears that the last fit did not
        # see, start from the best of the previous fit and a coarse grid (evaluated in one
        # vectorised pass); otherwise from the previous fit (another report of a known
        # allocation moves the optimum little).
        prev = self._phys
        warm = np.clip(
            (prev.eta, prev.p, prev.q, prev.t_cpu / max(prev.t_io + prev.t_cpu, 1e-12))[: len(lo)],
            lo,
            hi,
        )
        start = warm
        if multi_start:
            axes = [_GRID_ETA, _GRID_KNEE, _GRID_KNEE] + ([_GRID_SHARE] if fit_cpu_share else [])
            grid = np.vstack([warm, np.array(list(itertools.product(*axes)))])
            start = grid[int(np.argmin((resid(grid) ** 2).sum(axis=1)))]
        # A start far from the optimum can wander for hundreds of evaluations: cap them.
        best = least_squares(resid, start, bounds=(lo, hi), max_nfev=_MAX_NFEV)
        ph.eta, ph.p, ph.q = (float(v) for v in best.x[:3])
        if fit_cpu_share:
            ph.t_cpu = per * float(best.x[3])
            ph.t_io = per - ph.t_cpu

    @staticmethod
    def _rates(
        t_io: float | np.ndarray,
        t_cpu: float | np.ndarray,
        k: np.ndarray,
        c: np.ndarray,
        a: np.ndarray,
        eta: float | np.ndarray,
        p: float | np.ndarray,
        q: float | np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(L, T)``: the loader's rate and the job's throughput (see the module docstring);
        every argument broadcasts."""
        per = t_io + t_cpu
        piped = _soft_min(np.maximum(k, 1e-9) / per, eta * c / t_cpu, q)
        # in-process loading runs on one thread: on less than a core, its CPU work stretches
        serial = t_io + t_cpu / np.minimum(c, 1.0)
        loader = np.where(k >= 1, piped, 1.0 / serial)
        tput = np.where(k >= 1, _soft_min(a, piped, p), 1.0 / (1.0 / a + serial))
        return loader, tput

    def _limits(self, k: np.ndarray, c: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        ph = self._phys
        a = b / (ph.a0 + ph.a1 * b)
        loader, tput = self._rates(ph.t_io, ph.t_cpu, k, c, a, ph.eta, ph.p, ph.q)
        return a, loader, tput

    def _physical(self, obs: Sequence[LoaderObservation], pace: np.ndarray) -> np.ndarray:
        """The physical part's throughput in each observed window, at the trainer's pace in
        that window (``pace``, samples/s: batch over step less data wait), not the job's fitted
        accelerator limit: a window whose trainer was slow (starved of CPU while every job
        started) says nothing of the loader."""
        k = np.array([o.num_workers for o in obs], dtype=float)
        c = np.array([o.cores for o in obs], dtype=float)
        ph = self._phys
        return self._rates(ph.t_io, ph.t_cpu, k, c, pace, ph.eta, ph.p, ph.q)[1]

    def _features(self, obs: Sequence[LoaderObservation]) -> np.ndarray:
        k = np.array([o.num_workers for o in obs], dtype=float)
        c = np.array([o.cores for o in obs], dtype=float)
        b = np.array([o.batch_size for o in obs], dtype=float)
        return self._features_of(k, c, b)

    def _features_of(
        self,
        k: np.ndarray,
        c: np.ndarray,
        b: np.ndarray,
        within: tuple[float, float] = (-4.0, 4.0),
    ) -> np.ndarray:
        """The correction's features; ``within``: the range the loader's log rate (to the
        accelerator's) is held to."""
        a, loader, _ = self._limits(k, c, b)
        x = np.clip(np.log(loader / a), *within)
        return np.column_stack([x, x * x, (k == 0).astype(float)])

    # ------------------------------------------------------------------ predicting

    def _raw(self, k: np.ndarray, c: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...]:
        a, loader, phys = self._limits(k, c, b)
        if self._ridge is not None:
            # The correction is fitted where the windows were: beyond them (a count or cores
            # no window had) it holds at the nearest window's, not its quadratic's. Fitted to
            # windows at 1.25-1.45 cores, one bent the curve down beyond them, to 0.85x at 2
            # cores what it predicted at 1.5, and the policy read the job as needing less CPU.
            features = self._features_of(k, c, b, within=self._seen_x)
            mean, std = self._ridge.predict(features, return_std=True)
            # A correction is a calibration, not a new physics: keep it within a factor ~2.
            mean = np.clip(mean, -_MAX_CORRECTION, _MAX_CORRECTION)
        else:
            mean = np.full_like(phys, self._offset)
            std = np.full_like(phys, _COLD_STD / max(len(self._obs), 1))
        # Never predict more than the accelerator can take.
        return np.minimum(phys * np.exp(mean), a), std, a, loader

    def predict(self, num_workers: int, cores: float, batch_size: int) -> LoaderPrediction:
        """Predicted samples/s with ``num_workers`` workers on ``cores`` cores at ``batch_size``.

        Raises:
            PredictorError: the model has no observation yet, or an argument is out of range.
        """
        return self.predict_curve(num_workers, cores, batch_size)[-1]

    def predict_curve(
        self, max_workers: int, cores: float, batch_size: int
    ) -> list[LoaderPrediction]:
        """:meth:`predict` for every worker count ``0..max_workers`` at once (one evaluation
        of the model: what a policy weighing worker counts needs).

        Raises:
            PredictorError: the model has no observation yet, or an argument is out of range.
        """
        if not self._obs:
            raise PredictorError(
                "LoaderModel.predict needs at least one observation "
                "(see exploration_plan for what to try first)"
            )
        if max_workers < 0 or not cores > 0 or batch_size < 1:
            raise PredictorError(
                f"need num_workers >= 0, cores > 0, batch_size >= 1; got "
                f"num_workers={max_workers}, {cores=}, {batch_size=}"
            )
        cached = self._curves.get((cores, batch_size))
        if cached is not None and len(cached) > max_workers:
            return cached[: max_workers + 1]  # a curve's prefix is the shorter curve
        ks = np.arange(max_workers + 1, dtype=float)
        cs = np.unique(np.append(np.arange(1, math.floor(cores) + 1, dtype=float), cores))
        kk, cc = np.meshgrid(ks, cs, indexing="ij")
        grid = [
            v.reshape(kk.shape)
            for v in self._raw(kk.ravel(), cc.ravel(), np.full(kk.size, batch_size, dtype=float))
        ]
        tput, std, a, loader = grid
        # Monotone: each count gets the best over all smaller allocations (fewer workers or
        # cores); the other parts are those of the allocation asked about (all ``cores``).
        best = np.maximum.accumulate(tput.max(axis=1))
        curve = [
            LoaderPrediction(
                float(best[k]), float(std[k, -1]), float(a[k, -1]), float(loader[k, -1])
            )
            for k in range(max_workers + 1)
        ]
        if cached is None or len(curve) > len(cached):
            self._curves[(cores, batch_size)] = curve
        return list(curve)

    @property
    def cpu_seconds_per_sample(self) -> float:
        """The loader's CPU time per sample (``t_cpu``), as fitted."""
        return self._phys.t_cpu

    @property
    def io_seconds_per_sample(self) -> float:
        """The loader's wait for storage per sample (``t_io``), as fitted."""
        return self._phys.t_io

    def input_rate(self, cores: float, workers: int) -> float:
        """``L(k, c)``: the samples/s the input pipeline alone delivers with ``workers``
        workers on ``cores`` cores, whatever the accelerator takes (what the cluster
        allocator's input curve of the job is made of).

        Raises:
            PredictorError: the model has no observation yet, or an argument is out of range.
        """
        if not self._obs:
            raise PredictorError("LoaderModel.input_rate needs at least one observation")
        if workers < 1 or not (math.isfinite(cores) and cores > 0):
            raise PredictorError(f"need workers >= 1 and cores > 0; got {workers=}, {cores=}")
        ph = self._phys
        k, c = np.array([float(workers)]), np.array([float(cores)])
        loader, _ = self._rates(ph.t_io, ph.t_cpu, k, c, np.array([1.0]), ph.eta, ph.p, ph.q)
        return float(loader[0])

    def workers_for(self, cores: float) -> int:
        """The fewest workers that keep ``cores`` cores busy: each runs ``t_cpu`` of every
        ``t_io + t_cpu`` seconds (an I/O-bound loader needs many workers a core).

        Raises:
            PredictorError: the model has no observation yet, or ``cores`` is not positive.
        """
        if not self._obs:
            raise PredictorError("LoaderModel.workers_for needs at least one observation")
        if not (math.isfinite(cores) and cores > 0):
            raise PredictorError(f"need cores > 0; got {cores=}")
        ph = self._phys
        busy = ph.t_cpu / max(ph.t_cpu + ph.t_io, 1e-12)
        return max(math.ceil(cores / max(busy, 1e-3) - 1e-9), 1)

    def accelerator_limit(self, batch_size: int) -> float:
        """``A(b)``: the job's samples/s when data is never late."""
        ph = self._phys
        return batch_size / (ph.a0 + ph.a1 * batch_size)

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, object]:
        """Plain, JSON-compatible form (observations included, so a reload refits exactly)."""
        out: dict[str, object] = {
            "kind": _KIND,
            "version": _VERSION,
            "observations": [asdict(o) for o in self._obs],
        }
        if self._prior is not _PRIOR:  # a shape kept across a change of costs
            out["shape_prior"] = [self._prior.eta, self._prior.p, self._prior.q]
        return out

    @classmethod
    def from_dict(cls, payload: dict[str, object]) -> LoaderModel:
        """Inverse of :meth:`to_dict`; unknown versions raise :class:`PredictorError`."""
        check_payload(payload, _KIND, _VERSION)
        raw = payload.get("observations")
        if not isinstance(raw, list):
            raise PredictorError(f"loader model payload has observations={raw!r}, expected a list")
        model = cls()
        shape = payload.get("shape_prior")
        if shape is not None:
            if not (
                isinstance(shape, list)
                and len(shape) == 3
                and all(isinstance(x, (int, float)) and math.isfinite(x) for x in shape)
                and 0.1 <= shape[0] <= 1.5
                and all(1.0 <= x <= 30.0 for x in shape[1:])
            ):
                raise PredictorError(
                    f"loader model payload has shape_prior={shape!r}, expected [eta, p, q] "
                    "with eta within [0.1, 1.5] and p, q within [1, 30]"
                )
            model._prior = _Physics(eta=float(shape[0]), p=float(shape[1]), q=float(shape[2]))
        try:
            obs = [LoaderObservation(**o) for o in raw]
        except TypeError as exc:
            raise PredictorError(f"invalid loader observation in payload: {exc}") from None
        if obs:
            model.update(*obs)
        return model


def exploration_plan(
    observed: Iterable[LoaderObservation],
    *,
    cores: int,
    max_workers: int,
    min_workers: int = 0,
    idle_floor: float = 0.02,
    start: int | None = None,
) -> int | None:
    """The next worker count to try for a job the model knows little about, or ``None``.

    The plan: 1 worker (a worker's own rate and CPU per sample), then the core count (where
    CPU-bound loaders saturate), then doubling (2x, 4x the cores, ...) up to ``max_workers``:
    I/O-bound loaders keep gaining far beyond the core count. With ``start`` (a running job's
    current count) the plan begins there and only doubles upward, so that exploring never
    takes workers away from a job that needs them (each worker's timings already give its own
    rate). It stops early once an observed allocation left the accelerator idle less than
    ``idle_floor`` of the time (more workers cannot help), or when the last doubling gained
    less than 5% (a job that started above the core count is then also tried at the core
    count, where CPU-bound loaders saturate). Counts already observed are skipped; every
    count is clamped to ``[min_workers, max_workers]``.
    """
    seen = {o.num_workers: o for o in observed}
    if any(o.idle_share < idle_floor for o in seen.values()):
        return None
    plan = [1, cores] if start is None else [max(start, 1)]
    k = cores * 2 if start is None else max(start, 1) * 2
    while k < max_workers:
        plan.append(k)
        k *= 2
    plan.append(max_workers)
    previous: LoaderObservation | None = None
    for k in plan:
        k = min(max(k, min_workers), max_workers)
        if k in seen:
            o = seen[k]
            if (
                previous is not None
                and (k > 2 * cores or start is not None)
                and (o.samples_per_s < 1.05 * previous.samples_per_s)
            ):
                # Doubling no longer pays. A job that started above the core count may be
                # CPU-bound and saturate at the cores: one look there shows where the knee is.
                knee = min(max(cores, min_workers), max_workers)
                if start is not None and start > cores and knee not in seen:
                    return knee
                return None
            previous = o
            continue
        return k
    return None
