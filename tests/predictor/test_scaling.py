"""Scaling model: recovers known curves, predicts unseen Pollux placements, serialises."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dloader.predictor import (
    GradientNoise,
    PredictorError,
    ScalingModel,
    ScalingParams,
    ScalingPoint,
    ScalingStack,
    goodput,
    placement_shape,
)
from dloader.predictor.pollux import read_placements, read_validation

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux"


def synthetic(params: ScalingParams, configs: list[tuple[int, int, int]]) -> list[ScalingPoint]:
    """Points on the model's curve, with the sync time measured as in the Pollux traces."""
    model = ScalingModel(params)
    p = params.as_array()
    return [
        ScalingPoint(
            n,
            r,
            b,
            model.step_time(n, r, b),
            None if r == 1 else (p[2] + p[3] * (r - 2) if n == 1 else p[4] + p[5] * (r - 2)),
        )
        for n, r, b in configs
    ]


TRUE = ScalingParams(
    alpha_c=0.01, beta_c=0.002, alpha_n=0.005, beta_n=0.001, alpha_r=0.05, beta_r=0.004, gamma=2.5
)


def test_placement_shape() -> None:
    assert placement_shape("22") == (2, 4)
    assert placement_shape("1") == (1, 1)
    assert placement_shape([4, 0, 2]) == (2, 6)
    with pytest.raises(PredictorError, match="placement=''"):
        placement_shape("")
    with pytest.raises(PredictorError, match="uses no GPU"):
        placement_shape("00")


def test_fit_recovers_a_known_curve() -> None:
    train = [(1, 1, 16), (1, 1, 64), (1, 4, 32), (2, 4, 32), (4, 16, 32), (1, 2, 128)]
    model = ScalingModel.fit(synthetic(TRUE, train), sync_weight=0.5)
    for n, r, b in [(1, 1, 128), (1, 3, 64), (2, 8, 64), (4, 16, 16), (3, 12, 100)]:
        want = ScalingModel(TRUE).step_time(n, r, b)
        assert model.step_time(n, r, b) == pytest.approx(want, rel=0.05)


def test_throughput_and_monotone_compute() -> None:
    model = ScalingModel(TRUE)
    assert model.throughput(2, 8, 64) == pytest.approx(8 * 64 / model.step_time(2, 8, 64))
    times = model.step_times(np.ones(5), np.ones(5), np.array([8, 16, 32, 64, 128]))
    assert np.all(np.diff(times) > 0)
    # Going multi-node costs synchronisation.
    assert model.step_time(2, 4, 32) > model.step_time(1, 4, 32)


def test_fit_on_five_pollux_placements_predicts_the_rest() -> None:
    rows = read_placements(DATA / "cifar10")
    train_placements = {"1", "4", "22", "1111", "4444"}  # one GPU, a node, 2 and 4 nodes
    train = [p for name, p in rows if name in train_placements]
    test = [p for name, p in rows if name not in train_placements]
    model = ScalingModel.fit(train)
    errors = [
        abs(model.step_time(p.nodes, p.replicas, p.local_bsz) / p.step_time - 1) for p in test
    ]
    assert len(test) > 40
    assert float(np.median(errors)) < 0.15


def test_bad_points_and_fits_are_refused() -> None:
    with pytest.raises(PredictorError, match="need 1 <= nodes <= replicas"):
        ScalingPoint(2, 1, 32, 0.1)
    with pytest.raises(PredictorError, match="step_time=0"):
        ScalingPoint(1, 1, 32, 0.0)
    with pytest.raises(PredictorError, match="needs >= 2 points"):
        ScalingModel.fit([ScalingPoint(1, 1, 32, 0.1)])


def test_serialisation_roundtrip_and_versions() -> None:
    model = ScalingModel.fit(synthetic(TRUE, [(1, 1, 16), (1, 1, 64), (2, 4, 32)]))
    payload = json.loads(json.dumps(model.to_dict()))
    again = ScalingModel.from_dict(payload)
    assert again.step_time(2, 8, 48) == model.step_time(2, 8, 48)
    with pytest.raises(PredictorError, match="version=2 is not supported"):
        ScalingModel.from_dict({**payload, "version": 2})
    with pytest.raises(PredictorError, match="kind='loader'"):
        ScalingModel.from_dict({**payload, "kind": "loader"})
    with pytest.raises(PredictorError, match="must be a dict"):
        ScalingModel.from_dict([])  # type: ignore[arg-type]


def test_efficiency_formula() -> None:
    noise = GradientNoise(base_batch=128, sqr=1.0, var=3.0)  # phi = 384 samples
    assert noise.noise_scale == 384
    assert noise.efficiency(128) == pytest.approx(1.0)
    assert noise.efficiency(384) == pytest.approx((384 + 128) / (384 + 384))
    assert noise.progress_per_step(256) == pytest.approx(2 * (512 / 640))
    assert goodput(1000.0, noise, 384) == pytest.approx(1000 * 512 / 768)
    effs = noise.efficiency(np.array([128, 256, 512, 1024]))
    assert np.all(np.diff(effs) < 0)
    with pytest.raises(PredictorError, match="sqr > 0"):
        GradientNoise(128, 0.0, 1.0)


def test_pollux_validation_reader() -> None:
    rows = read_validation(DATA / "cifar10", 128)
    assert len(rows) == 100 and rows[0].iteration == 390
    with pytest.raises(PredictorError, match="does not exist"):
        read_validation(DATA / "cifar10", 999)


def test_fit_observed_is_optimistic_where_the_points_say_nothing() -> None:
    one = ScalingModel.fit_observed([ScalingPoint(1, 1, 32, 0.2)])
    assert one.params.alpha_c == pytest.approx(0.1) and one.params.beta_c == pytest.approx(0.1 / 32)
    assert one.step_time(1, 4, 32) == pytest.approx(0.2)  # no sync measured: none predicted
    assert one.step_time(1, 1, 64) == pytest.approx(0.3)  # compute split evenly
    # single-node points: the network terms are at least 1.1x the intra-node ones
    points = synthetic(TRUE, [(1, 1, 16), (1, 2, 16), (1, 4, 32), (1, 3, 8)])
    single = ScalingModel.fit_observed(points)
    assert single.params.alpha_r >= 1.1 * single.params.alpha_n > 0
    assert single.step_time(2, 4, 32) >= single.step_time(1, 4, 32)
    # once several nodes were measured, the data decide
    full = synthetic(TRUE, [(1, 1, 16), (1, 1, 64), (1, 4, 32), (2, 8, 32), (4, 16, 64)])
    learned = ScalingModel.fit_observed(full)
    assert learned.step_time(2, 8, 32) == pytest.approx(
        ScalingModel(TRUE).step_time(2, 8, 32), 0.05
    )
    with pytest.raises(PredictorError, match=">= 1 point"):
        ScalingModel.fit_observed([])


@pytest.mark.parametrize("gamma", [1.0, 1.7, 6.0])
def test_the_fit_jacobian_matches_finite_differences(gamma: float) -> None:
    from scipy.optimize import approx_fprime

    from dloader.predictor._scaling import _log_step_gradient, _step

    nodes = np.array([1, 1, 1, 2, 2, 4, 1.0])
    reps = np.array([1, 2, 4, 8, 5, 16, 1.0])
    bsz = np.array([32, 16, 64, 8, 12, 4, 128.0])
    p = np.array([0.05, 0.002, 0.01, 0.003, 0.05, 0.01, gamma])
    analytic = _log_step_gradient(p, nodes, reps, bsz)
    for i in range(len(bsz)):
        numeric = approx_fprime(p, lambda q, i=i: np.log(_step(q, nodes, reps, bsz))[i], 1e-7)
        assert analytic[i] == pytest.approx(numeric, rel=1e-4, abs=1e-6)


def test_a_stack_evaluates_each_model_as_alone() -> None:
    other = ScalingParams(
        alpha_c=0.02, beta_c=0.001, alpha_n=0.01, beta_n=0.0, alpha_r=0.1, beta_r=0.01, gamma=1.2
    )
    models = [ScalingModel(TRUE), ScalingModel(other), ScalingModel(TRUE)]
    nodes = np.array([[[1.0, 1.0]], [[2.0, 4.0]], [[1.0, 3.0]]])  # (models, 1, 2)
    replicas = np.array([[[1.0], [4.0]], [[8.0], [16.0]], [[2.0], [12.0]]])  # (models, 2, 1)
    bsz = np.array([16.0, 64.0, 100.0])[:, None, None]
    stack = ScalingStack(models)
    got, compute = stack.step_times(nodes, replicas, bsz), stack.compute_times(bsz)
    assert got.shape == (3, 2, 2)
    for j, m in enumerate(models):
        np.testing.assert_array_equal(got[j], m.step_times(nodes[j], replicas[j], bsz[j]))
        np.testing.assert_array_equal(compute[j], m.compute_times(bsz[j]))
    with pytest.raises(PredictorError, match="at least one model"):
        ScalingStack([])


def test_node_factors_correct_a_node_count_the_line_misses() -> None:
    """Points whose 2-node steps are 30% slower than the parametric curve (as the Pollux
    traces' are): the plain fit is wrong there; with ``node_factors`` the model follows the
    measurements at each node count, interpolates between them and keeps the parametric
    model outside them (and :attr:`parametric` drops the corrections)."""
    configs = [(1, 1, 16), (1, 1, 64), (1, 4, 32), (2, 4, 32), (2, 8, 64)]
    configs += [(4, 16, 32), (4, 16, 64), (8, 32, 32), (8, 32, 64)]
    points = [
        replace(p, step_time=p.step_time * (1.3 if p.nodes == 2 else 1.0))
        for p in synthetic(TRUE, configs)
    ]
    # on the true parameters, the corrections are exactly the distortion
    exact = ScalingModel(TRUE).with_node_factors(points)
    assert exact.node_factors == pytest.approx({1: 1.0, 2: 1.3, 4: 1.0, 8: 1.0})
    # fitted: the line bends towards the 2-node points; corrected, it follows them closer
    plain = ScalingModel.fit(points)
    fixed = ScalingModel.fit(points, node_factors=True)
    assert sorted(fixed.node_factors) == [1, 2, 4, 8] and not plain.node_factors

    def error(model: ScalingModel) -> float:
        return float(
            np.mean(
                [
                    abs(model.step_time(p.nodes, p.replicas, p.local_bsz) / p.step_time - 1)
                    for p in points
                ]
            )
        )

    assert error(fixed) < 0.8 * error(plain)
    # between measured counts: the factors interpolated; beyond them: the parametric model
    f2, f4 = fixed.node_factors[2], fixed.node_factors[4]
    base = fixed.parametric
    assert not base.node_factors and base.params == fixed.params
    assert fixed.step_time(3, 12, 32) == pytest.approx(base.step_time(3, 12, 32) * (f2 + f4) / 2)
    assert fixed.step_time(16, 64, 32) == pytest.approx(base.step_time(16, 64, 32))
    # a stack reads each model's own factors (and none for a model without)
    stack = ScalingStack([fixed, plain, fixed])
    nodes = np.array([2.0, 2.0, 9.0])[:, None, None]
    got = stack.step_times(nodes, np.full((3, 1, 1), 8.0), np.full((3, 1, 1), 64.0))
    assert got[0, 0, 0] == pytest.approx(fixed.step_time(2, 8, 64))
    assert got[1, 0, 0] == pytest.approx(plain.step_time(2, 8, 64))
    assert got[2, 0, 0] == pytest.approx(fixed.step_time(9, 8, 64))
    # online: a job's own points correct it where it ran
    online = ScalingModel.fit_observed(points[:4])
    assert online.step_time(2, 4, 32) == pytest.approx(points[3].step_time, rel=1e-6)
    # serialised with the model; bad factors named
    again = ScalingModel.from_dict(json.loads(json.dumps(fixed.to_dict())))
    assert again.node_factors == fixed.node_factors
    assert again.step_time(2, 8, 64) == fixed.step_time(2, 8, 64)
    payload = fixed.to_dict()
    for bad, match in [
        ({"2": 5.0}, r"node_factors\[2\]=5.0: expected .* factor in \[0.5, 2.0\]"),
        ({"0": 1.0}, r"node_factors\[0\]=1.0"),
        ({"x": 1.0}, "expected node counts mapped to numbers"),
        ([1.0], "expected a mapping"),
        ({str(n): 1.0 for n in range(1, 100)}, "expected a mapping of at most 64"),
    ]:
        with pytest.raises(PredictorError, match=match):
            ScalingModel.from_dict({**payload, "node_factors": bad})
    # numpy counts (as a simulator's arrays give them) are node counts too
    assert ScalingModel(TRUE, node_factors={np.int64(2): np.float64(1.1)}).node_factors == {2: 1.1}
    # an older payload (no factors) still reads
    del payload["node_factors"]
    assert not ScalingModel.from_dict(payload).node_factors


# the early points of a job that scales well, where two placements across nodes (2 and 3
# replicas) put the network slope at 0.4 s a replica (yolov3 in a Philly draw: the line
# extrapolated to 8 replicas said 8 GPUs over 2 nodes were slower than 4 on one)
STEEP = ScalingParams(0.0, 0.04, 0.15, 0.08, 0.58, 0.40, 1.0)
EARLY = [(1, 1, 16), (1, 2, 16), (1, 4, 32), (2, 2, 16), (2, 3, 16)]


def test_an_online_model_holds_the_sync_time_beyond_the_replicas_it_measured() -> None:
    points = synthetic(STEEP, EARLY)
    learned = ScalingModel.fit_observed(points)
    assert learned.sync_replicas == (4, 3)
    # within what was measured, the fitted lines
    for n, r, b in EARLY:
        assert learned.step_time(n, r, b) == pytest.approx(
            ScalingModel(STEEP).step_time(n, r, b), 1e-3
        )
    # beyond: the sync time at the largest count measured (across nodes: 3; on one node: 4)
    assert learned.step_time(2, 8, 32) == pytest.approx(learned.step_time(2, 3, 32), 1e-9)
    assert learned.step_time(4, 16, 32) == pytest.approx(learned.step_time(2, 3, 32), 0.01)
    assert learned.step_time(1, 8, 32) == pytest.approx(learned.step_time(1, 4, 32), 1e-9)
    # so 8 GPUs over 2 nodes are worth trying; the extrapolated lines (Pollux's) say no
    assert learned.throughput(2, 8, 32) > 1.3 * learned.throughput(1, 4, 32)
    pollux = learned.extrapolated
    assert pollux.sync_replicas is None and not pollux.node_factors
    assert pollux.throughput(2, 8, 32) < learned.throughput(1, 4, 32)
    assert learned.parametric.sync_replicas == (4, 3)  # without the node corrections only
    # no point across nodes: held at the one-node count (the network prior is 1.1x that)
    one_node = ScalingModel.fit_observed(points[:3])
    assert one_node.sync_replicas == (4, 4)
    # a stack holds each model's own bound (and none for a model without)
    stack = ScalingStack([learned, ScalingModel(STEEP), learned])
    nodes = np.array([2.0, 2.0, 1.0])[:, None, None]
    got = stack.step_times(nodes, np.full((3, 1, 1), 8.0), np.full((3, 1, 1), 32.0))
    assert got[:, 0, 0] == pytest.approx(
        [learned.step_time(2, 8, 32), ScalingModel(STEEP).step_time(2, 8, 32),
         learned.step_time(1, 8, 32)]
    )  # fmt: skip


def test_the_sync_bound_is_serialised_and_bad_ones_are_named() -> None:
    learned = ScalingModel.fit_observed(synthetic(STEEP, EARLY))
    again = ScalingModel.from_dict(json.loads(json.dumps(learned.to_dict())))
    assert again.sync_replicas == (4, 3)
    assert again.step_time(2, 8, 32) == learned.step_time(2, 8, 32)
    payload = learned.to_dict()
    assert ScalingModel.from_dict({**payload, "sync_replicas": None}).sync_replicas is None
    for bad in ([1, 3], [4], "4,3", [4, 2.5], [4, 1 << 30]):
        with pytest.raises(PredictorError, match="sync_replicas="):
            ScalingModel.from_dict({**payload, "sync_replicas": bad})
