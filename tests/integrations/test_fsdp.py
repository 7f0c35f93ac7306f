"""FSDP2 resharding through dloader.elastic: a ``fully_shard`` model and its Adam state saved by
2 processes and loaded by 3 (CPU, gloo, real torchrun): every parameter and optimizer tensor
equal, each rank holding its new shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.integrations import torchrun

pytestmark = pytest.mark.integration


@pytest.mark.timeout(240)  # two torchrun runs, each bounded by the helper's 100 s
def test_fully_shard_saved_at_world_2_loads_at_world_3(tmp_path: Path) -> None:
    torchrun("fsdp_job.py", 2, "--out", str(tmp_path), "--phase", "save")
    torchrun("fsdp_job.py", 3, "--out", str(tmp_path), "--phase", "load")
    saved = torch.load(tmp_path / "save.pt", weights_only=False)
    loaded = torch.load(tmp_path / "load.pt", weights_only=False)
    assert saved["model"].keys() == loaded["model"].keys() and saved["model"]
    for name, tensor in saved["model"].items():
        assert torch.equal(tensor, loaded["model"][name]), name
    assert saved["optim"]["state"].keys() == loaded["optim"]["state"].keys()
    for name, slots in saved["optim"]["state"].items():
        assert set(slots) == {"step", "exp_avg", "exp_avg_sq"}
        for slot, tensor in slots.items():
            assert torch.equal(tensor, loaded["optim"]["state"][name][slot]), (name, slot)
    shards = [json.loads((tmp_path / f"load.rank{r}.json").read_text()) for r in range(3)]
    assert [s["world"] for s in shards] == [3, 3, 3]
    # the first layer's 33 rows are split 11/11/11 over 3 ranks (16/17 rows over 2 before)
    assert [s["shards"]["0.weight"] for s in shards] == [[11, 7]] * 3
    before = [json.loads((tmp_path / f"save.rank{r}.json").read_text()) for r in range(2)]
    assert [s["shards"]["0.weight"] for s in before] == [[17, 7], [16, 7]]
