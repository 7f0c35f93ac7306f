"""The sample stream of one epoch: batching at a changeable size, and its resumable state.

The main process turns the sampler's index order into tasks. Because batches are cut here, at the
moment a task is dispatched, the batch size can change between any two batches without skipping
or repeating a sample, and the position in the epoch is one integer (samples handed out), whatever
the batch size or the number of workers.

A sampler's order must be reproducible to resume mid-epoch. dloader records, just before the
sampler draws its randomness (its first index), what that randomness comes from:

* ``RandomSampler`` without a generator: the one 64-bit seed it is about to draw (an integer);
* a sampler with a ``torch.Generator``: that generator's state (a few KiB, not an index list);
* a sampler with a ``generator`` attribute left ``None`` (``SubsetRandomSampler``,
  ``WeightedRandomSampler``): the global torch RNG state;
* a sampler with ``state_dict``/``load_state_dict``: its own state; if it also has
  ``fast_forward(n)`` (``ElasticDistributedSampler``), a restore hands it the ``n`` samples to
  skip instead of iterating over them;
* anything else (``SequentialSampler``, ``DistributedSampler`` after ``set_epoch``): assumed to
  give the same order again, as torch's samplers do for the same epoch.

A sampler with ``begin_batch(size)`` is told the size of each batch before the batch's first
index is drawn (a sampler that shards whole batches over ranks needs it when the size changes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import RandomSampler

from dloader.errors import StateError

__all__ = ["IndexStream", "SamplerSnapshot"]


class SamplerSnapshot:
    """Captures, and later replays, the randomness a sampler draws at the start of an epoch."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def capture(self) -> dict[str, Any]:
        """Describes the sampler's upcoming order; call right before its first index is drawn."""
        sampler = self.sampler
        if _has_state(sampler):
            return {"kind": "stateful", "state": sampler.state_dict()}
        if isinstance(sampler, RandomSampler) and sampler.generator is None:
            # Peek at the seed RandomSampler is about to draw, then put the RNG back untouched.
            rng = torch.get_rng_state()
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            torch.set_rng_state(rng)
            return {"kind": "seed", "seed": seed}
        if not hasattr(sampler, "generator"):
            return {"kind": "none"}
        generator = sampler.generator
        if isinstance(generator, torch.Generator):
            return {"kind": "generator", "state": generator.get_state().numpy().tobytes()}
        return {"kind": "global_rng", "state": torch.get_rng_state().numpy().tobytes()}

    def first_index_with(self, snapshot: dict[str, Any], pull: Any) -> Any:
        """Calls ``pull()`` (the sampler's first draw) with the randomness in ``snapshot``."""
        sampler, kind = self.sampler, snapshot.get("kind")
        if kind == "none":
            return pull()
        if kind == "stateful":
            if not _has_state(sampler):
                raise StateError(
                    f"state holds a stateful sampler's state but {type(sampler).__name__} has "
                    "no load_state_dict()"
                )
            sampler.load_state_dict(snapshot["state"])
            return pull()
        if kind == "seed":
            if not isinstance(sampler, RandomSampler) or sampler.generator is not None:
                raise StateError(
                    "state was saved with a RandomSampler without generator, but this loader has "
                    f"{type(sampler).__name__} (generator={getattr(sampler, 'generator', None)!r})"
                )
            sampler.generator = torch.Generator().manual_seed(int(snapshot["seed"]))
            try:
                return pull()
            finally:
                sampler.generator = None
        if kind == "generator":
            generator = getattr(sampler, "generator", None)
            if not isinstance(generator, torch.Generator):
                raise StateError(
                    "state holds a sampler generator's state but this loader's sampler "
                    f"{type(sampler).__name__} has generator={generator!r}"
                )
            generator.set_state(_bytes_tensor(snapshot["state"]))
            return pull()
        if kind == "global_rng":
            current = torch.get_rng_state()
            torch.set_rng_state(_bytes_tensor(snapshot["state"]))
            try:
                return pull()
            finally:
                torch.set_rng_state(current)
        raise StateError(
            f"unknown sampler snapshot kind={kind!r}; expected one of "
            "'none', 'stateful', 'seed', 'generator', 'global_rng'"
        )


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class IndexStream:
    """Cuts one epoch's sampler order into tasks; the batch size may change between tasks.

    Args:
        source: the sampler (``batched=False``) or the user's batch sampler (``batched=True``).
        batch_size: samples per task, or ``None`` for one un-collated sample per task.
        drop_last: drop a final batch shorter than the batch size current at that time.
        batched: ``source`` yields whole batches (a user-supplied ``batch_sampler``).
        restore: a snapshot from :meth:`SamplerSnapshot.capture` to replay instead of capturing.
        skip: samples (or batches, when ``batched``) to skip at the start: the resume point.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int | None,
        drop_last: bool,
        *,
        batched: bool = False,
        restore: dict[str, Any] | None = None,
        skip: int = 0,
    ) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.batched = batched
        sampler = getattr(source, "sampler", source) if batched else source
        self._snap = SamplerSnapshot(sampler)
        self._begin_batch = None if batched else getattr(sampler, "begin_batch", None)
        self._restore = restore
        self._skip = skip
        self._it: Iterator[Any] = iter(source)
        self._started = False
        self.snapshot: dict[str, Any] | None = None
        self.exhausted = False
        self.rebased = False  # a restored sampler absorbed the skip (see start())
        self.tasks = 0  # tasks cut so far
        self.switch: tuple[int, int] | None = None  # (task index, batch size from that task)

    def start(self) -> None:
        """The first draw: record (or replay) the sampler's randomness, then skip ahead."""
        if self._started:
            return
        self._started = True
        it = self._it
        sentinel = object()
        sampler = self._snap.sampler
        restore = self._restore
        if self._begin_batch is not None and self.batch_size is not None:
            self._begin_batch(self.batch_size)  # the first index is drawn here
        if (
            restore is not None
            and restore.get("kind") == "stateful"
            and callable(getattr(sampler, "fast_forward", None))
        ):
            # The sampler skips the consumed part itself, in O(1), under the current world
            # size; the position restarts at 0 within its new segment.
            self._snap.first_index_with(restore, lambda: None)
            sampler.fast_forward(self._skip)
            self._skip = 0
            self.rebased = True
            self.snapshot = {"kind": "stateful", "state": sampler.state_dict()}
            first = next(it, sentinel)
        elif restore is not None:
            self.snapshot = restore
            first = self._snap.first_index_with(restore, lambda: next(it, sentinel))
        else:
            # Record what the sampler is about to draw, then let it draw as it would anyway
            # (so the RNGs advance exactly as with torch's DataLoader).
            self.snapshot = self._snap.capture()
            first = next(it, sentinel)
        if first is sentinel:
            self._it = iter(())
            return
        self._it = itertools.chain((first,), it)
        if self._skip:
            skipped = sum(1 for _ in itertools.islice(self._it, self._skip))
            if skipped < self._skip:
                self._it = iter(())

    def next_task(self) -> tuple[Any, int]:
        """Returns ``(index, number of samples)`` for the next task; StopIteration at the end."""
        if not self._started:
            self.start()
        try:
            if self.batched:
                batch = next(self._it)
                return batch, len(batch)
            if self.switch is not None and self.tasks >= self.switch[0]:
                self.batch_size, self.switch = self.switch[1], None
            bs = self.batch_size
            if bs is None:
                self.tasks += 1
                return next(self._it), 1
            if self._begin_batch is not None:
                self._begin_batch(bs)
            batch = list(itertools.islice(self._it, bs))
            if not batch or (self.drop_last and len(batch) < bs):
                raise StopIteration
            self.tasks += 1
            return batch, len(batch)
        except StopIteration:
            self.exhausted = True
            raise
