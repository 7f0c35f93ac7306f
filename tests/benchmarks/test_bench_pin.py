"""benchmarks/loader/bench_pin.py at a small size: both loaders run, the table, JSON and plot are
written, and each mode delivered (the receiver's data pass through the stand-in pin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.loader import bench_pin


@pytest.mark.slow
@pytest.mark.integration
def test_bench_pin_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--steps-ms", "5", "--batches", "20", "--repeats", "1", "--out-dir", str(tmp_path)]
    assert bench_pin.main(argv) == 0
    data = json.loads((tmp_path / "bench_pin.json").read_text())
    runs = data["runs"]["5"]
    assert set(runs) == {"in trainer", "receiver"}
    assert all(r[0]["samples_per_s"] > 0 and 0 <= r[0]["wait"] <= 1 for r in runs.values())
    assert data["ratio"]["5"] > 0
    assert (tmp_path / "bench_pin.png").stat().st_size > 0
    assert "receiver / in trainer" in capsys.readouterr().out


def test_bench_pin_names_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_pin.main(["--steps-ms", "five"])
    assert "--steps-ms='five'" in capsys.readouterr().err
