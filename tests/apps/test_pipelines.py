"""The real pipelines of the testbed (dloader.apps.pipelines) at a small size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dloader.apps import pipelines, testbed

pytest.importorskip("PIL")


def test_jpegs_are_generated_once_and_augmented(tmp_path: Path) -> None:
    files = pipelines.make_jpegs(tmp_path / "j", 6)
    stamp = [f.stat().st_mtime_ns for f in files]
    assert pipelines.make_jpegs(tmp_path / "j", 6) == files  # kept, not rewritten
    assert [f.stat().st_mtime_ns for f in files] == stamp
    ds = pipelines.JpegImages(files, length=12)
    x, i = ds[7]
    assert x.shape == (3, 224, 224) and x.dtype == torch.float32 and i == 1
    assert torch.equal(ds[7][0], x)  # the same index: the same crop and flip
    assert not torch.equal(ds[1][0], x)  # the same file, another crop
    assert -3 < float(x.mean()) < 3
    with pytest.raises(ValueError, match="at least one file"):
        pipelines.JpegImages([])


def test_text_is_packed_and_reads_have_a_tail() -> None:
    text = pipelines.PackedText(10, seq_len=128)
    seq = text[3]
    assert seq.shape == (128,) and seq.dtype == torch.int32 and torch.equal(text[3], seq)
    assert int(seq.max()) < 32000
    reads = pipelines.RemoteReads(200, latency_ms=0.01, slow_share=0.05, slow_ms=1.0)
    assert reads[5].shape == (2,)


@pytest.mark.integration
def test_the_testbed_runs_a_real_pipeline_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLOADER_CACHE", str(tmp_path))
    out = tmp_path / "t.json"
    argv = ["--profile", "image_jpeg", "--jpegs", "8", "--workers", "1", "--seconds", "1"]
    argv += ["--prefetch-factor", "3"]
    assert testbed.main([*argv, "--out", str(out)]) == 0
    run = json.loads(out.read_text())
    assert run["profile"] == "image_jpeg" and run["timeline"]
    assert len(list((tmp_path / "jpegs" / "8").glob("*.jpg"))) == 8


@pytest.mark.parametrize(
    "argv", [["--prefetch-factor", "0"], ["--workers", "0", "--prefetch-factor", "2"]]
)
def test_the_testbed_names_a_bad_prefetch_factor(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        testbed.main(argv)
    assert "--prefetch-factor=" in capsys.readouterr().err
