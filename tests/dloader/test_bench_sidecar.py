"""benchmarks/bench_sidecar.py on the real-pipeline mix at a small size (200 JPEGs, runs of
seconds): every run completes, the table, summary and plot are written, and each job of the mix
moved samples in each run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_sidecar


@pytest.mark.slow
@pytest.mark.integration
def test_bench_sidecar_real_mix_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--mix", "real", "--quick", "--jpegs", "200", "--out-dir", str(tmp_path)]
    argv += ["--seconds", "14", "--window", "6", "--grid-seconds", "6"]
    assert bench_sidecar.main(argv) == 0
    data = json.loads((tmp_path / "bench_sidecar_real.json").read_text())
    names = [row[0] for row in data["rows"]]
    assert names[:3] == ["no sidecar (4 each)", "even, budget 12", "adaptive, budget 12"]
    assert names[3].startswith("static best, budget 12: ")
    for name, total, per in data["rows"]:
        assert set(per) == {"image_jpeg", "text_pack", "remote_read"}, name
        assert all(p["samples_per_s"] > 0 for p in per.values()), (name, per)
        assert 0 < total <= 3.3, (name, total)
    summary = data["summary"]["12"]
    assert set(summary["prediction_error"]) == {"image_jpeg", "text_pack", "remote_read"}
    assert summary["adaptive_vs_even_same_budget"] > 0
    assert (tmp_path / "bench_sidecar_real.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "adaptive / the better of" in out and "machine:" in out
