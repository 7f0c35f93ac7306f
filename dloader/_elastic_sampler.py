"""A DistributedSampler whose epoch can continue under a different world size.

The epoch's global order is a pseudo-random permutation of ``range(len(dataset))`` that depends
only on ``(seed, epoch)``: position ``p`` of the order is ``perm(p)``, computed on demand by a
keyed Feistel network over the next power-of-4 domain with cycle-walking (a bijection, so no
index list is ever built: O(1) memory, O(1) to start anywhere).

Rank ``r`` of ``W`` takes positions ``start + r, start + r + W, ...`` of the order, where
``start`` is how many positions all ranks together had consumed when this segment began (0 at
the start of an epoch). In lockstep data-parallel training every rank consumes the same number
``n`` of samples, so the consumed positions are always the prefix ``[0, start + n * W)``: after
a restart under ``W'`` ranks, ``start' = start + n * W`` and the new ranks stride the rest. Every
position of the epoch is delivered exactly once across all ranks, before and after the change.

Uneven tails follow ``torch.utils.data.DistributedSampler``: with ``drop_last=False`` the last
round is padded with samples from the start of the epoch's order (at most ``W - 1`` duplicates,
only in the final segment, in the world size current then); with ``drop_last=True`` the last
``(len - start) % W`` positions of the epoch are dropped. A change of world size never pads:
padding happens only when the epoch actually ends.

The order differs from ``DistributedSampler``'s (which shuffles with ``torch.randperm``, a
materialised list): same arguments and semantics, different permutation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from dloader.errors import StateError

__all__ = ["ElasticDistributedSampler", "check_rank"]

_STATE_VERSION = 1
_ROUNDS = 6
_CHUNK = 8192
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: int) -> int:
    """splitmix64 finaliser on a Python int (key schedule)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def check_rank(num_replicas: int, rank: int) -> None:
    """``ValueError`` unless ``0 <= rank < num_replicas`` (torch's ``DistributedSampler``
    message, which callers and tests match); every rank check of the package is this one."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas} must be >= 1")
    if rank >= num_replicas or rank < 0:
        raise ValueError(
            f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
        )


class _Permutation:
    """A keyed bijection of ``range(n)``, evaluated for arrays of positions."""

    def __init__(self, n: int, key: int) -> None:
        self.n = n
        bits = max(2, (max(n, 2) - 1).bit_length())
        bits += bits % 2
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        k = key
        self.keys = []
        for _ in range(_ROUNDS):
            k = _mix64(k)
            self.keys.append(np.uint64(k))

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            h = (right ^ k) * np.uint64(0xBF58476D1CE4E5B9)
            h ^= h >> np.uint64(31)
            h *= np.uint64(0x94D049BB133111EB)
            h ^= h >> np.uint64(29)
            left, right = right, left ^ (h & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            out = self._encrypt(positions.astype(np.uint64))
            bad = out >= self.n
            while bad.any():  # cycle-walking: at most a few rounds (domain < 4n)
                out[bad] = self._encrypt(out[bad])
                bad = out >= self.n
        return out.astype(np.int64)


class ElasticDistributedSampler(Sampler[int]):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that survives world-size changes.

    Args:
        dataset: a sized dataset.
        num_replicas: world size (default: from ``torch.distributed``).
        rank: this process's rank (default: from ``torch.distributed``).
        shuffle: shuffle the order per ``(seed, epoch)``.
        seed: shuffle seed; must be the same on every rank (it is part of the state).
        drop_last: drop the uneven tail instead of padding it.

    ``state_dict()`` is a handful of integers, identical on every rank at the same step. With a
    :class:`dloader.DataLoader`, the loader saves it and restores it (under any world size)
    without iterating over the consumed part.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        check_rank(num_replicas, rank)
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.start = 0  # positions of this epoch consumed by all ranks before this segment
        self._perm: _Permutation | None = None
        self._perm_key: tuple[int, int, int] | None = None

    # ------------------------------------------------------------------ sizes

    @property
    def total_length(self) -> int:
        """Samples in one epoch of the dataset (all ranks)."""
        return len(self.dataset)

    @property
    def num_samples(self) -> int:
        """Samples this rank yields from ``start`` to the end of the epoch."""
        remaining = max(self.total_length - self.start, 0)
        if self.drop_last:
            return remaining // self.num_replicas
        return math.ceil(remaining / self.num_replicas)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (the order is a function of ``(seed, epoch)``) and starts it over."""
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch

    # ------------------------------------------------------------------ order

    def _permutation(self) -> _Permutation | None:
        if not self.shuffle:
            return None
        key = (self.seed, self.epoch, self.total_length)
        if self._perm_key != key:
            self._perm = _Permutation(self.total_length, _mix64(self.seed) ^ _mix64(self.epoch + 1))
            self._perm_key = key
        return self._perm

    def global_indices(self, positions: np.ndarray) -> np.ndarray:
        """Dataset indices at ``positions`` of this epoch's global order (padding wraps)."""
        n = self.total_length
        pos = np.asarray(positions, dtype=np.int64) % max(n, 1)
        perm = self._permutation()
        return pos if perm is None else perm(pos)

    def __iter__(self) -> Iterator[int]:
        start, world, rank, count = self.start, self.num_replicas, self.rank, self.num_samples
        for lo in range(0, count, _CHUNK):
            j = np.arange(lo, min(lo + _CHUNK, count), dtype=np.int64)
            yield from self.global_indices(start + rank + j * world).tolist()

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch's segment starts; the same on every rank."""
        return {
            "version": _STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "start": self.start,
            "world_size": self.num_replicas,
            "total_length": self.total_length,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues the saved epoch segment; :meth:`fast_forward` then skips what was consumed.

        Raises:
            dloader.errors.StateError: other version, seed, dataset length or shuffle setting.
        """
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise StateError(
                f"sampler state version="
                f"{state.get('version') if isinstance(state, dict) else state!r} "
                f"is not supported; expected {_STATE_VERSION}"
            )
        for key, mine in (
            ("seed", self.seed),
            ("total_length", self.total_length),
            ("shuffle", self.shuffle),
        ):
            if state.get(key) != mine:
                what = "dataset length changed" if key == "total_length" else f"{key} mismatch"
                raise StateError(
                    f"{what}: the state has {key}={state.get(key)!r}, this sampler "
                    f"has {key}={mine!r}"
                )
        self.epoch = int(state["epoch"])
        self.start = int(state["start"])
        self._saved_world_size = int(state["world_size"])

    def fast_forward(self, samples_per_rank: int) -> None:
        """Skips ``samples_per_rank`` samples consumed by each rank of the saved world size."""
        world = getattr(self, "_saved_world_size", self.num_replicas)
        self.start = min(self.start + samples_per_rank * world, self.total_length)
        self._saved_world_size = self.num_replicas
