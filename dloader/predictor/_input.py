"""A job's input pipeline as the cluster allocator sees it: the samples/s its data loading can
deliver as a function of the CPU cores it gets on a node.

The model is a curve through the origin, piecewise linear between the points it knows
(``(cores, samples/s)``), and beyond the last point linear through the origin at the last
point's rate per core: a loader with more cores runs more workers, each as fast (what a
sidecar measures is CPU seconds per sample, which does not change with the core count). Below
the first point it is linear through the origin too. It is increasing by construction (each
point's rate is at least the one before).

Where it comes from:

* live, from a node sidecar: the job's loader model predicted at a few core counts
  (``NodeJobReport.input_curve``);
* in the simulator, from what the job ran at: each core count it measured is a point (online
  learning, :mod:`dloader.allocator.simulator`), or from the profile (the oracle).

Pure code: plain values in and out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dloader.errors import PredictorError

__all__ = ["MAX_INPUT_POINTS", "InputModel"]

#: Points an input model keeps at most (a report carries at most this many).
MAX_INPUT_POINTS = 16


@dataclass(frozen=True)
class InputModel:
    """Samples/s a job's input pipeline delivers with ``c`` cores (see the module docstring)."""

    points: tuple[tuple[float, float], ...]
    """``(cores, samples/s)``, cores increasing, each finite and positive."""

    def __post_init__(self) -> None:
        if not self.points or len(self.points) > MAX_INPUT_POINTS:
            raise PredictorError(
                f"an input model needs 1 to {MAX_INPUT_POINTS} points, got {len(self.points)}"
            )
        last_c = last_r = 0.0
        for c, r in self.points:
            if not (math.isfinite(c) and math.isfinite(r) and c > last_c and r > 0):
                raise PredictorError(
                    f"input model point ({c!r}, {r!r}): cores must increase and samples/s "
                    "be finite and positive"
                )
            if r < last_r:
                raise PredictorError(
                    f"input model point ({c!r}, {r!r}): samples/s must not fall as cores grow"
                )
            last_c, last_r = c, r

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]]) -> InputModel:
        """A model through ``points`` (any order; a point at a core count already seen
        replaces it; rates made non-decreasing; the ``MAX_INPUT_POINTS`` of fewest cores
        dropped first when there are more)."""
        by_cores: dict[float, float] = {}
        for c, r in points:
            if c > 0 and r > 0 and math.isfinite(c) and math.isfinite(r):
                by_cores[float(c)] = float(r)
        if not by_cores:
            raise PredictorError("an input model needs a point with cores > 0 and samples/s > 0")
        cores = sorted(by_cores)[-MAX_INPUT_POINTS:]
        out, best = [], 0.0
        for c in cores:
            best = max(best, by_cores[c])
            out.append((c, best))
        return cls(tuple(out))

    @classmethod
    def linear(cls, samples_per_core: float) -> InputModel:
        """A pipeline whose every core delivers ``samples_per_core`` samples/s."""
        return cls(((1.0, samples_per_core),))

    @property
    def samples_per_core(self) -> float:
        """Samples/s per core at the last point (the rate beyond it)."""
        c, r = self.points[-1]
        return r / c

    def rate(self, cores: float) -> float:
        """Samples/s with ``cores`` cores (0 for none)."""
        if cores <= 0:
            return 0.0
        prev_c, prev_r = 0.0, 0.0
        for c, r in self.points:
            if cores <= c:
                return prev_r + (r - prev_r) * (cores - prev_c) / (c - prev_c)
            prev_c, prev_r = c, r
        return cores * self.samples_per_core

    def rates(self, cores: np.ndarray) -> np.ndarray:
        """:meth:`rate` of every entry of ``cores`` at once."""
        c = np.asarray(cores, dtype=float)
        xs = np.array([0.0, *(p[0] for p in self.points)])
        ys = np.array([0.0, *(p[1] for p in self.points)])
        inside = np.interp(c, xs, ys)
        return np.where(c <= 0, 0.0, np.where(c <= xs[-1], inside, c * self.samples_per_core))

    def cores_for(self, samples_per_s: float) -> float:
        """The fewest cores that deliver ``samples_per_s`` (``inf`` for ``inf``)."""
        if samples_per_s <= 0:
            return 0.0
        if not math.isfinite(samples_per_s):
            return math.inf
        prev_c, prev_r = 0.0, 0.0
        for c, r in self.points:
            if samples_per_s <= r:
                if r == prev_r:
                    return prev_c
                return prev_c + (c - prev_c) * (samples_per_s - prev_r) / (r - prev_r)
            prev_c, prev_r = c, r
        return samples_per_s / self.samples_per_core

    def to_dict(self) -> dict[str, object]:
        """JSON-compatible."""
        return {"points": [list(p) for p in self.points]}

    @classmethod
    def from_dict(cls, payload: dict[str, object]) -> InputModel:
        """Inverse of :meth:`to_dict`."""
        try:
            raw = payload["points"]
            return cls(tuple((float(c), float(r)) for c, r in raw))  # type: ignore[attr-defined]
        except (KeyError, TypeError, ValueError) as exc:
            raise PredictorError(f"input model payload {payload!r}: {exc}") from None
