"""benchmarks/loader/bench_memory.py at a small size: it runs, writes its table data and plot,
and the list's workers hold more private memory than the StringArray's: about what the list holds
in the trainer (its pages, copied as reading touches their reference counts), over a baseline
a worker has either way (torch, the interpreter: 7-17 MiB depending on the machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.loader import bench_memory


@pytest.mark.integration
def test_bench_memory_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, plot = tmp_path / "bench_memory.json", tmp_path / "bench_memory.png"
    argv = ["--paths", "150000", "--workers", "1", "--seconds", "2"]
    assert bench_memory.main([*argv, "--out-dir", str(tmp_path)]) == 0
    data = json.loads(out.read_text())
    runs = data["runs"]
    assert set(runs) == {"list/1", "StringArray/1"}
    copied = runs["list/1"]["worker_uss_mib"] - runs["StringArray/1"]["worker_uss_mib"]
    assert copied > 0.5 * data["list_mib"] > 0
    assert plot.stat().st_size > 0
    assert "USS per worker" in capsys.readouterr().out
