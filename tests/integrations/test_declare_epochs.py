"""DeclareEpochs (Lightning): which loaders it declares a length on, and when it declares none.
The callback's hook is called here with a stand-in for the trainer's three attributes it reads;
under a real Lightning DDP run it is tested in test_frameworks.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dloader

pytest.importorskip("lightning")
from dloader.integrations.lightning import DeclareEpochs


def _loader(**kw: object) -> dloader.DataLoader:
    return dloader.DataLoader(list(range(8)), batch_size=2, **kw)  # type: ignore[arg-type]


def _trainer(loaders: object, max_epochs: int | None = 3, max_steps: int = -1) -> object:
    return SimpleNamespace(train_dataloader=loaders, max_epochs=max_epochs, max_steps=max_steps)


def test_it_declares_max_epochs_on_every_dloader_loader_without_a_length() -> None:
    a, b, own = _loader(), _loader(), _loader(epochs=7)
    plain = torch.utils.data.DataLoader(list(range(4)))
    cb = DeclareEpochs()
    cb.on_train_start(_trainer({"a": a, "rest": [b, own, plain]}), None)
    assert (a.epochs, b.epochs, own.epochs) == (3, 3, 7) and cb.declared == 3
    assert not hasattr(plain, "epochs")
    c = _loader()
    DeclareEpochs(epochs=5).on_train_start(_trainer(c, max_epochs=None, max_steps=100), None)
    assert c.epochs == 5


@pytest.mark.parametrize(("max_epochs", "max_steps"), [(3, 100), (-1, -1), (None, -1)])
def test_a_run_bounded_by_steps_or_unbounded_declares_nothing(
    max_epochs: int | None, max_steps: int
) -> None:
    loader, cb = _loader(), DeclareEpochs()
    cb.on_train_start(_trainer(loader, max_epochs, max_steps), None)
    assert loader.epochs is None and cb.declared is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "3"])
def test_bad_epochs_are_refused_with_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"^epochs={bad!r}: expected an integer >= 1"):
        DeclareEpochs(epochs=bad)  # type: ignore[arg-type]
