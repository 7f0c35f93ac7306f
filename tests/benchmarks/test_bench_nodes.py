"""benchmarks/predictor/bench_nodes.py on one application: every node count measured is held
out and predicted by both models, the per-node model is the closer at 2 nodes (where the
parametric one predicts bert's steps ~28% short), and the table, JSON and plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.predictor import bench_nodes

pytestmark = pytest.mark.integration  # the machine line reads `uname`


def test_bench_nodes_on_bert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_nodes.main(["--apps", "bert", "--out-dir", str(tmp_path)]) == 0
    errors = json.loads((tmp_path / "bench_nodes.json").read_text())["errors"]["bert"]
    assert set(errors) == {"parametric", "per-node"}
    assert set(errors["parametric"]) == set(errors["per-node"]) >= {"1", "2", "4", "8"}
    plain, fixed = (np.median(np.abs(errors[m]["2"])) for m in ("parametric", "per-node"))
    assert fixed < 0.5 * plain
    assert (tmp_path / "bench_nodes.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "bert | parametric |" in out and "per-node |" in out


def test_bench_nodes_refuses_an_unknown_application(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_nodes.main(["--apps", "bert,resnet"])
    assert "--apps='bert,resnet': expected some of" in capsys.readouterr().err
