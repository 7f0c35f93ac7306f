"""The input model: samples/s a job's pipeline delivers on c cores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dloader.predictor import MAX_INPUT_POINTS, InputModel, PredictorError


def test_piecewise_linear_through_the_origin_and_linear_beyond() -> None:
    m = InputModel(((1.0, 100.0), (3.0, 240.0)))
    assert m.rate(0) == 0.0
    assert m.rate(0.5) == pytest.approx(50.0)
    assert m.rate(2.0) == pytest.approx(170.0)
    assert m.rate(6.0) == pytest.approx(480.0)  # 80 per core, the last point's rate
    for samples in (10.0, 100.0, 170.0, 240.0, 1000.0):
        assert m.rate(m.cores_for(samples)) == pytest.approx(samples)
    assert m.cores_for(0) == 0.0
    assert m.cores_for(math.inf) == math.inf
    assert m.samples_per_core == pytest.approx(80.0)


def test_rates_of_many_core_counts_at_once_are_each_rate() -> None:
    m = InputModel(((1.0, 100.0), (3.0, 240.0)))
    cores = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 40.0])
    assert m.rates(cores).tolist() == pytest.approx([m.rate(float(c)) for c in cores])
    assert m.rates(np.array([[0.5, 6.0]])).shape == (1, 2)


def test_of_sorts_keeps_the_newest_per_count_and_never_falls() -> None:
    m = InputModel.of([(4.0, 300.0), (1.0, 100.0), (2.0, 90.0), (1.0, 120.0), (0.0, 5.0)])
    assert m.points == ((1.0, 120.0), (2.0, 120.0), (4.0, 300.0))
    many = InputModel.of((float(c), 10.0 * c) for c in range(1, 40))
    assert len(many.points) == MAX_INPUT_POINTS
    assert many.points[-1] == (39.0, 390.0)  # the most cores kept
    assert InputModel.linear(50.0).rate(3.0) == pytest.approx(150.0)


@pytest.mark.parametrize(
    "points",
    [
        (),
        ((1.0, -1.0),),
        ((1.0, 10.0), (1.0, 20.0)),  # cores must increase
        ((1.0, 20.0), (2.0, 10.0)),  # rates must not fall
        ((math.nan, 1.0),),
        tuple((float(c), float(c)) for c in range(1, MAX_INPUT_POINTS + 2)),
    ],
)
def test_bad_points_are_refused(points: tuple[tuple[float, float], ...]) -> None:
    with pytest.raises(PredictorError):
        InputModel(points)


def test_of_needs_one_usable_point_and_round_trips() -> None:
    with pytest.raises(PredictorError, match="cores > 0"):
        InputModel.of([(0.0, 1.0), (1.0, math.inf)])
    m = InputModel(((1.5, 30.0), (3.0, 55.0)))
    assert InputModel.from_dict(m.to_dict()) == m
    with pytest.raises(PredictorError, match="input model payload"):
        InputModel.from_dict({"points": [["x", 1]]})
