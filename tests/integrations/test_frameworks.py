"""dloader inside the training frameworks, with the real libraries on 2 CPU processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integrations import torchrun

pytestmark = pytest.mark.integration


def reports(folder: Path, phase: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{phase}.rank*.json"))]


@pytest.mark.parametrize("seedable", [False, True], ids=["generator", "seedable-sampler"])
def test_accelerate_prepare_keeps_dloader_and_accelerates_samples(
    tmp_path: Path, seedable: bool
) -> None:
    pytest.importorskip("accelerate")
    torchrun("accelerate_job.py", 2, "--out", str(tmp_path), *(["--seedable"] if seedable else []))
    ranks = reports(tmp_path, "compare")
    assert len(ranks) == 2
    for case_index in range(3):
        cases = [r["cases"][case_index] for r in ranks]
        for c in cases:
            assert c["is_dloader"]
            assert c["dloader"] == c["accelerate"], c  # batch for batch, both epochs
        n, bs = cases[0]["n"], cases[0]["bs"]
        for epoch in range(2):
            seen = Counter(i for c in cases for b in c["dloader"][epoch] for i in b)
            if cases[0]["drop_last"]:
                assert set(seen.values()) == {1}
                assert len(seen) == n - n % (2 * bs)
            else:  # every sample, the padding (accelerate's even_batches) from the start
                assert sorted(seen) == list(range(n))
                assert sum(seen.values()) - n < 2 * bs
    for r in ranks:
        assert r["iterable"]["dloader"] == r["iterable"]["accelerate"]
        assert r["iterable"]["dloader"]
        assert r["skip"]["same_loader"]
        assert len(r["skip"]["batches"]) == 2  # 40 / (2 x 4) = 5 batches, 3 skipped
        assert [len(b) for b in r["changed"]["batches"]] == [4, 4, 4, 4, 8, 8]
        assert r["changed"]["workers"] == 1
        assert r["ends"] == [False, False, False, True]
    changed = Counter(i for r in ranks for b in r["changed"]["batches"] for i in b)
    assert sorted(changed) == list(range(64)) and set(changed.values()) == {1}
    skipped = [i for r in ranks for b in r["skip"]["batches"] for i in b]
    assert len(set(skipped)) == 16


@pytest.mark.timeout(240)  # two torchrun runs, each bounded by the helper's 100 s
def test_accelerate_save_state_load_state_resumes_exactly(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    torchrun("accelerate_job.py", 2, "--out", str(tmp_path), "--phase", "save")
    torchrun("accelerate_job.py", 2, "--out", str(tmp_path), "--phase", "load")
    saved, loaded = reports(tmp_path, "save"), reports(tmp_path, "load")
    for before, after in zip(saved, loaded, strict=True):
        assert after["restored"] == before["rest"]
        assert after["next_epoch"] == before["next_epoch"]
    epoch = Counter(i for s in saved for b in s["first"] + s["rest"] for i in b)
    assert sorted(epoch) == list(range(40)) and set(epoch.values()) == {1}


def test_hf_trainer_trains_on_dloader_and_resumes_exactly(tmp_path: Path) -> None:
    """DLoaderTrainer: the same samples per step and rank as the Trainer's own loader, the
    same weights; stopped at a checkpoint mid-epoch and resumed, the same again."""
    pytest.importorskip("transformers")
    torchrun("trainer_job.py", 2, "--out", str(tmp_path))
    ranks = reports(tmp_path, "trainer")
    assert len(ranks) == 2
    for r in ranks:
        own, mine = r["torch"], r["dloader"]
        assert mine[1] is True  # the training loader was a dloader.DataLoader
        assert mine[0] == own[0] and len(mine[0]) == 14  # 2 epochs x ceil(38 / 6) steps
        assert mine[2] == own[2]  # trained weight
        assert mine[3] == 1.0  # its 2 declared epochs (num_train_epochs) done
        first, resumed = r["first"], r["resumed"]
        assert len(first[0]) == 9 and first[3] is None  # max_steps: no epochs declared
        assert first[0] + resumed[0] == mine[0]
        assert resumed[2] == pytest.approx(mine[2], abs=1e-6)
    for epoch in range(2):
        steps = [b for r in ranks for b in r["dloader"][0][epoch * 7 : (epoch + 1) * 7]]
        seen = Counter(i for b in steps for i in b)
        assert sorted(seen) == list(range(38))  # and 4 padded from the start (42 slots)


def _lightning(tmp_path: Path, phase: str, devices: int) -> list[dict[str, Any]]:
    torchrun(
        "lightning_job.py",
        devices,
        "--out",
        str(tmp_path),
        "--phase",
        phase,
        "--devices",
        str(devices),
    )
    return reports(tmp_path, phase)


def test_lightning_ddp_keeps_dloader_features(tmp_path: Path) -> None:
    """Lightning re-instantiates the loader with its DistributedSampler: it stays a
    dloader.DataLoader with its options, resizes live, and the ranks cover the epoch once."""
    pytest.importorskip("lightning")
    ranks = _lightning(tmp_path, "ddp", 2)
    assert len(ranks) == 2
    for r in ranks:
        assert r["loader"]["class"] == "dloader._dataloader.DataLoader"
        assert r["loader"]["max_workers"] == 2
        assert r["loader"]["sampler"] == "DistributedSampler"
        assert r["loader"]["stats"] and r["loader"]["resized_to"] == 2
        # DeclareEpochs: the trainer's max_epochs (1), done from its first batch to its end
        assert r["loader"]["epochs"] == 1 and 0 < r["loader"]["first_done"] < 1
        assert r["loader"]["done"] == 1.0
    seen = Counter(i for r in ranks for b in r["seen"] for i in b)
    assert sorted(seen) == list(range(60)) and set(seen.values()) == {1}
    assert ranks[0]["weight"] == ranks[1]["weight"]  # DDP kept the replicas equal


@pytest.mark.timeout(240)  # two torchrun runs, each bounded by the helper's 100 s
def test_lightning_elastic_sampler_resumes_mid_epoch_under_another_world_size(
    tmp_path: Path,
) -> None:
    """ElasticDistributedSampler with use_distributed_sampler=False: Lightning saves the loader's
    state in its checkpoint; a run on 3 processes resumes the epoch a 2-process run left at
    step 4, every index once."""
    pytest.importorskip("lightning")
    saved = _lightning(tmp_path, "save", 2)
    resumed = _lightning(tmp_path, "resume", 3)
    assert [len(r["seen"]) for r in saved] == [4, 4]  # 2 x 4 x 3 = 24 samples
    assert all(r["loader"]["epochs"] is None for r in saved)  # max_steps: no length declared
    assert [len(r["seen"]) for r in resumed] == [4, 4, 4]  # the other 36 over 3 ranks
    seen = Counter(i for r in saved + resumed for b in r["seen"] for i in b)
    assert sorted(seen) == list(range(60)) and set(seen.values()) == {1}
