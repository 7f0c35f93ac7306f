"""The real pipelines of the testbed (dloader.apps.pipelines) at a small size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dloader.apps import experiment, pipelines, testbed
from dloader.apps.experiment import Arrival

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


def test_a_run_reads_its_jobs_files_before_they_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run of a comparison reads the JPEGs from memory, the first one too: run_jobs
    generates them and reads each through before any job starts, at the ``--jpegs`` the job is
    given (its own arguments come after the run's, so they win, as in the testbed's parser)."""
    monkeypatch.setenv("DLOADER_CACHE", str(tmp_path))
    assert testbed.warm(testbed.PROFILES["io_heavy"], 5) == 0  # reads no files
    assert not (tmp_path / "jpegs").exists()
    read = testbed.warm(testbed.PROFILES["image_jpeg_u8"], 4)
    files = sorted((tmp_path / "jpegs" / "4").glob("*.jpg"))
    assert len(files) == 4 and read == sum(f.stat().st_size for f in files) > 0

    plans = [Arrival("image_jpeg", 1, extra=("--jpegs", "3")), Arrival("io_heavy", 2)]
    experiment._warm(plans, ["--jpegs", "9"])
    assert len(list((tmp_path / "jpegs" / "3").glob("*.jpg"))) == 3
    assert not (tmp_path / "jpegs" / "9").exists()
    with pytest.raises(ValueError, match=r"--jpegs 'many': expected a whole number"):
        experiment._warm([Arrival("image_jpeg", 1)], ["--jpegs=many"])


def test_the_last_value_of_an_option_counts() -> None:
    assert experiment.last_value(["--jpegs", "5", "--seconds", "3", "--jpegs=7"], "--jpegs") == "7"
    assert experiment.last_value(["--jpegs=7", "--jpegs", "5"], "--jpegs") == "5"
    assert experiment.last_value(["--jpegsx", "5", "--jpegs"], "--jpegs") is None
