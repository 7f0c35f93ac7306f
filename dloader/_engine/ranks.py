"""This process's place in a ``torch.distributed`` job, and the few collectives dloader uses.

Without an initialised process group every function answers for a single process (rank 0 of
1) and communicates nothing. Used by the elastic checkpoints (:mod:`dloader.elastic`), the
lockstep batch-size change (:func:`dloader.integrations.torchrun.sync_batch_size`) and the
loader's controls (a batch size directed to one rank of several is staged, not applied).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["all_gather", "barrier", "broadcast", "rank_and_world"]


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of this process; ``(0, 1)`` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Waits for every rank (nothing to wait for in a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if rank_and_world()[1] == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
