"""Whole-batch sharding over data-parallel ranks, at a batch size that may change mid-epoch.

Hugging Face Accelerate shards a loader by whole batches: of the global order cut into batches of
``B``, rank ``r`` of ``W`` takes batches ``r, r + W, r + 2W, ...`` (``BatchSamplerShard``). In
positions of the order, a round of ``W * B`` positions starting at ``p`` gives rank ``r`` the
positions ``[p + r * B, p + (r + 1) * B)``. :class:`BatchShardSampler` yields exactly those, one
round at a time, reading ``B`` afresh at each round (the loader tells it the size of each batch
before drawing it), so a batch-size change applied in lockstep by every rank keeps the ranks'
shards disjoint and the epoch exact. With a constant batch size the samples are those of
accelerate's loader, batch for batch.

Tail, as accelerate with ``even_batches=True``: a last incomplete round is padded with positions
from the start of the order (so every rank gets the same number of full batches), or dropped
with ``drop_last=True``.

The position is one integer, ``start``: positions of the epoch consumed by all ranks before this
segment. Lockstep ranks each consume ``n`` samples, so after a restart under ``W'`` ranks
``start' = start + n * W`` (:meth:`fast_forward`), as for ``dloader.ElasticDistributedSampler``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import Sampler

from dloader._elastic_sampler import check_rank
from dloader._engine.index_stream import SamplerSnapshot
from dloader.errors import StateError

__all__ = ["BatchShardSampler", "broadcast_generator", "worker_arguments"]

_STATE_VERSION = 1


#: torch DataLoader arguments a rebuilt loader keeps (not those of batching and sampling)
_WORKER_ARGS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


def worker_arguments(loader: Any) -> dict[str, Any]:
    """A torch (or dloader) loader's arguments other than dataset, batching and sampling: what
    a loader rebuilt around another sampler keeps."""
    return {name: getattr(loader, name) for name in _WORKER_ARGS}


def broadcast_generator(sampler: Any) -> None:
    """Gives every rank rank 0's generator state for ``sampler`` (collective under
    ``torch.distributed``), so that all ranks draw the same order, as accelerate does."""
    generator = getattr(sampler, "generator", None)
    if generator is None or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() == 1:
        return
    box = [generator.get_state() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    generator.set_state(box[0])


class BatchShardSampler(Sampler[int]):
    """Rank ``rank``'s share of ``order``'s epoch, in whole batches (see the module docstring).

    Args:
        order: the sampler whose order is shared by all ranks (the same order on every rank: a
            ``RandomSampler`` with a generator in the same state, a ``SequentialSampler``, ...).
        num_replicas: the number of data-parallel ranks.
        rank: this process's rank.
        batch_size: the batch size to start with (the loader updates it).
        drop_last: drop a last incomplete round instead of padding it.
    """

    def __init__(
        self,
        order: Sampler[int],
        num_replicas: int,
        rank: int,
        batch_size: int,
        drop_last: bool = False,
    ) -> None:
        check_rank(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.order = order
        self.num_replicas = num_replicas
        self.rank = rank
        self.block = batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0
        self._snap = SamplerSnapshot(order)
        self._upcoming: dict[str, Any] | None = None  # the order's randomness, once described
        self._replay = False  # _upcoming came from a saved state: replay it
        self._saved_world_size = num_replicas

    @property
    def total_length(self) -> int:
        return len(self.order)  # type: ignore[arg-type]

    def __len__(self) -> int:
        """Samples this rank yields from ``start`` to the end of the epoch at the current size."""
        remaining = max(self.total_length - self.start, 0)
        round_len = self.num_replicas * self.block
        rounds = remaining // round_len if self.drop_last else -(-remaining // round_len)
        return rounds * self.block

    def begin_batch(self, size: int) -> None:
        """The size of the batch the loader cuts next (see
        ``dloader._engine.index_stream.IndexStream``)."""
        self.block = size

    def set_epoch(self, epoch: int) -> None:
        """Starts a new epoch (forwarded to the order's sampler, if it has ``set_epoch``)."""
        if epoch != self.epoch:
            self.start = 0
            self._upcoming, self._replay = None, False
        self.epoch = epoch
        if callable(getattr(self.order, "set_epoch", None)):
            self.order.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[int]:
        upcoming, self._upcoming = self._upcoming, None
        replay, self._replay = self._replay, False
        start, self.start = self.start, 0  # one segment per iteration
        order: list[int]
        if replay and upcoming is not None:
            order = self._snap.first_index_with(upcoming, lambda: list(iter(self.order)))
        else:  # drawn as the order's sampler draws it (a captured state describes this draw)
            order = list(iter(self.order))
        n, world, rank = len(order), self.num_replicas, self.rank
        pos = start
        while pos < n:
            b = self.block
            if self.drop_last and pos + world * b > n:
                return
            lo = pos + rank * b
            for p in range(lo, lo + b):
                yield order[p] if p < n else order[(p - n) % n]
            pos += world * b

    def state_dict(self) -> dict[str, Any]:
        """The upcoming segment: where it starts and what the order's randomness will be."""
        if self._upcoming is None:
            self._upcoming = self._snap.capture()
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "start": self.start,
            "world_size": self.num_replicas,
            "total_length": self.total_length,
            "order": self._upcoming,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues a saved segment; :meth:`fast_forward` then skips what was consumed.

        Raises:
            dloader.errors.StateError: another version, or another dataset length.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise StateError(
                "batch-shard sampler state version="
                f"{state.get('version') if isinstance(state, dict) else state!r} is not "
                f"supported; expected {_STATE_VERSION}"
            )
        if state.get("total_length") != self.total_length:
            raise StateError(
                f"dataset length changed: the state has total_length={state.get('total_length')!r}"
                f", this sampler has {self.total_length}"
            )
        self.set_epoch(int(state["epoch"]))
        self.start = int(state["start"])
        self._upcoming, self._replay = state["order"], True
        self._saved_world_size = int(state["world_size"])

    def fast_forward(self, samples_per_rank: int) -> None:
        """Skips ``samples_per_rank`` samples consumed by each rank of the saved world size."""
        self.start = min(self.start + samples_per_rank * self._saved_world_size, self.total_length)
        self._saved_world_size = self.num_replicas
