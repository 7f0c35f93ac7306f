"""Drop-in compatibility: same signature, same batches, same errors and warnings as torch."""

from __future__ import annotations

import inspect
import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import dloader
from tests.loader import datasets as D

pytestmark = pytest.mark.integration  # real worker processes


def to_py(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [to_py(v) for v in x]
    if isinstance(x, dict):
        return {k: to_py(v) for k, v in x.items()}
    return x


def run(cls: type, dataset: Any, seed: int = 1234, epochs: int = 1, **kwargs: Any) -> list[Any]:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    if isinstance(kwargs.get("generator"), torch.Generator):
        kwargs = {**kwargs, "generator": kwargs["generator"].clone_state()}
    loader = cls(dataset, **kwargs)
    out = []
    for _ in range(epochs):
        out.append([to_py(b) for b in loader])
    return out


def assert_same(dataset: Any, epochs: int = 1, **kwargs: Any) -> list[Any]:
    expected = run(tud.DataLoader, dataset, epochs=epochs, **kwargs)
    got = run(dloader.DataLoader, dataset, epochs=epochs, **kwargs)
    assert got == expected
    return got


def test_signature_matches_installed_torch() -> None:
    ours = list(inspect.signature(dloader.DataLoader.__init__).parameters.values())
    theirs = list(inspect.signature(tud.DataLoader.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[: len(theirs)]] == [
        (p.name, p.kind, p.default) for p in theirs
    ]
    # Everything dloader adds is keyword-only, after torch's parameters.
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs) :])
    assert issubclass(dloader.DataLoader, tud.DataLoader)


def test_generic_in_annotations() -> None:
    alias = dloader.DataLoader[int]
    assert alias.__origin__ is dloader.DataLoader  # type: ignore[attr-defined]


@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_map_style_same_batches(num_workers: int, shuffle: bool, drop_last: bool) -> None:
    got = assert_same(
        D.Augmented(23), batch_size=4, shuffle=shuffle, drop_last=drop_last, num_workers=num_workers
    )
    assert got[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_options_same_batches(num_workers: int) -> None:
    ds = D.Augmented(17)
    assert_same(ds, batch_size=None, num_workers=num_workers)
    assert_same(
        ds,
        batch_size=3,
        sampler=tud.RandomSampler(ds, replacement=True, num_samples=11),
        num_workers=num_workers,
    )
    assert_same(
        ds,
        batch_sampler=tud.BatchSampler(tud.SequentialSampler(ds), 5, False),
        num_workers=num_workers,
    )
    assert_same(
        ds, batch_size=4, collate_fn=lambda xs: [x[0] * 2 for x in xs], num_workers=num_workers
    )
    assert_same(
        ds,
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(7),
        num_workers=num_workers,
    )
    assert_same(D.WithGetItems(9), batch_size=4, num_workers=num_workers)


def test_worker_options_same_batches() -> None:
    ds = D.Augmented(30)
    assert_same(ds, batch_size=2, num_workers=3, prefetch_factor=1)
    assert_same(ds, batch_size=2, num_workers=2, prefetch_factor=5, worker_init_fn=D.record_init)
    assert_same(ds, batch_size=2, shuffle=True, num_workers=2, persistent_workers=True, epochs=3)
    assert_same(ds, batch_size=2, num_workers=2, timeout=30)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_multiprocessing_contexts(context: str) -> None:
    assert_same(D.Augmented(12), batch_size=3, num_workers=2, multiprocessing_context=context)


def test_in_order_false_same_samples() -> None:
    ds = D.Range(40, sleep_s=0.001)
    got = run(dloader.DataLoader, ds, batch_size=3, num_workers=3, in_order=False)[0]
    expected = run(tud.DataLoader, ds, batch_size=3, num_workers=3)[0]
    assert sorted(map(tuple, got)) == sorted(map(tuple, expected))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_iterable_same_batches(num_workers: int) -> None:
    assert_same(D.Sharded(25), batch_size=4, num_workers=num_workers)
    assert_same(D.Sharded(25), batch_size=4, drop_last=True, num_workers=num_workers)
    assert_same(D.Sharded(9), batch_size=None, num_workers=num_workers)
    assert_same(D.Uneven(), batch_size=2, num_workers=num_workers)


def test_iterable_persistent_epochs() -> None:
    assert_same(D.Sharded(20), batch_size=3, num_workers=2, persistent_workers=True, epochs=3)


def test_get_worker_info_inside_workers() -> None:
    batches = run(dloader.DataLoader, D.Augmented(8), batch_size=2, num_workers=2)[0]
    assert sorted({sample[4] for b in batches for sample in zip(*b, strict=True)}) == [0, 1]
    assert tud.get_worker_info() is None


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(num_workers=0, prefetch_factor=2),
        dict(num_workers=2, prefetch_factor=-1),
        dict(persistent_workers=True),
        dict(shuffle=True, sampler=[0, 1]),
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_size=None, drop_last=True),
        dict(num_workers=0, multiprocessing_context="fork"),
        dict(num_workers=1, multiprocessing_context="nope"),
    ],
)
def test_invalid_arguments_raise_like_torch(kwargs: dict[str, Any]) -> None:
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(D.Range(4), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        dloader.DataLoader(D.Range(4), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_iterable_rejects_shuffle_and_sampler_like_torch() -> None:
    for kwargs in (dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])):
        with pytest.raises(ValueError) as theirs:
            tud.DataLoader(D.Sharded(3), **kwargs)
        with pytest.raises(ValueError) as ours:
            dloader.DataLoader(D.Sharded(3), **kwargs)
        assert str(ours.value) == str(theirs.value)


def test_setting_locked_attributes_raises_like_torch() -> None:
    loader = dloader.DataLoader(D.Range(4))
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        loader.batch_size = 3


def test_len_matches_torch() -> None:
    for kwargs in (dict(batch_size=3), dict(batch_size=3, drop_last=True), dict(batch_size=None)):
        assert len(dloader.DataLoader(D.Range(10), **kwargs)) == len(
            tud.DataLoader(D.Range(10), **kwargs)
        )
        assert len(dloader.DataLoader(D.Sharded(10), **kwargs)) == len(
            tud.DataLoader(D.Sharded(10), **kwargs)
        )


def _warnings_of(cls: type, **kwargs: Any) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = cls(D.Range(4), **kwargs)
        list(loader)
    return sorted(f"{w.category.__name__}: {w.message}" for w in caught)


def test_warnings_like_torch() -> None:
    many = torch.utils.data._utils.worker.os.cpu_count() or 1  # type: ignore[attr-defined]
    for kwargs in (dict(pin_memory=True), dict(num_workers=many + 1)):
        assert _warnings_of(dloader.DataLoader, **kwargs) == _warnings_of(tud.DataLoader, **kwargs)


def test_iterable_length_warning_like_torch() -> None:
    class Liar(D.Sharded):
        def __len__(self) -> int:
            return 2

    liar = Liar(5)

    def warns(cls: type) -> list[str]:
        loader = cls(liar, batch_size=None)
        len(loader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(loader)
        return [str(w.message).split("(")[0] for w in caught]

    assert warns(dloader.DataLoader) == warns(tud.DataLoader)
    assert warns(dloader.DataLoader)


def test_iterable_length_warning_every_epoch_with_persistent_workers() -> None:
    """torch re-reads ``len()`` at each epoch of a persistent iterator and warns again."""

    class Liar(D.Sharded):
        def __len__(self) -> int:
            return 2

    def warnings_per_epoch(cls: type) -> list[int]:
        loader = cls(Liar(5), batch_size=None, num_workers=2, persistent_workers=True)
        counts = []
        for _ in range(3):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(loader)
            len(loader)  # after the first epoch: the next epochs know the length
            counts.append(sum("Length of IterableDataset" in str(w.message) for w in caught))
        return counts

    assert warnings_per_epoch(dloader.DataLoader) == warnings_per_epoch(tud.DataLoader)
    assert warnings_per_epoch(dloader.DataLoader)[1:] == [3, 3]


def _shuffled_pipe() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(23)).shuffle().sharding_filter()


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (2, True), (3, True)]
)
def test_datapipe_shuffle_seeded_like_torch(num_workers: int, persistent: bool) -> None:
    """An IterDataPipe's shuffle is seeded from the loader's generator per epoch, as torch does
    (same order, and the global RNG left in the same state)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's datapipe deprecation notices
        got = assert_same(
            _shuffled_pipe(),
            epochs=3,
            batch_size=4,
            num_workers=num_workers,
            persistent_workers=persistent,
        )
        assert run(tud.DataLoader, _shuffled_pipe(), seed=99, batch_size=4) != got[:1]
        for cls in (tud.DataLoader, dloader.DataLoader):
            torch.manual_seed(5)
            list(cls(_shuffled_pipe(), batch_size=4, num_workers=num_workers))
            if cls is tud.DataLoader:
                after_torch = torch.rand(3)
            else:
                assert torch.equal(torch.rand(3), after_torch)
    epoch = sorted(x for batch in got[0] for x in batch)
    assert epoch == list(range(23))  # sharded over workers: each sample once
