"""Both daemons under honest and hostile clients for three minutes (the benchmark's default)
(benchmarks/daemons/bench_soak.py): the operator is answered within 1 s at p99 all the while, and
memory, threads and descriptors stay flat (slow lane)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.daemons import bench_soak

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def test_three_minutes_of_hostile_clients(tmp_path: Path) -> None:
    out = tmp_path / "bench_soak.json"
    argv = ["--seconds", "180", "--window", "45", "--out-dir", str(tmp_path)]
    assert bench_soak.main(argv) == 0
    assert (tmp_path / "bench_soak.png").stat().st_size > 0
    result = json.loads(out.read_text())
    assert result["hostile"] > 1000
    for name in ("sidecar", "allocator"):
        s = result["summary"][name]
        assert s["operator_calls"] > 240, s  # twice a second: 360
        assert s["operator_p99_ms"] < 1000, s
        assert s["fds late"] <= s["fds early"] + 16, s
        assert s["threads late"] <= s["threads early"] + 4, s
        assert s["rss MB late"] <= s["rss MB early"] * 1.25 + 20, s
    assert not [c for c in result["codes"] if c.startswith("operator ")], result["codes"]
