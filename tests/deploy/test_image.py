"""The container image, built and run for real (buildah, chroot isolation): the sidecar serves
inside it on a socket in a folder shared with the host, and a job on the host joins it and
receives a directive."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import dloader
from tests.loader import datasets as D

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("buildah") is None, reason="needs buildah (apt)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah with chroot isolation runs as root"),
]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/dloader-elastic/dloader:0.1.0"


@pytest.mark.timeout(1800)
def test_image_builds_and_its_sidecar_serves_a_job_on_the_host(tmp_path: Path) -> None:
    args = [] if os.environ.get("BASE") else ["--local-base"]  # no registry here
    subprocess.run([str(ROOT / "scripts" / "build_image"), *args], check=True, timeout=1700)
    shared = tmp_path / "run"
    shared.mkdir()
    os.chown(shared, 10001, 10001)  # the image's user owns the socket folder, as on a node
    os.chmod(shared, 0o750)
    ctr = subprocess.run(
        ["buildah", "from", IMAGE], check=True, capture_output=True, text=True
    ).stdout.strip()
    daemon = subprocess.Popen(
        [
            "buildah", "run", "--isolation", "chroot", "-v", f"{shared}:/run/dloader", ctr, "--",
            "dloader-sidecar", "--socket=/run/dloader/sidecar.sock",
            "--state-dir=/var/lib/dloader", "--period=0.5", "--policy=even",
            "--worker-budget=3",
        ]
    )  # fmt: skip
    try:
        sock = shared / "sidecar.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert daemon.poll() is None, "the sidecar in the image exited"
            assert time.monotonic() < deadline, "the sidecar in the image did not start"
            time.sleep(0.2)
        loader = dloader.DataLoader(
            D.Range(10**6, sleep_s=0.001),
            batch_size=8,
            num_workers=1,
            max_workers=4,
            sidecar=f"unix://{sock}",
            # workers start from a forkserver: this test runs dloaderctl as a subprocess, and a
            # worker forked from the trainer meanwhile would inherit its exec-status pipe
            multiprocessing_context="forkserver",
            job_name="host-job",
        )
        it = iter(loader)
        agent = loader.sidecar_agent
        assert agent is not None
        deadline = time.monotonic() + 60
        while not (agent.connected.is_set() and agent.job_id):
            next(it)
            assert time.monotonic() < deadline, f"never joined: {agent.last_error}"
        # the sidecar's directive (even split of a 3-worker budget) reaches the running loader
        while loader.num_workers != 3:
            next(it)
            assert time.monotonic() < deadline, f"no directive applied: {loader.num_workers}"
        out = subprocess.run(
            ["dloaderctl", "--socket", str(sock), "jobs", "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "host-job" in out.stdout, out.stdout + out.stderr
        del it
        agent.stop()
    finally:
        daemon.terminate()
        daemon.wait(30)
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
