"""Automatic resume under ``torchrun`` elastic launches.

``torchrun --nnodes=MIN:MAX --nproc-per-node=N --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT
train.py`` restarts every worker when the membership changes (a node joins, fails or is taken
away), with a new world size. A script that calls :func:`resume` at start and
:func:`save_checkpoint` every few steps continues from the last checkpoint: the model and
optimizer resharded by ``torch.distributed.checkpoint``, the data position re-split over the new
ranks by :class:`dloader.ElasticDistributedSampler`, with no sample skipped or repeated.

Recipe::

    dist.init_process_group("gloo" or "nccl")
    model = DDP(net)
    sampler = dloader.ElasticDistributedSampler(dataset, seed=SEED)
    loader = dloader.DataLoader(dataset, batch_size=B, sampler=sampler, num_workers=4)
    extra = resume(CKPT_ROOT, model=model, optimizer=opt, loader=loader)
    step, epoch = extra.get("step", 0), extra.get("epoch", 0)
    while epoch < EPOCHS:
        sampler.set_epoch(epoch)             # same epoch as resumed: the position is kept
        for batch in loader:
            ...train...
            step += 1
            sync_batch_size(loader)          # takes the sidecar's batch size in lockstep
            if step % EVERY == 0:
                save_checkpoint(CKPT_ROOT, step, model=model, optimizer=opt, loader=loader,
                                extra={"step": step, "epoch": epoch})
        epoch += 1
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dloader import elastic
from dloader._engine import ranks

__all__ = ["checkpoint_dir", "latest_checkpoint", "resume", "save_checkpoint", "sync_batch_size"]

_NAME = re.compile(r"step-(\d+)")


def checkpoint_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint at ``step`` under ``root``."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    return Path(root) / f"step-{step:09d}"


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or ``None``."""
    base = Path(root)
    if not base.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for p in base.iterdir():
        m = _NAME.fullmatch(p.name)
        if m and elastic.is_complete(p) and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), p)
    return best[1] if best else None


def resume(
    root: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Any = None,
) -> dict[str, Any]:
    """Loads the latest checkpoint under ``root`` if there is one; returns its ``extra``
    (``{}`` on a fresh start). Collective: every rank calls it."""
    path = latest_checkpoint(root)
    if path is None:
        return {}
    return elastic.load(path, model=model, optimizer=optimizer, loader=loader)


def save_checkpoint(
    root: str | os.PathLike[str],
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loader: Any = None,
    extra: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Saves the checkpoint of ``step`` and keeps only the ``keep`` newest. Collective."""
    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1")
    path = elastic.save(
        checkpoint_dir(root, step), model=model, optimizer=optimizer, loader=loader, extra=extra
    )
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank == 0:
        done = sorted(p for p in Path(root).iterdir() if _NAME.fullmatch(p.name))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return path


def sync_batch_size(loader: Any) -> int | None:
    """Applies a batch size the node sidecar directed, on every rank at the same batch.
    Collective: every rank calls it at the same step (once per step is cheap: one small
    all-gather). Returns the new batch size, or ``None`` when nothing changed.

    Each rank's agent receives the directive on its own time, so a rank that applied it
    alone would cut different batches than the others (lockstep data parallelism, and with it
    an exact elastic checkpoint, would be lost). The agent only stages it
    (``loader.staged_batch_size``); here the ranks agree on it and on the first batch not yet
    dispatched on any rank, and all switch from that batch.
    """
    views = ranks.all_gather((loader.staged_batch_size, loader.batches_cut))
    staged = {v[0] for v in views}
    if len(staged) != 1 or None in staged:
        return None  # not every rank has it yet (or they differ): next step
    size = staged.pop()
    loader.set_batch_size(size, at_batch=max(v[1] for v in views))
    return int(size)
