"""The experiment helpers behind the demo and benchmarks, and the demo itself, for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from dloader.apps.demo import single
from dloader.apps.experiment import run_jobs, score, sidecar_process

pytestmark = pytest.mark.integration


def test_jobs_run_with_a_sidecar_and_are_scored(tmp_path: Path) -> None:
    with sidecar_process(tmp_path / "s", policy="even", worker_budget=2, period_s=0.5) as sc:
        assert sc.target.startswith("unix://") and sc.pid > 0
        results = run_jobs(
            [("gpu_bound", 1, 0.0, 96), ("io_heavy", 1, 0.5, 96)], tmp_path, sidecar=sc.target
        )
    assert set(results) == {"gpu_bound", "io_heavy"}
    assert all(len(r["timeline"]) == 3 for r in results.values())  # 96 samples, batch 32
    total, per = score(results, 0.0, 60.0)
    assert total > 0 and per["gpu_bound"]["normalized"] > 0
    assert (tmp_path / "s" / "state" / "sidecar.db").exists()
    assert "registered" in (tmp_path / "s" / "sidecar.log").read_text()


def test_single_loader_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert single(["--seconds", "1", "--workers", "1", "--grow-to", "3"]) == 0
    out = capsys.readouterr().out
    assert "resize(3)" in out and "set_batch_size(48)" in out and "the throughput" in out


def test_jobs_do_not_outlive_a_killed_harness(tmp_path: Path) -> None:
    """A demo stopped outright once left its 15 job and worker processes running with parent
    1, both cores busy: each job now watches its harness and exits with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    code = (
        "from pathlib import Path; from dloader.apps.experiment import run_jobs; "
        f"run_jobs([('io_heavy', 2, 0.0, None)], Path({str(tmp_path)!r}), seconds=120)"
    )
    harness = subprocess.Popen([sys.executable, "-c", code], cwd=os.getcwd())
    try:
        deadline = time.monotonic() + 60
        jobs: list[psutil.Process] = []
        while not jobs and time.monotonic() < deadline:
            time.sleep(0.2)
            jobs = psutil.Process(harness.pid).children()
        assert jobs, "the job never started"
        tree = [*jobs, *(c for j in jobs for c in j.children(recursive=True))]
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert not alive, [p.pid for p in alive]
    finally:
        harness.kill()


def test_the_demo_refuses_a_length_that_never_ends(capsys: pytest.CaptureFixture[str]) -> None:
    from dloader.apps.demo import main

    for bad in ("nan", "inf", "-5"):
        with pytest.raises(SystemExit):
            main(["--seconds", bad])
        assert "--seconds" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_the_demo_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """#49 §1 (low): dloader-demo left its temporary folder after SIGTERM or SIGKILL. SIGTERM:
    it removes it on the way out; SIGKILL: the next run removes a dead run's folder."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from dloader.apps.demo import run_folder

    demo = subprocess.Popen(
        [sys.executable, "-m", "dloader.apps.demo", "--seconds", "20",
         "--state-dir", str(tmp_path / "state")],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("dloader-demo-*/before")):
            assert time.monotonic() < deadline and demo.poll() is None, "the demo never started"
            time.sleep(0.1)
        demo.send_signal(getattr(signal, how))
        demo.wait(timeout=60)
    finally:
        demo.kill()
    left = list(tmp_path.glob("dloader-demo-*"))
    if how == "SIGTERM":
        assert not left
        return
    assert left  # a killed process removes nothing itself: the next run does
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = run_folder()
    assert list(tmp_path.glob("dloader-demo-*")) == [mine]
