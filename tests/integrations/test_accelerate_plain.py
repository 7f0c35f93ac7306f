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


@pytest.mark.integration  # the agents start their helper processes
def test_the_adapter_hands_the_sidecar_job_to_the_prepared_loader(tmp_path: object) -> None:
    """A loader's agent starts with it; the prepared loader is the job from then on (the same
    sidecar and name), and the original's agent stops (its job would sit idle beside it)."""
    from dloader.integrations.accelerate import prepare

    target = f"unix://{tmp_path}/nobody.sock"
    loader = dloader.DataLoader(D.Range(16), batch_size=4, sidecar=target, job_name="train")
    assert loader.sidecar_agent is not None
    prepared = prepare(accelerate.Accelerator(cpu=True), loader)
    agent = prepared.sidecar_agent
    assert agent is not None and (agent.target, agent.name) == (target, "train")
    assert loader.sidecar_agent._stop.is_set() and not agent._stop.is_set()
    assert [len(b) for b in prepared] == [4, 4, 4, 4]
    agent.stop()
