"""Property: any sequence of resize / set_batch_size / save-and-restore delivers the epoch's
samples exactly once, in the sampler's order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dloader
from tests.loader import datasets as D
from tests.loader.test_resize import expected_order

pytestmark = pytest.mark.integration

N = 64

op = st.one_of(
    st.tuples(st.just("next"), st.integers(1, 4)),
    st.tuples(st.just("resize"), st.integers(0, 3)),
    st.tuples(st.just("batch"), st.integers(1, 9)),
    st.tuples(st.just("restore"), st.tuples(st.integers(0, 2), st.integers(1, 9))),
)


def make(num_workers: int, batch_size: int, shuffle: bool) -> dloader.DataLoader[Any]:
    return dloader.DataLoader(
        D.Range(N), batch_size=batch_size, shuffle=shuffle, num_workers=num_workers
    )


cases = given(
    ops=st.lists(op, max_size=10),
    start_workers=st.integers(0, 2),
    start_batch=st.integers(1, 9),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@cases
def test_exactly_once_in_order(
    ops: list[tuple[str, Any]], start_workers: int, start_batch: int, shuffle: bool, seed: int
) -> None:
    check(ops, start_workers, start_batch, shuffle, seed)


@pytest.mark.slow
@pytest.mark.timeout(600)  # 400 cases, 74 s in CI
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@cases
def test_exactly_once_in_order_many(
    ops: list[tuple[str, Any]], start_workers: int, start_batch: int, shuffle: bool, seed: int
) -> None:
    check(ops, start_workers, start_batch, shuffle, seed)


def check(
    ops: list[tuple[str, Any]], start_workers: int, start_batch: int, shuffle: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    loader = make(start_workers, start_batch, shuffle)
    it = iter(loader)
    got: list[int] = []
    ended = False  # a state saved after the epoch ended resumes into the next epoch
    for name, arg in ops:
        if name == "next":
            for _ in range(arg):
                batch = None if ended else next(it, None)
                if batch is None:
                    ended = True
                    break
                got += [int(i) for i in batch]
        elif name == "resize":
            loader.resize(arg)
        elif name == "batch":
            loader.set_batch_size(arg)
        else:
            state = loader.state_dict()
            if hasattr(it, "close"):
                it.close()
            torch.manual_seed(seed + 1)  # a restarted process: other RNG state
            loader = make(arg[0], arg[1], shuffle)
            loader.load_state_dict(state)
            it = iter(loader)
    if not ended:
        got += [int(i) for b in it for i in b]
    assert got == expected_order(N, seed, shuffle)
