"""Elastic checkpoints: model and optimizer through ``torch.distributed.checkpoint`` (resharded by
torch at load time, so FSDP/DTensor state follows a new world size and plain DDP works too), and
the data position (loader + sampler state) beside them.

A checkpoint is a folder::

    <path>/.metadata, *.distcp     model and optimizer (torch.distributed.checkpoint)
    <path>/dloader.json            loader state, world size, dataset length, extra

It is written into a temporary sibling folder and renamed into place once every rank has
written its part, so a crash mid-save never leaves a folder at ``<path>`` that loads as valid.

Works in a single process and under ``torch.distributed`` (every rank calls ``save``/``load``;
they are collective).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dloader._engine import ranks
from dloader.errors import CheckpointError, StateError

__all__ = ["CheckpointError", "is_complete", "load", "read_meta", "save"]

_META = "dloader.json"
_FORMAT = 1


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    """Without a process group torch warns that it assumes one process: that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


def is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a completely written checkpoint."""
    p = Path(path)
    return (p / _META).is_file() and (p / ".metadata").is_file()


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """What torch.distributed.checkpoint saves and loads: model (and optimizer) state dicts."""
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    return state


def _loader_dataset_len(loader: Any) -> int | None:
    try:
        return len(loader.dataset)
    except TypeError:
        return None


def save(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Any = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Writes an elastic checkpoint to ``path`` (a folder), atomically. Collective.

    Args:
        path: the checkpoint folder; an existing one is replaced.
        model: the model (plain, DDP, or FSDP).
        optimizer: its optimizer, if any.
        loader: a :class:`dloader.DataLoader`; its state must be the same on every rank
            (lockstep data parallelism), which is checked.
        extra: JSON-compatible values to keep (step counters, ...); returned by :func:`load`.

    Returns:
        The checkpoint folder.

    Raises:
        CheckpointError: the ranks' loader states disagree, or ``extra`` is not JSON.
    """
    rank, world = ranks.rank_and_world()
    final = Path(path)
    token = ranks.broadcast(uuid.uuid4().hex if rank == 0 else None)
    tmp = final.parent / f".{final.name}.tmp-{token}"
    state = _dcp_state(model, optimizer)
    with _single_process_ok():
        dcp.save(state, checkpoint_id=str(tmp))

    loader_state = loader.state_dict() if loader is not None else None
    states = ranks.all_gather(loader_state)
    positions = {json.dumps(_position(s), sort_keys=True, default=str) for s in states}
    if len(positions) > 1:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            "the ranks' loaders are at different positions, so no single data position can be "
            f"saved: {sorted(positions)}. Elastic checkpoints need lockstep data parallelism "
            "(every rank consumes the same number of samples per step)."
        )
    if rank == 0:
        meta = {
            "format": _FORMAT,
            "world_size": world,
            "has_optimizer": optimizer is not None,
            "dataset_len": _loader_dataset_len(loader) if loader is not None else None,
            "loader": _jsonable(loader_state),
            "extra": extra or {},
        }
        try:
            text = json.dumps(meta)
        except TypeError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(f"extra={extra!r} is not JSON-compatible: {exc}") from None
        with open(tmp / _META, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    ranks.barrier()
    if rank == 0:
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{token}"
            final.rename(old)
        tmp.rename(final)
        _fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    ranks.barrier()
    return final


def _position(state: Any) -> Any:
    """The part of a loader state that must agree across ranks (not the worker count)."""
    if not isinstance(state, dict):
        return state
    return {k: v for k, v in state.items() if k not in ("num_workers",)}


def _jsonable(state: Any) -> Any:
    """Loader state with bytes (RNG states) as lists of ints, for JSON."""
    if isinstance(state, bytes):
        return {"__bytes__": list(state)}
    if isinstance(state, dict):
        return {k: _jsonable(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [_jsonable(v) for v in state]
    return state


def _from_json(state: Any) -> Any:
    if isinstance(state, dict):
        if set(state) == {"__bytes__"}:
            return bytes(state["__bytes__"])
        return {k: _from_json(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_from_json(v) for v in state]
    return state


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``dloader.json`` of a checkpoint, validated."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p} does not exist (expected a folder)")
    if not is_complete(p):
        raise CheckpointError(
            f"checkpoint {p} is incomplete: it lacks {_META} or .metadata (an interrupted save?)"
        )
    try:
        meta = json.loads((p / _META).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {p}: {_META} is corrupt: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise CheckpointError(
            f"checkpoint {p}: {_META} has format="
            f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
            f"expected {_FORMAT}"
        )
    return meta


def load(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Any = None,
) -> dict[str, Any]:
    """Restores a checkpoint saved by :func:`save`, under any world size. Collective.

    The model and optimizer are loaded in place (torch reshards them); the loader's next
    ``iter()`` continues the saved epoch with exactly the samples no rank had consumed.

    Returns:
        The ``extra`` dict given to :func:`save`.

    Raises:
        CheckpointError: the folder is missing, incomplete or corrupt, or lacks optimizer state.
        dloader.errors.StateError: the dataset length or the sampler's seed changed since the save.
    """
    meta = read_meta(path)
    if optimizer is not None and not meta.get("has_optimizer"):
        raise CheckpointError(
            f"checkpoint {path} has no optimizer state, but an optimizer was given to load()"
        )
    if loader is not None:
        saved_len, now_len = meta.get("dataset_len"), _loader_dataset_len(loader)
        if saved_len is not None and now_len is not None and saved_len != now_len:
            raise StateError(
                f"dataset length changed since the checkpoint: saved "
                f"dataset_len={saved_len}, now len(dataset)={now_len}"
            )
        _check_seed(meta.get("loader"), loader)
    state = _dcp_state(model, optimizer)
    try:
        with _single_process_ok():
            dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # torch raises several types for unreadable shards
        raise CheckpointError(
            f"checkpoint {path}: cannot read model/optimizer state: {exc}"
        ) from exc
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    if loader is not None and meta.get("loader") is not None:
        loader.load_state_dict(_from_json(meta["loader"]))
    extra = meta.get("extra", {})
    return extra if isinstance(extra, dict) else {}


def _check_seed(saved_loader: Any, loader: Any) -> None:
    seed = getattr(getattr(loader, "sampler", None), "seed", None)
    saved = (saved_loader or {}).get("sampler") or {}
    state = saved.get("state") if saved.get("kind") == "stateful" else None
    if seed is not None and isinstance(state, dict) and state.get("seed", seed) != seed:
        raise StateError(
            f"sampler seed mismatch: the checkpoint was saved with "
            f"seed={state['seed']}, this sampler has seed={seed}"
        )
