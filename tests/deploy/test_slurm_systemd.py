"""The Slurm scripts with the environment Slurm gives them, against a real sidecar; the systemd
unit against the daemon's real command line. (A real one-node Slurm is not run here yet.)"""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dloader.sidecar.cli import parser as sidecar_parser
from dloader.v1 import node_pb2 as pb
from tests.sidecar.conftest import Sidecar, register

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"
CTL = str(Path(sys.executable).parent / "dloaderctl")


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    s = Sidecar(tmp_path)
    yield s
    s.stop()


def run(script: str, sock: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "DLOADER_SOCKET": sock, "DLOADER_CTL": CTL}
    return subprocess.run(
        ["sh", str(SLURM / script)], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def test_task_prolog_exports_the_sidecar_and_a_job_name(sidecar: Sidecar) -> None:
    out = run("task_prolog.sh", sidecar.socket, SLURM_JOB_ID="42", SLURM_STEP_ID="0",
              SLURM_PROCID="3")  # fmt: skip
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        f"export DLOADER_SIDECAR=unix://{sidecar.socket}",
        "export DLOADER_JOB_NAME=slurm-42-0-3",
    ]
    # the line Slurm hands the task is what the loader reads
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())
    from dloader._shared.client import parse_target

    assert parse_target(env["DLOADER_SIDECAR"]) == f"unix://{sidecar.socket}"


def test_task_prolog_without_a_sidecar_exports_nothing(tmp_path: Path) -> None:
    out = run("task_prolog.sh", str(tmp_path / "none.sock"), SLURM_JOB_ID="42")
    assert out.returncode == 0 and out.stdout == ""


def test_epilog_ends_the_jobs_loaders_and_only_those(sidecar: Sidecar) -> None:
    pid = os.getpid()
    for name in ("slurm-42-0-0", "slurm-42-1-0", "slurm-420-0-0", "other"):
        register(sidecar.stub, pid, name=name)
    out = run("epilog.sh", sidecar.socket, SLURM_JOB_ID="42")
    assert out.returncode == 0, out.stderr
    left = sorted(j.name for j in sidecar.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs)
    assert left == ["other", "slurm-420-0-0"]


def test_prolog_and_epilog_never_fail_the_node(tmp_path: Path) -> None:
    for script in ("prolog.sh", "epilog.sh"):
        out = run(script, str(tmp_path / "none.sock"), SLURM_JOB_ID="7")
        assert out.returncode == 0, (script, out.stderr)


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(path)
    return unit


def test_the_systemd_unit_runs_the_real_command_line() -> None:
    unit = _unit(ROOT / "deploy" / "systemd" / "dloader-sidecar.service")
    svc = unit["Service"]
    cmd = shlex.split(svc["ExecStart"])
    assert cmd[0].endswith("/dloader-sidecar")
    args = sidecar_parser().parse_args(cmd[1:])
    assert Path(args.socket).parent == Path("/run") / svc["RuntimeDirectory"]
    assert Path(args.state_dir) == Path("/var/lib") / svc["StateDirectory"]
    assert svc["RuntimeDirectoryMode"] == "0750" and svc["StateDirectoryMode"] == "0700"
    assert svc["KillSignal"] == "SIGTERM"
    if shutil.which("systemd-analyze"):
        out = subprocess.run(
            ["systemd-analyze", "verify", str(ROOT / "deploy/systemd/dloader-sidecar.service")],
            capture_output=True,
            text=True,
        )
        assert "Unknown key" not in out.stderr and "Invalid" not in out.stderr, out.stderr


def test_a_lending_nodes_units_run_the_real_command_lines(capsys) -> None:
    """dloader-ray-node.service runs ``dloader-ray-node`` at the cores the node's environment
    file gives, after the sidecar; the sidecar's drop-in lets it lend, on its own command line."""
    from dloader.apps import raynode
    from dloader.sidecar.config import SidecarDaemonConfig

    systemd = ROOT / "deploy" / "systemd"
    ray = _unit(systemd / "dloader-ray-node.service")
    svc = ray["Service"]
    assert "dloader-sidecar.service" in ray["Unit"]["After"].split()
    cmd = shlex.split(svc["ExecStart"].replace("${DLOADER_LEND_CPUS}", "16"))
    assert cmd[0].endswith("/dloader-ray-node") and svc["User"] != "root"
    assert "RAY_worker_niceness=15" in svc["Environment"]
    assert raynode.main(["--dry-run", "--address=head:6379", "--node-id=gpu-7", *cmd[1:]]) == 0
    assert '"dloader_node:gpu-7": 16' in capsys.readouterr().out

    drop_in = _unit(systemd / "dloader-sidecar.service.d" / "lend.conf")["Service"]
    assert drop_in["EnvironmentFile"] == svc["EnvironmentFile"]  # one file for the node
    *_, start = [line for line in drop_in["ExecStart"].splitlines() if line.strip()]
    base = shlex.split(_unit(systemd / "dloader-sidecar.service")["Service"]["ExecStart"])
    assert shlex.split(start) == [*base, "--lend-cores"]
    args = sidecar_parser().parse_args([*shlex.split(start)[1:], "--allocator=unix:///a.sock"])
    assert SidecarDaemonConfig.resolve(args, None).lend_cores
    if shutil.which("systemd-analyze"):
        unit = str(systemd / "dloader-ray-node.service")
        out = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
        assert "Unknown key" not in out.stderr and "Invalid" not in out.stderr, out.stderr
