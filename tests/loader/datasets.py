"""Datasets for the loader tests (module-level so that they pickle under spawn/forkserver)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Range(Dataset[int]):
    """Sample ``i`` is ``i``; optional sleep per sample to make workers slow."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return i


class Augmented(Dataset[Any]):
    """Each sample draws from torch, numpy and random: equal only if workers are seeded alike."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        wid = -1 if info is None else info.id
        return (i, torch.rand(()).item(), float(np.random.rand()), random.random(), wid)


class WithGetItems(Range):
    """Has ``__getitems__`` (batched fetch), which torch prefers when present."""

    def __getitems__(self, indices: list[int]) -> list[Any]:
        return [("batched", i) for i in indices]


class Sharded(IterableDataset[int]):
    """Yields ``range(n)``, split across workers by ``get_worker_info()`` as torch documents."""

    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n = n
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if self.sleep_s:
                time.sleep(self.sleep_s)
            yield i


class Uneven(IterableDataset[int]):
    """Worker ``k`` yields ``k + 1`` items (tests workers ending at different times)."""

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid = 0 if info is None else info.id
        for j in range(wid + 1):
            yield wid * 100 + j


class Failing(Range):
    """Raises on sample ``bad``."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(f"sample {i} is corrupt")
        return i


class SuicidalWorker(Range):
    """The worker that fetches sample ``bad`` kills itself with ``sig`` (SIGKILL)."""

    def __init__(self, n: int, bad: int, sig: int = 9) -> None:
        super().__init__(n)
        self.bad = bad
        self.sig = sig

    def __getitem__(self, i: int) -> int:
        if i == self.bad and get_worker_info() is not None:
            import faulthandler

            faulthandler.disable()  # pytest's handler would print a dump for the signal
            os.kill(os.getpid(), self.sig)
        return i


class Stuck(Range):
    """Sample ``bad`` never returns (well, after an hour)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            time.sleep(3600)
        return i


def record_init(worker_id: int) -> None:
    """A worker_init_fn that leaves a trace in the worker's dataset copy."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.init_seen = worker_id  # type: ignore[attr-defined]


def failing_init(worker_id: int) -> None:
    """A worker_init_fn that fails."""
    raise RuntimeError(f"init failed in worker {worker_id}")


def flatten(batches: Any) -> list[int]:
    """Sample indices of a list of collated index batches, in order."""
    out: list[int] = []
    for b in batches:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) else list(b))
    return out


class Big(Range):
    """Each sample is a numpy array of ``mb`` MB (pickled inline, not shared memory)."""

    def __init__(self, n: int, mb: int = 32, sleep_s: float = 0.0) -> None:
        super().__init__(n)
        self.mb = mb
        self.item_sleep_s = sleep_s

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        import numpy as np

        if self.item_sleep_s:
            time.sleep(self.item_sleep_s)
        return np.full(self.mb << 18, i, dtype=np.float32)


class Unpicklable(Range):
    """Sample ``bad`` holds a lock, which cannot be pickled."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        import threading

        return threading.Lock() if i == self.bad else i


class SpinAfterSlowStart(Range):
    """Each sample spins ``cpu_s`` of this thread's CPU time (the same work on any machine);
    the first sample a process fetches first sleeps ``start_s`` (a worker's start-up)."""

    def __init__(self, n: int, cpu_s: float, start_s: float) -> None:
        super().__init__(n)
        self.cpu_s, self.start_s = cpu_s, start_s
        self._started = 0  # the PID that has fetched (a forked worker starts at its parent's)

    def __getitem__(self, i: int) -> int:
        if self._started != os.getpid():
            self._started = os.getpid()
            time.sleep(self.start_s)
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return i
