"""Checks on serialised models (plain dicts with a kind and a version)."""

from __future__ import annotations

from typing import Any

from dloader.errors import PredictorError

__all__ = ["check_payload"]


def check_payload(payload: Any, kind: str, version: int) -> None:
    """Raises :class:`PredictorError` unless ``payload`` is a ``kind`` model of ``version``."""
    if not isinstance(payload, dict):
        raise PredictorError(
            f"a serialised {kind} model must be a dict, got {type(payload).__name__}"
        )
    if payload.get("kind") != kind:
        raise PredictorError(f"payload kind={payload.get('kind')!r}, expected {kind!r}")
    if payload.get("version") != version:
        raise PredictorError(
            f"{kind} model version={payload.get('version')!r} is not supported;"
            f" this dloader reads version {version}"
        )
