"""ElasticDistributedSampler: a world-size-free order, DistributedSampler's tails, resumes under
any world size with every index delivered exactly once."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import dloader
from dloader import ElasticDistributedSampler
from tests.loader import datasets as D


def ranks(n: int, world: int, **kwargs: object) -> list[ElasticDistributedSampler]:
    ds = D.Range(n)
    return [
        ElasticDistributedSampler(ds, num_replicas=world, rank=r, **kwargs)  # type: ignore[arg-type]
        for r in range(world)
    ]


def test_order_depends_only_on_seed_and_epoch() -> None:
    one = list(ranks(97, 1, seed=3)[0])
    assert sorted(one) == list(range(97)) and one != list(range(97))
    interleaved = [i for group in zip(*ranks(97, 1, seed=3), strict=True) for i in group]
    assert interleaved == one
    # Three ranks stride the same global order.
    three = [list(s) for s in ranks(99, 3, seed=3)]
    glob = list(ranks(99, 1, seed=3)[0])
    assert [three[p % 3][p // 3] for p in range(99)] == glob
    other_epoch = ranks(97, 1, seed=3)[0]
    other_epoch.set_epoch(1)
    assert list(other_epoch) != one
    assert list(ranks(97, 1, seed=4)[0]) != one
    assert list(ranks(10, 1, shuffle=False)[0]) == list(range(10))


@pytest.mark.parametrize("n,world", [(10, 3), (9, 3), (1, 4), (100, 7)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_lengths_and_tails_like_distributed_sampler(n: int, world: int, drop_last: bool) -> None:
    ours = ranks(n, world, drop_last=drop_last)
    theirs = [
        DistributedSampler(D.Range(n), num_replicas=world, rank=r, drop_last=drop_last)
        for r in range(world)
    ]
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    got = Counter(i for s in ours for i in s)
    if drop_last:
        assert sum(got.values()) == (n // world) * world and max(got.values(), default=1) == 1
    else:
        assert set(got) == set(range(n))
        assert sum(got.values()) == math.ceil(n / world) * world  # padding duplicates


def test_invalid_arguments_like_torch() -> None:
    for kwargs in (dict(num_replicas=2, rank=2), dict(num_replicas=2, rank=-1)):
        with pytest.raises(ValueError) as theirs:
            DistributedSampler(D.Range(4), **kwargs)  # type: ignore[arg-type]
        with pytest.raises(ValueError) as ours:
            ElasticDistributedSampler(D.Range(4), **kwargs)  # type: ignore[arg-type]
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(RuntimeError, match="Requires distributed package"):
        ElasticDistributedSampler(D.Range(4))


def test_state_errors_name_the_mismatch() -> None:
    s = ranks(50, 2, seed=1)[0]
    state = s.state_dict()
    with pytest.raises(dloader.StateError, match=r"seed mismatch.*seed=1.*seed=2"):
        ranks(50, 2, seed=2)[0].load_state_dict(state)
    with pytest.raises(dloader.StateError, match="dataset length changed"):
        ranks(51, 2, seed=1)[0].load_state_dict(state)
    with pytest.raises(dloader.StateError, match="version"):
        s.load_state_dict({**state, "version": 9})


def test_resume_at_50m_of_100m_is_immediate_and_small() -> None:
    ds = D.Range(100_000_000)
    s = ElasticDistributedSampler(ds, num_replicas=8, rank=3, seed=0)
    s.load_state_dict({**s.state_dict(), "start": 50_000_000})
    it = iter(s)
    first = [next(it) for _ in range(5)]
    assert all(0 <= i < 100_000_000 for i in first)
    assert len(s) == 50_000_000 // 8


def consume(loaders: list[Any], steps: int) -> tuple[list[int], bool]:
    """Lockstep: every rank takes one batch per step; stops at the first exhausted rank.
    ``loaders`` may be loaders (a new epoch each call) or their iterators."""
    out: list[int] = []
    its = [iter(ld) for ld in loaders]
    for _ in range(steps):
        batches = [next(it, None) for it in its]
        if any(b is None for b in batches):
            return out, True
        for b in batches:
            out += [int(i) for i in b]
    return out, False


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 120),
    worlds=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    stops=st.lists(st.integers(0, 12), min_size=5, max_size=5),
    batch=st.integers(1, 5),
    drop_last=st.booleans(),
)
def test_world_size_changes_deliver_each_index_exactly_once(
    n: int, worlds: list[int], stops: list[int], batch: int, drop_last: bool
) -> None:
    ds = D.Range(n)
    state = None
    seen: list[int] = []
    for phase, world in enumerate(worlds):
        last = phase == len(worlds) - 1
        loaders = []
        for r in range(world):
            sampler = ElasticDistributedSampler(
                ds, num_replicas=world, rank=r, seed=11, drop_last=drop_last
            )
            loader = dloader.DataLoader(ds, batch_size=batch, sampler=sampler)
            if state is not None:
                loader.load_state_dict(state)
            loaders.append(loader)
        got, ended = consume(loaders, 10**6 if last else stops[phase])
        seen += got
        states = [ld.state_dict() for ld in loaders]
        assert all(s == states[0] for s in states)  # identical on every rank
        state = states[0]
        if ended:
            break
    counts = Counter(seen)
    dup = sum(c - 1 for c in counts.values())
    if ended:  # the epoch ran out: every index once, bar the documented tail handling
        missing = n - len(counts)
        if drop_last:
            assert dup == 0 and missing < max(worlds)
        else:
            assert missing == 0 and dup < max(worlds)
    else:
        assert dup == 0


def test_loader_and_sampler_state_with_batch_size_change() -> None:
    ds = D.Range(61)  # 22 consumed by 2 ranks, 39 left for 3: no tail padding
    s = ElasticDistributedSampler(ds, num_replicas=2, rank=0, seed=2)
    s1 = ElasticDistributedSampler(ds, num_replicas=2, rank=1, seed=2)
    a, b = (
        dloader.DataLoader(ds, batch_size=3, sampler=s),
        dloader.DataLoader(ds, batch_size=3, sampler=s1),
    )
    its = [iter(a), iter(b)]
    got, _ = consume(its, 2)
    a.set_batch_size(5)
    b.set_batch_size(5)
    more, _ = consume(its, 1)
    got += more
    state = a.state_dict()
    assert state == b.state_dict()
    new = [
        dloader.DataLoader(
            ds, batch_size=4, sampler=ElasticDistributedSampler(ds, num_replicas=3, rank=r, seed=2)
        )
        for r in range(3)
    ]
    for ld in new:
        ld.load_state_dict(state)
    rest, ended = consume(new, 100)
    assert ended
    assert sorted(got + rest) == list(range(61))


def test_elastic_checkpoint_roundtrip_and_errors(tmp_path: object) -> None:
    import dloader.elastic as E

    path = tmp_path / "ckpt"  # type: ignore[operator]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    ds = D.Range(40)
    loader = dloader.DataLoader(
        ds, batch_size=4, sampler=ElasticDistributedSampler(ds, num_replicas=1, rank=0, seed=9)
    )
    it = iter(loader)
    first = [int(i) for _ in range(3) for i in next(it)]
    E.save(path, model=model, optimizer=opt, loader=loader, extra={"step": 3})
    assert E.is_complete(path)

    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    loader2 = dloader.DataLoader(
        ds, batch_size=4, sampler=ElasticDistributedSampler(ds, num_replicas=1, rank=0, seed=9)
    )
    assert E.load(path, model=model2, optimizer=opt2, loader=loader2) == {"step": 3}
    for k, v in model.state_dict().items():
        assert torch.equal(v, model2.state_dict()[k])
    assert torch.equal(
        opt.state_dict()["state"][0]["momentum_buffer"],
        opt2.state_dict()["state"][0]["momentum_buffer"],
    )
    assert sorted(first + [int(i) for b in loader2 for i in b]) == list(range(40))

    with pytest.raises(E.CheckpointError, match="does not exist"):
        E.load(path.parent / "nope", model=model2)
    with pytest.raises(dloader.StateError, match=r"dataset length changed.*40.*41"):
        E.load(
            path,
            model=model2,
            loader=dloader.DataLoader(
                D.Range(41),
                sampler=(ElasticDistributedSampler(D.Range(41), num_replicas=1, rank=0, seed=9)),
            ),
        )
    with pytest.raises(dloader.StateError, match=r"seed mismatch.*seed=9.*seed=8"):
        E.load(
            path,
            model=model2,
            loader=dloader.DataLoader(
                ds, sampler=(ElasticDistributedSampler(ds, num_replicas=1, rank=0, seed=8))
            ),
        )
    (path / "dloader.json").write_text("{not json")
    with pytest.raises(E.CheckpointError, match="corrupt"):
        E.load(path, model=model2)
    (path / "dloader.json").unlink()
    with pytest.raises(E.CheckpointError, match="incomplete"):
        E.load(path, model=model2)
