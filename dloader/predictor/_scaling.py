"""Step time of data-parallel training as a function of placement and local batch size.

The model (in the spirit of Pollux, OSDI 2021) splits a step into gradient computation and
gradient synchronisation and lets them overlap::

    T_compute(b)  = alpha_c + beta_c * b                      b: local batch size per GPU
    T_sync(N, R)  = 0                                         R == 1 replica
                  = alpha_n + beta_n * (R - 2)                N == 1 node,  R >= 2 (intra-node)
                  = alpha_r + beta_r * (R - 2)                N >= 2 nodes             (network)
    T_step        = (T_compute**gamma + T_sync**gamma) ** (1 / gamma),   gamma >= 1

``gamma = 1`` means no overlap (the times add); a large ``gamma`` means full overlap (the step
is the slower of the two). Parameters are fitted by bounded least squares on the logarithm of
measured step times (relative error, as the times span orders of magnitude). Measured
synchronisation times can be added as a second set of residuals (``sync_weight``); on the Pollux
traces they make step-time predictions worse (their sync timings are noisy: 2-node placements
synchronise slower than 4-node ones), so the default weight is 0.

**Per node count, where measured.** One network line cannot follow every cluster: on the
Pollux traces, 2-node placements synchronise slower than 4-node ones, and the fitted model
predicts their steps 12-28% short (throughput 14-38% high) while it is within a few percent at
1 and 4 nodes. A fit with ``node_factors=True`` (and every :meth:`ScalingModel.fit_observed`)
keeps, for each node count it has points at, the median ratio of measured to predicted step
time; predictions at that count are scaled by it, linearly between measured counts, and left
to the parametric model outside them (:attr:`ScalingModel.parametric` is the model without).

**No sync growth beyond what was measured.** A model learned online
(:meth:`ScalingModel.fit_observed`) keeps the largest replica counts it measured, on one node
and across nodes (``sync_replicas``); beyond them its synchronisation time stays what it is
there, rather than following the fitted slope. Two early points at 2 and 3 replicas fix
``beta_r`` from one noisy difference, and its line extrapolated to 64 replicas told a job that
scales well that 8 GPUs are slower than 4: it never tried (see docs/allocator.md). Held flat,
the prediction is optimistic where nothing was measured (as Pollux's priors are), and the
allocator's cap (at most twice the GPUs measured) bounds how far that optimism reaches before
a measurement corrects it.

No I/O here: inputs are plain values (:mod:`.pollux` reads the Pollux traces).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from dloader.errors import PredictorError, shown
from dloader.predictor._serial import check_payload

__all__ = ["ScalingModel", "ScalingParams", "ScalingPoint", "ScalingStack", "placement_shape"]

_KIND = "scaling"
_VERSION = 1
_EPS = 1e-9
NODE_FACTOR_RANGE = (0.5, 2.0)
"""The most a node count's correction may scale the parametric model's step time (a measured
ratio beyond is clipped: the measurement, not the model, is then the suspect)."""
MAX_NODE_FACTORS = 64
"""Node counts a model keeps corrections for (a payload with more is refused)."""
MAX_REPLICAS = 1 << 20
"""The largest replica count a sync bound (``ScalingModel.sync_replicas``) may name."""


def placement_shape(placement: str | Sequence[int]) -> tuple[int, int]:
    """``(nodes, replicas)`` of a placement: ``"22"`` or ``[2, 2]`` is 2 nodes x 2 GPUs."""
    digits = [int(c) for c in placement] if isinstance(placement, str) else list(placement)
    if not digits or any(d < 0 for d in digits):
        raise PredictorError(f"placement={placement!r} must be GPUs per node, e.g. '22'")
    used = [d for d in digits if d > 0]
    if not used:
        raise PredictorError(f"placement={placement!r} uses no GPU")
    return len(used), sum(used)


@dataclass(frozen=True)
class ScalingPoint:
    """One measured configuration."""

    nodes: int
    replicas: int
    local_bsz: int
    step_time: float
    """Seconds per step."""
    sync_time: float | None = None
    """Seconds of the step spent synchronising gradients, when measured."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.replicas < self.nodes:
            raise PredictorError(
                f"nodes={self.nodes}, replicas={self.replicas}: need 1 <= nodes <= replicas"
            )
        if self.local_bsz < 1:
            raise PredictorError(f"local_bsz={self.local_bsz} must be >= 1")
        if not self.step_time > 0:
            raise PredictorError(f"step_time={self.step_time} must be > 0 seconds")


@dataclass(frozen=True)
class ScalingParams:
    """The fitted parameters (seconds; ``gamma`` is unitless)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def as_array(self) -> np.ndarray:
        """The parameters in declaration order."""
        return np.array(list(asdict(self).values()), dtype=float)


def _compute(p: np.ndarray, bsz: np.ndarray) -> np.ndarray:
    return p[0] + p[1] * bsz


def _sync(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    extra = np.maximum(replicas - 2, 0)
    intra = p[2] + p[3] * extra
    inter = p[4] + p[5] * extra
    return np.where(replicas <= 1, 0.0, np.where(nodes <= 1, intra, inter))


def _step(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray) -> np.ndarray:
    c = np.maximum(_compute(p, bsz), _EPS)
    s = np.maximum(_sync(p, nodes, replicas), 0.0)
    g = p[6]
    # (c^g + s^g)^(1/g), computed stably as max * (1 + (min/max)^g)^(1/g)
    hi, lo = np.maximum(c, s), np.minimum(c, s)
    return hi * (1.0 + (lo / hi) ** g) ** (1.0 / g)


def _sync_gradient(nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
    """d T_sync / d params, one row per point (the sync terms are linear in them)."""
    extra = np.maximum(replicas - 2, 0)
    intra = ((replicas > 1) & (nodes <= 1)).astype(float)
    inter = ((replicas > 1) & (nodes > 1)).astype(float)
    zero = np.zeros_like(extra, dtype=float)
    return np.stack([zero, zero, intra, intra * extra, inter, inter * extra, zero], axis=1)


def _log_step_gradient(
    p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray
) -> np.ndarray:
    """d log T_step / d params, one row per point (the fit's Jacobian, analytic: several
    times faster than finite differences)."""
    raw = _compute(p, bsz)
    c = np.maximum(raw, _EPS)
    s = np.maximum(_sync(p, nodes, replicas), 0.0)
    g = p[6]
    hi = np.maximum(c, s)
    total = 1.0 + (np.minimum(c, s) / hi) ** g  # S / hi**g
    # d log T / d c = c**(g-1) / S, likewise for s; written relative to hi to stay finite
    d_c = np.where(raw > _EPS, (c / hi) ** (g - 1) / (hi * total), 0.0)
    d_s = (s / hi) ** (g - 1) / (hi * total)
    w_c, w_s = (c / hi) ** g / total, (s / hi) ** g / total
    s_log_s = np.where(s > 0, w_s * np.log(np.where(s > 0, s, 1.0)), 0.0)
    log_t = np.log(hi) + np.log(total) / g
    d_g = (w_c * np.log(c) + s_log_s - log_t) / g
    out = _sync_gradient(nodes, replicas) * d_s[:, None]
    out[:, 0] = d_c
    out[:, 1] = d_c * bsz
    out[:, 6] = d_g
    return out


def _sync_bound(points: Sequence[ScalingPoint]) -> tuple[int, int]:
    """The largest replica counts measured on one node and across nodes (the latter: the
    former where no point spans nodes), at least 2 (where a sync time exists at all)."""
    intra = max((p.replicas for p in points if p.nodes == 1), default=1)
    inter = max((p.replicas for p in points if p.nodes > 1), default=0) or intra
    return max(intra, 2), max(inter, 2)


def _factor_table(factors: Mapping[int, float]) -> np.ndarray | None:
    """``table[n]``: the step-time factor at ``n`` nodes (linear between the measured counts,
    1 outside them and at the last index, which every larger count reads); None if none."""
    if not factors:
        return None
    keys = np.array(sorted(factors), dtype=float)
    table = np.ones(int(keys[-1]) + 2)
    inside = np.arange(int(keys[0]), int(keys[-1]) + 1)
    table[inside] = np.interp(inside, keys, [factors[int(k)] for k in keys])
    return table


class _StepTimes:
    """Step and compute times from the parameter array ``_p`` (one model's, or a stack's with
    a leading model axis on every parameter: numpy broadcasts either way) and the per node
    count corrections ``_f`` (None: none; a stack's has the model axis first)."""

    _p: np.ndarray
    _f: np.ndarray | None = None
    _r: np.ndarray | None = None
    """The replica counts the sync terms stop growing at: ``[on one node, across nodes]``
    (a stack's with the model axis second, as ``_p``'s); None: no bound."""

    def step_times(
        self, nodes: np.ndarray, replicas: np.ndarray, local_bsz: np.ndarray
    ) -> np.ndarray:
        """Seconds per step, vectorised over the inputs."""
        n = np.asarray(nodes, dtype=float)
        r = np.asarray(replicas, dtype=float)
        if self._r is not None:  # replicas only enter the sync terms
            r = np.minimum(r, np.where(n <= 1, self._r[0], self._r[1]))
        out = _step(self._p, n, r, np.asarray(local_bsz, dtype=float))
        if self._f is None:
            return out
        index = np.clip(n, 0, self._f.shape[-1] - 1).astype(np.int64)
        if self._f.ndim == 1:
            return out * self._f[index]
        # a stack: each model's row of factors, read at that model's node counts
        index = np.broadcast_to(index, out.shape)
        table = self._f.reshape(self._f.shape[:1] + (1,) * (out.ndim - 1) + self._f.shape[1:])
        return out * np.take_along_axis(table, index[..., None], axis=-1)[..., 0]

    def compute_times(self, local_bsz: np.ndarray) -> np.ndarray:
        """Seconds of gradient computation for one micro-batch: ``alpha_c + beta_c * b``."""
        return _compute(self._p, np.asarray(local_bsz, dtype=float))


class ScalingModel(_StepTimes):
    """Predicts step time and throughput over (nodes, replicas, local batch size).

    Example::

        model = ScalingModel.fit(points)
        model.step_time(nodes=2, replicas=8, local_bsz=64)
        model.throughput(2, 8, 64)       # samples/s = replicas * local_bsz / step_time
    """

    def __init__(
        self,
        params: ScalingParams,
        *,
        num_points: int = 0,
        node_factors: Mapping[int, float] | None = None,
        sync_replicas: tuple[int, int] | None = None,
    ) -> None:
        """``sync_replicas``: ``(on one node, across nodes)``, the replica counts beyond which
        the sync time is held, not extrapolated (None: the fitted lines everywhere)."""
        if sync_replicas is not None:
            if not (
                isinstance(sync_replicas, tuple)
                and len(sync_replicas) == 2
                and all(
                    isinstance(r, (int, np.integer)) and 2 <= r <= MAX_REPLICAS
                    for r in sync_replicas
                )
            ):
                raise PredictorError(
                    f"sync_replicas={shown(sync_replicas)}: expected two replica counts "
                    f"(on one node, across nodes) in [2, {MAX_REPLICAS}]"
                )
            sync_replicas = (int(sync_replicas[0]), int(sync_replicas[1]))
        factors = dict(sorted((node_factors or {}).items()))
        lo, hi = NODE_FACTOR_RANGE
        if len(factors) > MAX_NODE_FACTORS:
            raise PredictorError(
                f"node_factors has {len(factors)} node counts; at most {MAX_NODE_FACTORS}"
            )
        for n, f in factors.items():
            if not isinstance(n, (int, np.integer)) or not 1 <= n <= 1 << 16 or not lo <= f <= hi:
                raise PredictorError(
                    f"node_factors[{n!r}]={f!r}: expected a node count in [1, 65536] "
                    f"and a factor in [{lo}, {hi}]"
                )
        self.params = params
        self.num_points = num_points
        self.node_factors: dict[int, float] = {int(n): float(f) for n, f in factors.items()}
        """Per node count measured: what the parametric step time is multiplied by there."""
        self.sync_replicas = sync_replicas
        self._p = params.as_array()  # hot path: the allocator evaluates it for every job
        self._f = _factor_table(self.node_factors)
        self._r = None if sync_replicas is None else np.array(sync_replicas, dtype=float)

    @property
    def parametric(self) -> ScalingModel:
        """The model without its per node count corrections."""
        if not self.node_factors:
            return self
        return ScalingModel(
            self.params, num_points=self.num_points, sync_replicas=self.sync_replicas
        )

    @property
    def extrapolated(self) -> ScalingModel:
        """Pollux's model: the fitted lines alone, everywhere (no per node count corrections,
        no bound on the sync terms)."""
        if not self.node_factors and self.sync_replicas is None:
            return self
        return ScalingModel(self.params, num_points=self.num_points)

    def with_node_factors(self, points: Sequence[ScalingPoint]) -> ScalingModel:
        """This model's parameters with corrections from ``points``: at each node count, the
        median ratio of measured to parametric step time (clipped to
        :data:`NODE_FACTOR_RANGE`)."""
        if not points:
            return self.parametric
        nodes = np.array([p.nodes for p in points])
        predicted = self.parametric.step_times(
            nodes, np.array([p.replicas for p in points]), np.array([p.local_bsz for p in points])
        )
        ratios = np.log(np.array([p.step_time for p in points]) / predicted)
        lo, hi = NODE_FACTOR_RANGE
        factors = {
            int(n): min(max(math.exp(float(np.median(ratios[nodes == n]))), lo), hi)
            for n in np.unique(nodes)
        }
        if len(factors) > MAX_NODE_FACTORS:  # the nearest counts matter most: keep the fewest
            factors = dict(sorted(factors.items())[:MAX_NODE_FACTORS])
        return ScalingModel(
            self.params,
            num_points=self.num_points,
            node_factors=factors,
            sync_replicas=self.sync_replicas,
        )

    @classmethod
    def fit(
        cls,
        points: Sequence[ScalingPoint],
        *,
        sync_weight: float = 0.0,
        node_factors: bool = False,
    ) -> ScalingModel:
        """Fits the parameters to measured points (at least 2).

        Args:
            points: measured configurations. Points should span the regimes to predict: one
                GPU, one full node, several nodes; the sync terms extrapolate poorly.
            sync_weight: weight of the measured sync times relative to step times (0: unused).
            node_factors: also keep a correction per node count measured
                (:meth:`with_node_factors`).

        Parameters that the points cannot identify (e.g. network terms when every point is on
        one node) stay near zero, so predictions there are optimistic; :meth:`coverage` says
        which regimes the fit has seen.
        """
        if len(points) < 2:
            raise PredictorError(f"ScalingModel.fit needs >= 2 points, got {len(points)}")
        nodes = np.array([p.nodes for p in points], dtype=float)
        replicas = np.array([p.replicas for p in points], dtype=float)
        bsz = np.array([p.local_bsz for p in points], dtype=float)
        step = np.array([p.step_time for p in points], dtype=float)
        has_sync = np.array([p.sync_time is not None and p.replicas > 1 for p in points])
        sync = np.array([p.sync_time or 0.0 for p in points], dtype=float)

        # Start from a straight line through the single-replica points (or all points).
        single = replicas <= 1
        xs, ys = (bsz[single], step[single]) if single.sum() >= 2 else (bsz, step)
        beta0 = max(float(np.polyfit(xs, ys, 1)[0]) if len(set(xs)) > 1 else 0.0, _EPS)
        alpha0 = max(float(np.min(ys) - beta0 * np.min(xs)), _EPS)
        x0 = np.array([alpha0, beta0, 1e-3, 1e-4, 1e-2, 1e-3, 2.0])
        lower = np.array([0, 0, 0, 0, 0, 0, 1.0])
        upper = np.array([np.inf] * 6 + [10.0])
        log_step = np.log(step)
        log_sync = np.log(np.maximum(sync[has_sync], 1e-6))
        reg = 1e-3 / (alpha0 + _EPS)

        def residuals(p: np.ndarray) -> np.ndarray:
            r = np.log(_step(p, nodes, replicas, bsz)) - log_step
            if has_sync.any():
                s = _sync(p, nodes[has_sync], replicas[has_sync])
                r = np.concatenate([r, sync_weight * (np.log(np.maximum(s, 1e-6)) - log_sync)])
            # A whisper of regularisation keeps unidentified terms at zero.
            return np.concatenate([r, reg * p[2:6]])

        def jacobian(p: np.ndarray) -> np.ndarray:
            d_step = _log_step_gradient(p, nodes, replicas, bsz)
            rows = [d_step]
            if has_sync.any():
                s = _sync(p, nodes[has_sync], replicas[has_sync])
                d_sync = _sync_gradient(nodes[has_sync], replicas[has_sync])
                live = (s > 1e-6)[:, None]
                rows.append(np.where(live, sync_weight * d_sync / np.maximum(s, 1e-6)[:, None], 0))
            rows.append(np.eye(7)[2:6] * reg)
            return np.concatenate(rows)

        result = least_squares(residuals, x0, jac=jacobian, bounds=(lower, upper), method="trf")
        model = cls(ScalingParams(*map(float, result.x)), num_points=len(points))
        return model.with_node_factors(points) if node_factors else model

    @classmethod
    def fit_observed(cls, points: Sequence[ScalingPoint]) -> ScalingModel:
        """A model learned online from what a job has run so far (>= 1 point).

        Where the points say nothing the model is optimistic, with Pollux's priors, so that
        the job is tried there and measured: one local batch size seen, the compute time is
        split evenly between the fixed and the per-sample part; no point on several GPUs,
        synchronisation costs nothing; no point on several nodes, the network terms are 1.1x
        the intra-node ones. Beyond the replica counts measured (on one node, across nodes)
        the sync time is held, not extrapolated (``sync_replicas``). The allocator pairs it
        with a cap (at most twice the GPUs seen). At each node count it has points at, the
        model is corrected to them (:meth:`with_node_factors`).
        """
        if not points:
            raise PredictorError("ScalingModel.fit_observed needs >= 1 point")
        if len(points) == 1:
            p = points[0]
            sync = min(p.sync_time or 0.0, 0.9 * p.step_time) if p.replicas > 1 else 0.0
            compute = p.step_time - sync
            intra = sync if p.nodes == 1 else 0.0
            params = ScalingParams(
                compute / 2, compute / (2 * p.local_bsz), intra, 0.0, sync - intra, 0.0, 1.0
            )
        else:
            params = cls.fit(points).params
            sizes = {p.local_bsz for p in points}
            if len(sizes) == 1:
                b = sizes.pop()
                compute = params.alpha_c + params.beta_c * b
                params = replace(params, alpha_c=compute / 2, beta_c=compute / (2 * b))
        if all(p.nodes == 1 for p in points):
            params = replace(
                params,
                alpha_r=max(params.alpha_r, 1.1 * params.alpha_n),
                beta_r=max(params.beta_r, 1.1 * params.beta_n),
            )
        bound = _sync_bound(points)
        return cls(params, num_points=len(points), sync_replicas=bound).with_node_factors(points)

    def step_time(self, nodes: int, replicas: int, local_bsz: float) -> float:
        """Predicted seconds per step."""
        return float(
            self.step_times(np.array([nodes]), np.array([replicas]), np.array([local_bsz]))[0]
        )

    def throughput(self, nodes: int, replicas: int, local_bsz: float) -> float:
        """Predicted samples/s: ``replicas * local_bsz / step_time``."""
        return replicas * local_bsz / self.step_time(nodes, replicas, local_bsz)

    def to_dict(self) -> dict[str, object]:
        """Plain, JSON-compatible form (with a version)."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "params": asdict(self.params),
            "num_points": self.num_points,
            "node_factors": {str(n): f for n, f in self.node_factors.items()},
            "sync_replicas": list(self.sync_replicas) if self.sync_replicas else None,
        }

    @classmethod
    def from_dict(cls, payload: dict[str, object]) -> ScalingModel:
        """Inverse of :meth:`to_dict`; unknown versions raise :class:`PredictorError`."""
        check_payload(payload, _KIND, _VERSION)
        params = payload.get("params")
        if not isinstance(params, dict):
            raise PredictorError(f"scaling model payload has params={params!r}, expected a dict")
        num_points = payload.get("num_points", 0)
        factors = payload.get("node_factors", {})
        if not isinstance(factors, dict) or len(factors) > MAX_NODE_FACTORS:
            raise PredictorError(
                f"scaling model node_factors={shown(factors)}: expected a mapping of at "
                f"most {MAX_NODE_FACTORS} node counts to factors"
            )
        try:
            by_nodes = {int(n): float(f) for n, f in factors.items()}
        except (TypeError, ValueError):
            raise PredictorError(
                f"scaling model node_factors={shown(factors)}: expected node counts "
                "mapped to numbers"
            ) from None
        bound = payload.get("sync_replicas")
        if bound is not None and not (isinstance(bound, list) and len(bound) == 2):
            raise PredictorError(
                f"scaling model sync_replicas={shown(bound)}: expected null or two replica "
                "counts (on one node, across nodes)"
            )
        try:
            return cls(
                ScalingParams(**{k: float(v) for k, v in params.items()}),
                num_points=int(num_points),  # type: ignore[call-overload]
                node_factors=by_nodes,
                sync_replicas=None if bound is None else (bound[0], bound[1]),
            )
        except (TypeError, ValueError) as exc:
            raise PredictorError(
                f"scaling model params {sorted(params)} are invalid: {exc}"
            ) from None


class ScalingStack(_StepTimes):
    """Many models' step times in one evaluation (the allocator's hot path: one broadcast for
    every job instead of a round of numpy calls per job).

    Inputs have a leading axis with one entry per model, then ``extra_dims`` more axes
    (broadcasting); ``stack.step_times(nodes, replicas, bsz)[j]`` equals
    ``models[j].step_times(nodes[j], replicas[j], bsz[j])``.
    """

    def __init__(self, models: Sequence[ScalingModel], *, extra_dims: int = 2) -> None:
        if not models:
            raise PredictorError("ScalingStack needs at least one model")
        p = np.stack([m._p for m in models], axis=1)  # (parameters, models)
        self._p = p.reshape(p.shape + (1,) * extra_dims)
        tables = [m._f for m in models]
        width = max((len(t) for t in tables if t is not None), default=0)
        if width:  # (models, node counts): each model's table, padded with its last entry (1)
            self._f = np.ones((len(models), width))
            for row, t in zip(self._f, tables, strict=True):
                if t is not None:
                    row[: len(t)] = t
        if any(m._r is not None for m in models):  # (2, models): unbounded ones at infinity
            r = np.stack([m._r if m._r is not None else np.full(2, np.inf) for m in models], 1)
            self._r = r.reshape(r.shape + (1,) * extra_dims)
