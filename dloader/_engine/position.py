"""A loader's saved position in its epoch (``DataLoader.state_dict()``): its version and its
validation. The position itself is a few integers and the sampler's snapshot
(:class:`~dloader._engine.index_stream.SamplerSnapshot`)."""

from __future__ import annotations

from typing import Any

from dloader.errors import StateError

__all__ = ["STATE_VERSION", "check_state"]

STATE_VERSION = 1


def check_state(state: Any, *, iterable: bool, dataset_len: int | None) -> dict[str, Any]:
    """Validates a loader state dict, naming the offending field; returns it."""
    if not isinstance(state, dict):
        raise StateError(f"loader state must be a dict, got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise StateError(
            f"loader state version={version!r} is not supported; expected {STATE_VERSION}"
        )
    required = ("dataset_kind", "samples_yielded", "batches_yielded", "sampler", "exhausted")
    missing = [key for key in required if key not in state]
    if missing:
        raise StateError(f"loader state is missing field(s) {missing}")
    kind = "iterable" if iterable else "map"
    if state["dataset_kind"] != kind:
        raise StateError(
            f"loader state was saved for a {state['dataset_kind']} dataset, "
            f"this loader has a {kind} dataset"
        )
    for key in ("samples_yielded", "batches_yielded"):
        if not isinstance(state[key], int) or state[key] < 0:
            raise StateError(f"loader state {key}={state[key]!r} must be a non-negative int")
    saved_len = state.get("dataset_len")
    if dataset_len is not None and saved_len is not None and saved_len != dataset_len:
        raise StateError(
            f"dataset length changed since the state was saved: "
            f"saved dataset_len={saved_len}, now len(dataset)={dataset_len}"
        )
    return state
