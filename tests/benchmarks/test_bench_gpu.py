"""benchmarks/gpu/bench_gpu.py's harness at a small size, with the emulated step (CI has no GPU):
every run completes and the tables, JSON, plot and the sidecar's view are written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import bench_gpu


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)  # 7 timed runs of 5-10 s, each a fresh process: 67 s here, >120 s in CI
def test_bench_gpu_harness(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--device", "emulated", "--seconds", "5", "--warmup", "2", "--sidecar-seconds", "10"]
    argv += ["--counts", "1,2", "--splits", "1/1", "--budget", "2", "--out-dir", str(tmp_path)]
    assert bench_gpu.main(argv) == 0
    data = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert set(data["single"]) == {"torch 1", "dloader 1", "torch 2", "dloader 2", "dloader auto"}
    assert set(data["same_count"]) == {"1", "2"} and all(r > 0 for r in data["same_count"].values())
    auto = data["single"]["dloader auto"]["jobs"]["image_jpeg"]
    assert auto["samples_per_s"] > 0 and auto["tuner"].startswith("auto: ")
    assert set(data["pair"]) == {"static 1/1", "sidecar"} and data["sidecar_vs_best_static"] > 0
    assert "dloaderctl status" in (tmp_path / "bench_gpu_sidecar_view.txt").read_text()
    assert (tmp_path / "bench_gpu.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "auto / best fixed" in out and "dloader / torch at the same worker count" in out


def test_bench_gpu_says_what_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_gpu.main(["--splits", "0/3", "--out-dir", str(tmp_path)])
    assert "--splits takes splits" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench_gpu.main(["--out-dir", str(tmp_path)]) == 2
        assert "--device emulated runs the harness" in capsys.readouterr().err
