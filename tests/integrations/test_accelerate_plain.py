"""#23: ``accelerator.prepare(loader)`` with a plain ``dloader.DataLoader`` replaced it by
accelerate's ``DataLoaderShard`` without a word. It still does (accelerate decides), but loudly,
pointing to the adapter, which keeps dloader and says nothing."""

from __future__ import annotations

import warnings

import pytest

import dloader
from tests.loader import datasets as D

accelerate = pytest.importorskip("accelerate")

# accelerate's AcceleratorState is a process-wide singleton: each test in a child of its own
pytestmark = pytest.mark.isolated


def test_plain_prepare_warns_and_names_the_adapter() -> None:
    loader = dloader.DataLoader(D.Range(16), batch_size=4)
    with pytest.warns(UserWarning, match=r"dloader\.integrations\.accelerate\.prepare"):
        prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    assert not isinstance(prepared, dloader.DataLoader)  # accelerate's own, as it decided


def test_the_adapter_keeps_dloader_and_is_quiet() -> None:
    from dloader.integrations.accelerate import prepare

    loader = dloader.DataLoader(D.Range(16), batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = prepare(accelerate.Accelerator(cpu=True), loader)
        again = accelerate.Accelerator(cpu=True).prepare(prepared)  # already prepared: kept
    assert isinstance(prepared, dloader.DataLoader) and again is prepared
    assert [len(b) for b in prepared] == [4, 4, 4, 4]
