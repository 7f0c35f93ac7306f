"""Exceptions of the predictor package."""

from __future__ import annotations

__all__ = ["PredictorError"]


class PredictorError(ValueError):
    """Invalid input to a model, or a serialised model that cannot be loaded."""
