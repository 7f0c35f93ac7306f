"""Real torchrun: train with 2 processes, stop, restart with 3, then with 1; every index of the
epoch is consumed exactly once and model/optimizer state survives each restart exactly."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.integrations import torchrun

# torchrun restarts: 34 s in CI
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def run(nproc: int, root: Path, log: Path, steps: int | None) -> None:
    args = ["--ckpt-dir", str(root), "--events", str(log)]
    torchrun("train_elastic.py", nproc, *args, *(["--train-steps", str(steps)] if steps else []))


def test_restart_with_other_world_sizes_consumes_each_index_once(tmp_path: Path) -> None:
    root, log = tmp_path / "ckpt", tmp_path / "log"
    run(2, root, log, steps=7)  # 2 ranks x 7 steps x 4 = 56 samples
    run(3, root, log, steps=3)  # 3 x 3 x 4 = 36 more
    run(1, root, log, steps=None)  # the remaining 28, to the end of the epoch

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
