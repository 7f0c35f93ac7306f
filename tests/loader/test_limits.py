"""S7: a worker count nothing can open is refused when it is asked for, naming the value."""

from __future__ import annotations

import resource

import pytest

import dloader
from dloader._dataloader import FDS_PER_WORKER, worker_ceiling
from tests.loader import datasets as D


@pytest.mark.parametrize("count", [10**9, 2**63, 10**100])
def test_resize_far_past_the_open_file_limit_is_refused(count: int) -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2)
    with pytest.raises(ValueError, match=rf"num_workers={count} is above {worker_ceiling()}"):
        loader.resize(count)
    assert loader.num_workers == 0


def test_the_ceiling_follows_the_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert worker_ceiling() == (256 - 64) // FDS_PER_WORKER
        loader = dloader.DataLoader(D.Range(10), batch_size=2)
        loader.resize(worker_ceiling())  # the ceiling itself is fine
        with pytest.raises(ValueError, match="pass max_workers="):
            loader.resize(worker_ceiling() + 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_explicit_max_workers_is_the_bound() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2, max_workers=2000)
    loader.resize(1500)  # the owner said so (nothing is started until it iterates)
    assert loader.num_workers == 1500
    with pytest.raises(ValueError, match=r"outside \[min_workers=0, max_workers=2000\]"):
        loader.resize(2001)
