"""Integration tests with real processes: torchrun, the daemons, the training frameworks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def torchrun(script: str, nproc: int, *args: str, timeout: float = 240) -> None:
    """``torchrun --standalone --nproc-per-node=nproc tests/integrations/<script> args``, in the
    repository root, one thread per process; fails the test with its output's tail."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(HERE / script),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


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
