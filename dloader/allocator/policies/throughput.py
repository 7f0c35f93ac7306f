"""A job's predicted throughput for the policies: per GPU count and batch size, with gradient
accumulation where a local batch exceeds what a GPU holds, on a placement of some nodes."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dloader.errors import AllocatorError
from dloader.predictor import ScalingModel, ScalingStack

__all__ = [
    "ScalingThroughput",
    "batch_grid",
    "placed_throughput",
    "throughput_fn",
]


def throughput_fn(
    model: ScalingModel,
    gpus_per_node: int,
    local_bsz_range: tuple[int, int],
    *,
    accumulate: bool = True,
) -> ScalingThroughput:
    """Samples/s over (GPUs, global batch) from a scaling model, on ``ceil(k / node)`` nodes.

    A local batch ``b / k`` above the largest per-GPU batch is split into ``a`` micro-batches of
    equal size, the step then costs ``(a - 1)`` extra computations (infeasible, NaN, unless
    ``accumulate``); a local batch below the smallest is infeasible.
    """
    return ScalingThroughput(model, gpus_per_node, local_bsz_range, accumulate)


@dataclass(frozen=True, eq=False)
class ScalingThroughput:
    """:func:`throughput_fn`'s function; the optimizer evaluates many at once
    (:meth:`evaluate_many`)."""

    model: ScalingModel
    gpus_per_node: int
    local_bsz_range: tuple[int, int]
    accumulate: bool = True

    def __call__(self, gpus: np.ndarray, batch: np.ndarray) -> np.ndarray:
        k = np.asarray(gpus, dtype=float)
        nodes = np.ceil(k / self.gpus_per_node)
        return placed_throughput(
            self.model, nodes, k, batch, self.local_bsz_range, accumulate=self.accumulate
        )

    @staticmethod
    def evaluate_many(
        fns: Sequence[ScalingThroughput], gpus: np.ndarray, batch: np.ndarray
    ) -> np.ndarray:
        """``out[j, i, m] = fns[j](gpus[j, i], batch[j, m])``, in one broadcast."""
        per = np.array([f.gpus_per_node for f in fns], dtype=float)[:, None, None]
        lo, hi = np.array([f.local_bsz_range for f in fns], dtype=float).T[:, :, None, None]
        most = np.array([math.inf if f.accumulate else 1.0 for f in fns])[:, None, None]
        k = np.asarray(gpus, dtype=float)[:, :, None]
        b = np.asarray(batch, dtype=float)[:, None, :]
        stack = ScalingStack([f.model for f in fns])
        return _placed(stack, np.ceil(k / per), k, b, lo, hi, most)


def placed_throughput(
    model: ScalingModel,
    nodes: np.ndarray,
    gpus: np.ndarray,
    batch: np.ndarray,
    local_bsz_range: tuple[int, int],
    *,
    accumulate: bool = True,
) -> np.ndarray:
    """Samples/s of ``gpus`` GPUs over ``nodes`` nodes at global batch ``batch``, broadcasting
    (the accumulation rule of :func:`throughput_fn`; NaN where infeasible)."""
    lo, hi = local_bsz_range
    return _placed(model, nodes, gpus, batch, lo, hi, math.inf if accumulate else 1.0)


def _placed(
    model: ScalingModel | ScalingStack,
    nodes: np.ndarray,
    gpus: np.ndarray,
    batch: np.ndarray,
    lo: float | np.ndarray,
    hi: float | np.ndarray,
    most: float | np.ndarray,
) -> np.ndarray:
    k = np.asarray(gpus, dtype=float)
    b = np.asarray(batch, dtype=float)
    local = b / k
    accum = np.maximum(np.ceil(local / hi - 1e-9), 1.0)
    micro = local / accum
    step = model.step_times(nodes, k, micro) + (accum - 1.0) * model.compute_times(micro)
    return np.where((micro >= lo * (1 - 1e-9)) & (accum <= most), b / step, np.nan)


def batch_grid(lo: int, hi: int, n: int = 12, extra: Sequence[int] = ()) -> tuple[int, ...]:
    """``n`` global batch sizes spaced geometrically over ``[lo, hi]``, plus ``extra`` in range."""
    if not 1 <= lo <= hi:
        raise AllocatorError(f"batch range [{lo}, {hi}] is invalid")
    grid = _geometric(lo, hi, n)
    if all(b in grid or not lo <= b <= hi for b in extra):
        return grid
    return tuple(sorted({*grid, *(b for b in extra if lo <= b <= hi)}))


@functools.lru_cache(maxsize=1024)
def _geometric(lo: int, hi: int, n: int) -> tuple[int, ...]:
    return tuple(sorted({round(x) for x in np.geomspace(lo, hi, n)})) if hi > lo else (lo,)
