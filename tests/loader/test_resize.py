"""Live resize, batch-size changes and resumable state keep every sample exactly once, in order."""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import pytest
import torch
import torch.utils.data as tud

import dloader
from tests.loader import datasets as D

pytestmark = pytest.mark.integration


def expected_order(n: int, seed: int, shuffle: bool) -> list[int]:
    torch.manual_seed(seed)
    return [int(i) for b in tud.DataLoader(D.Range(n), batch_size=1, shuffle=shuffle) for i in b]


def check_contract(make: Any, n: int, *, stop_at: int, seed: int = 3, shuffle: bool = True) -> None:
    """The contract of resumable loaders: save at step ``stop_at``, restore into a new loader
    built by ``make(phase)``, and the two parts together are the uninterrupted epoch."""
    torch.manual_seed(seed)
    first = make(0)
    it = iter(first)
    got = [int(i) for _ in range(stop_at) for i in next(it)]
    state = first.state_dict()
    del it
    torch.manual_seed(seed + 1000)  # the new process's RNG differs: the state must not need it
    second = make(1)
    second.load_state_dict(state)
    got += [int(i) for b in second for i in b]
    assert got == expected_order(n, seed, shuffle)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resize_mid_epoch_keeps_order(num_workers: int) -> None:
    loader = dloader.DataLoader(
        D.Range(200, sleep_s=0.001), batch_size=3, shuffle=True, num_workers=num_workers
    )
    torch.manual_seed(5)
    got: list[int] = []
    plan = {2: 4, 10: 1, 20: 0, 30: 3, 40: 2}
    for step, batch in enumerate(loader):
        got += batch.tolist()
        if step in plan:
            loader.resize(plan[step])
    assert got == expected_order(200, 5, True)
    assert loader.num_workers == 2


def test_resize_from_another_thread_while_waiting() -> None:
    """The sidecar agent resizes from a background thread while the trainer is blocked."""
    loader = dloader.DataLoader(D.Range(300, sleep_s=0.004), batch_size=4, num_workers=1)
    stop = threading.Event()
    sizes = [4, 2, 6, 1, 3]

    def agent() -> None:
        i = 0
        while not stop.is_set():
            loader.resize(sizes[i % len(sizes)])
            i += 1
            time.sleep(0.03)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        got = [int(i) for b in loader for i in b]
    finally:
        stop.set()
        thread.join()
    assert got == list(range(300))


def test_grow_starts_new_workers_that_deliver() -> None:
    loader = dloader.DataLoader(D.Range(400, sleep_s=0.002), batch_size=2, num_workers=1)
    it = iter(loader)
    next(it)
    loader.resize(3)
    seen = set()
    for _ in range(60):
        next(it)
        seen |= {w.slot for w in loader.stats().workers if w.batches > 0}
    assert seen == {0, 1, 2}
    loader.resize(1)
    for _ in range(60):
        next(it)
    assert [w.slot for w in loader.stats().workers] == [0]


def test_resize_zero_switches_to_in_process_and_back() -> None:
    loader = dloader.DataLoader(D.Range(60), batch_size=2, num_workers=2)
    it = iter(loader)
    got = next(it).tolist()
    loader.resize(0)
    for _ in range(12):
        got += next(it).tolist()
        time.sleep(0.05)  # a training step: retired workers exit meanwhile
    assert loader.stats().workers == ()
    loader.resize(2)
    got += [int(i) for b in it for i in b]
    assert got == list(range(60))


def test_resize_before_iteration_applies_to_next_epoch() -> None:
    loader = dloader.DataLoader(D.Range(20), batch_size=2, num_workers=0)
    loader.resize(2)
    assert loader.prefetch_factor == 2
    it = iter(loader)
    next(it)
    assert len(loader.stats().workers) == 2
    assert [int(i) for b in it for i in b] == list(range(2, 20))


def test_iterable_resize_applies_next_epoch_with_warning() -> None:
    loader = dloader.DataLoader(D.Sharded(30), batch_size=2, num_workers=2, persistent_workers=True)
    it = iter(loader)
    first = [int(i) for i in next(it)]
    with pytest.warns(UserWarning, match="applies from the next epoch"):
        loader.resize(3)
    first += [int(i) for b in it for i in b]
    assert sorted(first) == list(range(30))
    second = [int(i) for b in loader for i in b]
    assert sorted(second) == list(range(30))
    assert len(loader.stats().workers) == 3


def test_set_batch_size_is_continuous() -> None:
    loader = dloader.DataLoader(D.Range(100), batch_size=4, num_workers=2, prefetch_factor=2)
    sizes = []
    got: list[int] = []
    for step, batch in enumerate(loader):
        sizes.append(len(batch))
        got += batch.tolist()
        if step == 1:
            loader.set_batch_size(10)
            assert loader.batch_size == 10
    assert got == list(range(100))
    # Documented: up to prefetch_factor * num_workers = 4 dispatched batches keep the old size.
    assert sizes[:2] == [4, 4]
    switch = sizes.index(10)
    assert 2 <= switch <= 2 + 4
    assert all(s == 4 for s in sizes[:switch])
    assert len(loader) == 10


def test_set_batch_size_at_a_batch_switches_ranks_in_lockstep() -> None:
    # Two "ranks" with different prefetch depths: switching at the same agreed batch (the
    # most batches either has cut) gives both the same batch boundaries.
    loaders = [
        dloader.DataLoader(D.Range(120), batch_size=4, num_workers=k, prefetch_factor=2)
        for k in (1, 3)
    ]
    its = [iter(x) for x in loaders]
    seqs: list[list[list[int]]] = [[], []]
    for seq, it in zip(seqs, its, strict=True):
        seq += [next(it).tolist() for _ in range(3)]
    at = max(x.batches_cut for x in loaders)
    assert at >= 3
    for x in loaders:
        x.set_batch_size(10, at_batch=at)
    for seq, it in zip(seqs, its, strict=True):
        seq += [b.tolist() for b in it]
    assert seqs[0] == seqs[1]  # same batches, same order
    sizes = [len(b) for b in seqs[0]]
    assert sizes[:at] == [4] * at and sizes[at] == 10
    assert [i for b in seqs[0] for i in b] == list(range(120))
    it = iter(loaders[0])
    next(it)
    with pytest.raises(ValueError, match="at_batch=0 is already dispatched"):
        loaders[0].set_batch_size(8, at_batch=0)


def test_set_batch_size_in_process_applies_next_batch() -> None:
    loader = dloader.DataLoader(D.Range(20), batch_size=3, drop_last=True)
    it = iter(loader)
    assert len(next(it)) == 3
    loader.set_batch_size(5)
    sizes = [len(b) for b in it]
    assert sizes == [5, 5, 5]  # 3 + 15 = 18 samples, the last 2 dropped


def test_set_batch_size_iterable_mid_epoch() -> None:
    loader = dloader.DataLoader(D.Sharded(40), batch_size=2, num_workers=2)
    got: list[int] = []
    for step, batch in enumerate(loader):
        got += batch.tolist()
        if step == 0:
            loader.set_batch_size(5)
    assert sorted(got) == list(range(40))


@pytest.mark.parametrize("stop_at", [0, 1, 7, 33])
def test_state_roundtrip_in_process(stop_at: int) -> None:
    check_contract(
        lambda _: dloader.DataLoader(D.Range(100), batch_size=3, shuffle=True), 100, stop_at=stop_at
    )


def test_state_roundtrip_other_workers_and_batch_size() -> None:
    def make(phase: int) -> dloader.DataLoader[Any]:
        if phase == 0:
            return dloader.DataLoader(D.Range(100), batch_size=3, shuffle=True, num_workers=2)
        return dloader.DataLoader(D.Range(100), batch_size=7, shuffle=True, num_workers=3)

    check_contract(make, 100, stop_at=5)


def test_state_roundtrip_after_live_changes() -> None:
    torch.manual_seed(9)
    loader = dloader.DataLoader(D.Range(90), batch_size=4, shuffle=True, num_workers=2)
    it = iter(loader)
    got = [int(i) for i in next(it)]
    loader.set_batch_size(5)
    loader.resize(1)
    for _ in range(6):
        got += [int(i) for i in next(it)]
    state = loader.state_dict()
    assert state["samples_yielded"] == len(got)
    del it
    fresh = dloader.DataLoader(D.Range(90), batch_size=2, shuffle=True)
    fresh.load_state_dict(state)
    got += [int(i) for b in fresh for i in b]
    assert got == expected_order(90, 9, True)


def test_state_with_user_generator_and_subset_sampler() -> None:
    def gen_loader(_: int) -> dloader.DataLoader[Any]:
        return dloader.DataLoader(
            D.Range(50), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(11)
        )

    torch.manual_seed(0)
    want = [int(i) for b in gen_loader(0) for i in b]
    first = gen_loader(0)
    it = iter(first)
    got = [int(i) for _ in range(3) for i in next(it)]
    second = gen_loader(1)
    second.load_state_dict(first.state_dict())
    got += [int(i) for b in second for i in b]
    assert got == want

    def subset_loader(_: int) -> dloader.DataLoader[Any]:
        return dloader.DataLoader(
            D.Range(50), batch_size=4, sampler=tud.SubsetRandomSampler(list(range(0, 50, 2)))
        )

    torch.manual_seed(4)
    want = [int(i) for b in subset_loader(0) for i in b]
    torch.manual_seed(4)
    first = subset_loader(0)
    it = iter(first)
    got = [int(i) for _ in range(2) for i in next(it)]
    torch.manual_seed(77)
    second = subset_loader(1)
    second.load_state_dict(first.state_dict())
    got += [int(i) for b in second for i in b]
    assert got == want


def test_state_with_user_batch_sampler() -> None:
    def make(_: int) -> dloader.DataLoader[Any]:
        return dloader.DataLoader(
            D.Range(30), batch_sampler=tud.BatchSampler(tud.RandomSampler(D.Range(30)), 4, False)
        )

    check_contract(make, 30, stop_at=3)


def test_state_is_small_and_plain() -> None:
    loader = dloader.DataLoader(D.Range(10**6), batch_size=32, shuffle=True, num_workers=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["sampler"] == {"kind": "seed", "seed": state["sampler"]["seed"]}
    assert all(isinstance(v, (int, bool, str, dict, type(None))) for v in state.values())
    del it


def test_state_at_end_of_epoch_starts_fresh_epoch() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=5)
    list(loader)
    fresh = dloader.DataLoader(D.Range(10), batch_size=5)
    fresh.load_state_dict(loader.state_dict())
    assert [int(i) for b in fresh for i in b] == list(range(10))


def test_iterable_state_replays() -> None:
    loader = dloader.DataLoader(D.Sharded(40), batch_size=3, num_workers=2)
    want = [int(i) for b in loader for i in b]
    it = iter(loader)
    got = [int(i) for _ in range(4) for i in next(it)]
    state = loader.state_dict()
    del it
    again = dloader.DataLoader(D.Sharded(40), batch_size=3, num_workers=2)
    again.load_state_dict(state)
    got += [int(i) for b in again for i in b]
    assert got == want
    other = dloader.DataLoader(D.Sharded(40), batch_size=3, num_workers=1)
    with pytest.raises(ValueError, match="needs the same num_workers"):
        other.load_state_dict(state)


def test_bad_state_errors_name_the_problem() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2)
    it = iter(loader)
    next(it)
    good = loader.state_dict()
    with pytest.raises(dloader.StateError, match="version=99 is not supported"):
        loader.load_state_dict({**good, "version": 99})
    with pytest.raises(dloader.StateError, match="missing field"):
        loader.load_state_dict({"version": 1})
    with pytest.raises(dloader.StateError, match=r"dataset length changed.*dataset_len=10.*=11"):
        dloader.DataLoader(D.Range(11)).load_state_dict(good)
    with pytest.raises(dloader.StateError, match="saved for a map dataset"):
        dloader.DataLoader(D.Sharded(10)).load_state_dict(good)
    with pytest.raises(dloader.StateError, match="samples_yielded=-1"):
        loader.load_state_dict({**good, "samples_yielded": -1})
    with pytest.raises(dloader.StateError, match="must be a dict"):
        loader.load_state_dict([1, 2])  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unordered = dloader.DataLoader(D.Range(10), num_workers=1, in_order=False)
        it2 = iter(unordered)
        next(it2)
        with pytest.raises(ValueError, match="needs in_order=True"):
            unordered.state_dict()
