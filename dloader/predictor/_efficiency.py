"""Statistical efficiency from gradient-noise statistics, and goodput.

A larger batch gives each step a less noisy gradient, but not proportionally more progress. With
the gradient noise scale ``phi = M0 * var / sqr`` (``sqr``: squared norm of the true gradient,
``var``: trace of the per-batch gradient covariance at the base batch ``M0``), the progress one
sample makes at batch ``M``, relative to one sample at ``M0``, is (McCandlish et al. 2018; Pollux,
OSDI 2021)::

    efficiency(M) = (phi + M0) / (phi + M)          1 at M = M0, falling as M grows

and the useful throughput is ``goodput = throughput * efficiency``. Progress per step, in base
steps (``M0`` samples at full efficiency), is ``(M / M0) * efficiency(M)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dloader.errors import PredictorError

__all__ = ["GradientNoise", "goodput"]


@dataclass(frozen=True)
class GradientNoise:
    """Gradient statistics measured at base batch size ``base_batch``."""

    base_batch: int
    """``M0``: the batch size at which ``sqr`` and ``var`` were measured."""
    sqr: float
    """Squared norm of the expected gradient, ``|E[g]|^2`` (> 0)."""
    var: float
    """Trace of the gradient covariance at ``base_batch`` (>= 0)."""

    def __post_init__(self) -> None:
        if self.base_batch < 1:
            raise PredictorError(f"base_batch={self.base_batch} must be >= 1")
        if not self.sqr > 0 or self.var < 0:
            raise PredictorError(f"need sqr > 0 and var >= 0, got sqr={self.sqr}, var={self.var}")

    @property
    def noise_scale(self) -> float:
        """``phi = M0 * var / sqr``, in samples: the batch size where efficiency is ~halved."""
        return self.base_batch * self.var / self.sqr

    def efficiency(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        """Progress per sample at ``batch_size`` relative to ``base_batch`` (in (0, 1] above it)."""
        phi = self.noise_scale
        result = (phi + self.base_batch) / (phi + np.asarray(batch_size, dtype=float))
        return float(result) if np.ndim(result) == 0 else result

    def progress_per_step(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        """Progress of one step at ``batch_size``, in base steps."""
        b = np.asarray(batch_size, dtype=float)
        result = b / self.base_batch * self.efficiency(b)
        return float(result) if np.ndim(result) == 0 else result


def goodput(throughput: float, noise: GradientNoise, batch_size: float) -> float:
    """Useful samples/s: ``throughput * efficiency(batch_size)``."""
    return throughput * float(noise.efficiency(batch_size))
