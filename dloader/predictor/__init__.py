"""Throughput models for dloader's decisions. Pure code: plain values in, plain values out.

* :class:`LoaderModel`: a job's samples/s as a function of loader workers, cores and batch size
  (physical model + scikit-learn residual regression, with uncertainty); its cold-start
  :func:`exploration_plan`.
* :class:`ScalingModel`: step time over (nodes, GPUs, local batch size), compute and
  synchronisation with overlap, fitted with scipy; :class:`ScalingStack` evaluates many at once.
* :class:`GradientNoise`: statistical efficiency of a batch size from gradient noise;
  :func:`goodput`.
* :class:`InputModel`: the samples/s a job's input pipeline delivers on ``c`` CPU cores.
* :mod:`dloader.predictor.pollux`: readers for the Pollux traces (I/O kept out of the models).

Every model serialises with ``to_dict()`` / ``from_dict()`` (JSON-compatible, versioned).
"""

from dloader.errors import PredictorError
from dloader.predictor._efficiency import GradientNoise, goodput
from dloader.predictor._input import MAX_INPUT_POINTS, InputModel
from dloader.predictor._loader_model import (
    LoaderModel,
    LoaderObservation,
    LoaderPrediction,
    exploration_plan,
)
from dloader.predictor._scaling import (
    ScalingModel,
    ScalingParams,
    ScalingPoint,
    ScalingStack,
    placement_shape,
)

__all__ = [
    "MAX_INPUT_POINTS",
    "GradientNoise",
    "InputModel",
    "LoaderModel",
    "LoaderObservation",
    "LoaderPrediction",
    "PredictorError",
    "ScalingModel",
    "ScalingParams",
    "ScalingPoint",
    "ScalingStack",
    "exploration_plan",
    "goodput",
    "placement_shape",
]
