"""Real torchrun: train with 2 processes, stop, restart with 3, then with 1; every index of the
epoch is consumed exactly once and model/optimizer state survives each restart exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # torchrun restarts

SCRIPT = Path(__file__).with_name("train_elastic.py")
ROOT = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, root: Path, log: Path, steps: int | None) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(SCRIPT),
        "--ckpt-dir",
        str(root),
        "--events",
        str(log),
    ]
    if steps is not None:
        cmd += ["--train-steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_restart_with_other_world_sizes_consumes_each_index_once(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    torchrun(2, root, log, steps=7)  # 2 ranks x 7 steps x 4 = 56 samples
    torchrun(3, root, log, steps=3)  # 3 x 3 x 4 = 36 more
    torchrun(1, root, log, steps=None)  # the remaining 28, to the end of the epoch

    events = []
    for f in sorted(tmp_path.glob("log.rank*.jsonl")):
        events += [json.loads(line) for line in f.read_text().splitlines()]
    consumed = Counter(i for e in events if e["event"] == "batch" for i in e["indices"])
    assert sorted(consumed) == list(range(120))
    assert set(consumed.values()) == {1}
    assert any(e["event"] == "epoch_end" for e in events)

    saved = {e["step"]: e["hash"] for e in events if e["event"] == "saved"}
    loaded = [(e["step"], e["hash"]) for e in events if e["event"] == "loaded"]
    assert {step for step, _ in loaded} == {7, 10}
    for step, digest in loaded:  # every rank of the next run loads exactly what was saved
        assert digest == saved[step]
