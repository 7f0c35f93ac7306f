"""benchmarks/daemons/bench_state.py at a small size: the state files are built, both daemons
start on each, prune on a copy, and the table, JSON and plot are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.daemons import bench_state


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_bench_state_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--jobs-per-day", "1", "--reports-per-ended-job", "2", "--out-dir", str(tmp_path)]
    assert bench_state.main(argv) == 0
    data = json.loads((tmp_path / "bench_state.json").read_text())
    for kind in ("sidecar", "allocator"):
        pruned, unpruned = data[f"{kind} pruned"], data[f"{kind} unpruned"]
        assert pruned["deleted"] == 0 < unpruned["deleted"]  # a year's history goes
        assert all(s > 0 for s in pruned["start_s"] + unpruned["start_s"])
    assert (tmp_path / "bench_state.png").stat().st_size > 0
    assert "rows pruned" in capsys.readouterr().out
