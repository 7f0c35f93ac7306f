"""BatchShardSampler (accelerate's whole-batch sharding at a changeable batch size) and
DataLoader.skip_batches, in one process: ranks are simulated by separate loaders."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import RandomSampler, SequentialSampler

import dloader
from dloader.errors import StateError
from dloader.integrations._sharding import BatchShardSampler
from tests.loader import datasets as D


def rank_loaders(n: int, world: int, bs: int, seed: int = 0, drop_last: bool = False):
    loaders = []
    for rank in range(world):
        order = RandomSampler(D.Range(n), generator=torch.Generator().manual_seed(seed))
        sampler = BatchShardSampler(order, world, rank, bs, drop_last)
        loaders.append(dloader.DataLoader(D.Range(n), batch_size=bs, sampler=sampler))
    return loaders


def test_whole_batches_per_rank_and_padding_like_accelerate() -> None:
    loaders = rank_loaders(10, 2, 3)
    got = [[b.tolist() for b in loader] for loader in loaders]
    order = list(RandomSampler(D.Range(10), generator=torch.Generator().manual_seed(0)))
    assert got[0] == [order[0:3], order[6:9]]
    assert got[1] == [order[3:6], [order[9], order[0], order[1]]]  # padded from the start
    assert [len(loader) for loader in loaders] == [2, 2]
    dropped = [[b.tolist() for b in loader] for loader in rank_loaders(10, 2, 3, drop_last=True)]
    assert dropped == [[order[0:3]], [order[3:6]]]


def test_lockstep_batch_size_change_keeps_ranks_disjoint() -> None:
    loaders = rank_loaders(63, 3, 2)  # 3 rounds of 3 x 2, then 3 of 3 x 5: no padding
    its = [iter(loader) for loader in loaders]
    seen: Counter[int] = Counter()
    for step in range(100):
        if step == 2:
            for loader in loaders:
                loader.set_batch_size(5, at_batch=3)
        batches = [next(it, None) for it in its]
        if batches[0] is None:
            assert batches == [None] * 3
            break
        seen.update(i for b in batches for i in b.tolist())
    assert sorted(seen) == list(range(63)) and set(seen.values()) == {1}


def test_state_resumes_under_another_world_size() -> None:
    loaders = rank_loaders(48, 2, 4, seed=7)
    its = [iter(loader) for loader in loaders]
    seen = [i for it in its for _ in range(3) for i in next(it).tolist()]
    states = [loader.state_dict() for loader in loaders]
    assert states[0] == states[1] or states[0]["sampler"] == states[1]["sampler"]
    resumed = rank_loaders(48, 3, 4, seed=123)  # another seed: the state decides the order
    for loader in resumed:
        loader.load_state_dict(states[0])
    seen += [i for loader in resumed for b in loader for i in b.tolist()]
    assert sorted(seen) == list(range(48))


def test_sampler_rejects_bad_arguments_and_states() -> None:
    order = SequentialSampler(D.Range(8))
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval"):
        BatchShardSampler(order, 2, 2, 4)
    with pytest.raises(ValueError, match="batch_size=0"):
        BatchShardSampler(order, 2, 0, 0)
    sampler = BatchShardSampler(order, 2, 0, 4)
    with pytest.raises(StateError, match="version"):
        sampler.load_state_dict({"version": 9})
    state = sampler.state_dict()
    with pytest.raises(StateError, match="total_length"):
        BatchShardSampler(SequentialSampler(D.Range(9)), 2, 0, 4).load_state_dict(state)


@pytest.mark.integration
@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_batches_starts_the_next_epoch_later(num_workers: int) -> None:
    def loader() -> dloader.DataLoader:
        return dloader.DataLoader(
            D.Range(30),
            batch_size=4,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(1),
        )

    full = [b.tolist() for b in loader()]
    skipping = loader()
    skipping.skip_batches(3)
    assert [b.tolist() for b in skipping] == full[3:]
    assert len([b for b in skipping]) == len(full)  # once: the next epoch is whole
    restarted = loader()
    restarted.skip_batches(2)
    it = iter(restarted)
    next(it)
    assert restarted.state_dict()["batches_yielded"] == 3
    with pytest.raises(ValueError, match="num_batches=-1"):
        restarted.skip_batches(-1)
    restarted.load_state_dict(restarted.state_dict())
    with pytest.raises(StateError, match="pending"):
        restarted.skip_batches(1)


def test_skip_batches_on_an_iterable_dataset_replays() -> None:
    full = [b.tolist() for b in dloader.DataLoader(D.Sharded(20), batch_size=3)]
    loader = dloader.DataLoader(D.Sharded(20), batch_size=3)
    loader.skip_batches(2)
    assert [b.tolist() for b in loader] == full[2:]
