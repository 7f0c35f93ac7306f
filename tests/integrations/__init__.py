"""Integration tests with real processes: torchrun, the daemons, the training frameworks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def torchrun(script: str, nproc: int, *args: str, timeout: float = 100) -> None:
    """``torchrun --standalone --nproc-per-node=nproc tests/integrations/<script> args``, in the
    repository root, one thread per process; fails the test with its output's tail.

    Every process of the run (torchrun, the ranks it starts in sessions of their own, their
    loader workers) carries ``RUN_TAG`` in its environment, which is how they are found. Past
    ``timeout`` s (under the test's own limit, so that the failure says why) each gets SIGABRT,
    which Python's faulthandler (on for the run) answers with every thread's stack: a hang fails
    showing where each process stood. A process still alive ``LEFTOVER_GRACE_S`` after torchrun
    ended (a worker that outlived its rank) is killed and fails the run. The output goes to a
    file, not a pipe, so no leftover can hold the test by keeping a pipe open."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(HERE / script),
        *args,
    ]
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONFAULTHANDLER": "1",
        RUN_TAG: tag,
    }
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        why = ""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            why = f"torchrun did not end within {timeout:g} s: the stacks of its processes above"
            _signal_run(tag, signal.SIGABRT)
            time.sleep(3)  # the stacks written
            _signal_run(tag, signal.SIGKILL)
            proc.wait()
        else:
            deadline = time.monotonic() + LEFTOVER_GRACE_S
            while _run_processes(tag) and time.monotonic() < deadline:
                time.sleep(0.2)
            if left := _run_processes(tag):
                _signal_run(tag, signal.SIGKILL)
                why = f"processes of the run outlived it by {LEFTOVER_GRACE_S:g} s: {left}"
            elif proc.returncode != 0:
                why = f"torchrun exited with {proc.returncode}"
        log.seek(0)
        out = log.read().decode(errors="replace")
    assert not why, out[-10000:] + "\n" + why


RUN_TAG = "TORCHRUN_TEST_TAG"  # read back by this helper; not a dloader setting
LEFTOVER_GRACE_S = 10.0


def _run_processes(tag: str) -> dict[int, str]:
    """``pid -> command line`` of the live processes whose environment holds ``RUN_TAG=tag``."""
    return {
        proc.pid: " ".join(proc.info["cmdline"] or ())[:200]
        for proc in psutil.process_iter(["environ", "cmdline"])  # unreadable ones: None
        if (proc.info["environ"] or {}).get(RUN_TAG) == tag
    }


def _signal_run(tag: str, sig: int) -> None:
    for pid in _run_processes(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_ranks() -> None:
    """The end of a job script that every rank reaches: all ranks done before any tears the
    process group down. A rank that destroyed gloo (or exited) while a peer still worked has
    aborted jobs here ("terminate called without an active exception", exit -6). Nothing to do
    without a process group.

    Then the rank leaves at once (``os._exit(0)``, output flushed first): gloo's C++ threads can
    still abort the interpreter's own teardown the same way after the group is destroyed (seen
    about once in 20 FSDP runs on 2 cores; torch's proposed fix, an atexit destroy, was
    abandoned upstream). Everything a job script checks is written before this call."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
