"""A real one-node Slurm (slurmctld + slurmd with munge, as root): a batch job trains with
dloader.DataLoader, joins the node's sidecar through the TaskProlog's environment and applies
its directive; after the job, the Epilog has ended its loaders at the sidecar."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._daemon import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(shutil.which(c) for c in ("slurmctld", "slurmd", "sbatch", "munged")),
        reason="needs Debian's slurm-wlm and munge",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="a one-node Slurm runs as root here"),
]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

TRAIN = f"""#!{sys.executable}
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
import dloader
from tests.loader import datasets as D
if __name__ == "__main__":
    print("env", os.environ.get("DLOADER_SIDECAR"), os.environ.get("DLOADER_JOB_NAME"), flush=True)
    loader = dloader.DataLoader(D.Range(10**6, sleep_s=0.001), batch_size=8, num_workers=1,
                                max_workers=4, multiprocessing_context="forkserver")
    it = iter(loader)
    deadline = time.monotonic() + 60
    while loader.num_workers != 3 and time.monotonic() < deadline:
        next(it)
    print("workers", loader.num_workers, "job", loader.sidecar_agent.job_id, flush=True)
    os.killpg(0, 9)  # as a job that is killed: nobody deregisters; the Epilog must clean up
"""


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[dict[str, str]]:
    host = socket.gethostname().split(".")[0]
    sock = tmp_path / "run" / "sidecar.sock"
    ctl = BIN / "dloaderctl"
    wrapper = tmp_path / "epilog.sh"
    wrapper.write_text(
        f"#!/bin/sh\nexport DLOADER_SOCKET={sock} DLOADER_CTL={ctl}\n"
        f"exec sh {ROOT / 'deploy/slurm/epilog.sh'}\n"
    )
    wrapper.chmod(0o755)
    for d in ("state", "spool"):
        (tmp_path / d).mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"""ClusterName=dloadertest
SlurmctldHost={host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/linear
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp_path}/state
SlurmdSpoolDir={tmp_path}/spool
SlurmctldPidFile={tmp_path}/slurmctld.pid
SlurmdPidFile={tmp_path}/slurmd.pid
SlurmctldLogFile={tmp_path}/slurmctld.log
SlurmdLogFile={tmp_path}/slurmd.log
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
TaskProlog={ROOT / "deploy/slurm/task_prolog.sh"}
Epilog={wrapper}
NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode:
        Path("/run/munge").mkdir(exist_ok=True)
        subprocess.run(["munged", "--force"], check=True, capture_output=True)
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env)
    subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env)
    sidecar = subprocess.Popen(
        [
            sys.executable, "-m", "dloader.sidecar.cli", f"--socket={sock}",
            f"--state-dir={tmp_path / 'sidecar-state'}", "--policy=even", "--worker-budget=3",
            "--period=600",  # no periodic reaping: only the Epilog ends the killed job quickly
        ],
        stderr=open(tmp_path / "sidecar.log", "w"),  # noqa: SIM115 - closed with the process
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while (
            not sock.exists()
            or "idle"
            not in subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
            ).stdout
        ):
            assert time.monotonic() < deadline, (tmp_path / "slurmctld.log").read_text()[-2000:]
            time.sleep(0.5)
        yield {"env": env, "sock": str(sock), "dir": str(tmp_path)}  # type: ignore[misc]
    finally:
        sidecar.terminate()
        sidecar.wait(20)
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        time.sleep(1)
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            p = tmp_path / pid_file
            if p.exists():
                with __import__("contextlib").suppress(ProcessLookupError, ValueError):
                    os.kill(int(p.read_text()), 9)


@pytest.mark.timeout(300)
def test_a_batch_job_joins_the_sidecar_and_the_epilog_cleans_up(slurm: dict) -> None:
    folder = Path(slurm["dir"])
    script = folder / "train.py"
    script.write_text(TRAIN)
    script.chmod(0o755)
    env = {**slurm["env"], "DLOADER_SOCKET": slurm["sock"]}
    sub = subprocess.run(
        ["sbatch", "--wait", "--parsable", "-o", str(folder / "out-%j.txt"), str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    job_id = sub.stdout.strip().split(";")[0]
    out = (folder / f"out-{job_id}.txt").read_text()
    assert f"env unix://{slurm['sock']} slurm-{job_id}-" in out, out
    assert "workers 3 job " in out, out  # joined, and applied the sidecar's directive
    left = subprocess.run(
        [str(BIN / "dloaderctl"), "--socket", slurm["sock"], "jobs", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert f"slurm-{job_id}-" not in left, left  # the Epilog ended the killed job's loader
