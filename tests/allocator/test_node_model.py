"""``goodput-dp`` decides on the scaling model corrected per node count (#48 §2), where the
job has measured steps; ``goodput-dp-parametric`` and ``pollux`` on the parametric model."""

from __future__ import annotations

from pathlib import Path

import pytest

from dloader.allocator import Cluster
from dloader.allocator.policies import JobState, make_policy
from dloader.allocator.traces import load_apps
from dloader.predictor import ScalingModel

DATA = Path(__file__).resolve().parents[1] / "data" / "pollux-sim"


@pytest.fixture(scope="module")
def model() -> ScalingModel:
    return load_apps(DATA, ["cifar10"])["cifar10"].model


def _alone(model: ScalingModel) -> list[JobState]:
    return [
        JobState(
            "a", 0.0, model, 4, 512, (128, 1024), (32, 512),
            placement=(4, 0), batch_size=512, age_s=36_000.0,
        )
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["goodput-dp", "goodput-dp-parametric", "pollux"])
def test_a_slow_second_node_is_seen_only_through_the_correction(
    model: ScalingModel, policy: str
) -> None:
    """Alone on two 4-GPU nodes, the job spreads to both on its parametric model; told that its
    steps across two nodes take twice what that model says, ``goodput-dp`` keeps it on one node,
    while ``goodput-dp-parametric`` and ``pollux`` (which ignore the correction) do not."""
    cluster = Cluster.uniform(2, 4)
    plain = make_policy(policy).decide(_alone(model.parametric), cluster).placements["a"]
    assert plain == (4, 4), plain
    slow = ScalingModel(model.params, node_factors={1: 1.0, 2: 2.0})
    got = make_policy(policy).decide(_alone(slow), cluster).placements["a"]
    if policy == "goodput-dp":
        assert sum(1 for g in got if g) == 1, got
    else:
        assert got == (4, 4), got
