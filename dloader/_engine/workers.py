"""The loader worker process: fetches batches for the main process.

Protocol (all tuples, so that they pickle cheaply):

* main -> worker, on the worker's own index queue:
  ``(generation, task_idx, index)``: fetch one batch. ``index`` is a list of sample indices
  (map-style, auto-collation), one sample index (map-style, ``batch_size=None``), a batch length
  (iterable, auto-collation) or ``None`` (iterable, ``batch_size=None``). A new ``generation``
  (a new epoch) restarts an iterable dataset's iterator.
  ``None``: exit. Tasks still queued when the shared ``done_event`` is set are skipped.
* worker -> main, on the shared result pipe (:class:`dloader._engine.result_pipe.ResultPipe`,
  written synchronously: a batch that cannot be pickled becomes an error naming its samples):
  ``(slot, generation, task_idx, payload, num_samples, fetch_s, cpu_s, run_delay_s)``: the
  batch's wall and CPU seconds and the seconds the worker waited meanwhile, runnable, for a CPU
  (``None``: unknown; :class:`~dloader._engine.telemetry.RunDelayClock`). ``task_idx`` is
  :data:`READY` once after start-up (``payload`` is the PID). ``payload`` is the collated batch, an
  ``ExceptionWrapper`` (re-raised in the main process with the worker's traceback), or
  :data:`ITER_END` when an iterable dataset is exhausted in this worker.

A worker whose main process is gone exits within ``WORKER_POLL_INTERVAL_S``, busy or not (a
watchdog thread), and at once if it is blocked writing a result (the pipe breaks).
"""

from __future__ import annotations

import os
import pickle
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy.random  # imported here so that forked workers inherit it (see seed_worker)
import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import IterableDataset, IterDataPipe, MapDataPipe
from torch.utils.data import graph_settings as _graph_settings
from torch.utils.data._utils import worker as _torch_worker

from dloader._engine.telemetry import RunDelayClock
from dloader._engine.timing import WORKER_POLL_INTERVAL_S

__all__ = ["ITER_END", "READY", "Fetcher", "worker_loop"]

READY = -1


class _IterEnd:
    """Marker: this worker's copy of an iterable dataset is exhausted."""

    def __reduce__(self) -> str:
        return "ITER_END"

    def __repr__(self) -> str:
        return "ITER_END"


ITER_END = _IterEnd()


class Fetcher:
    """Turns one task's index into a collated batch; shared by workers and in-process loading.

    Args:
        dataset: the dataset (map-style or iterable).
        auto_collation: whether tasks are batches (``batch_size`` is not ``None``).
        collate_fn: applied to the list of samples (or to the single sample).
        drop_last: for iterable datasets, drop a final batch shorter than requested.
    """

    def __init__(
        self, dataset: Any, auto_collation: bool, collate_fn: Callable[[Any], Any], drop_last: bool
    ) -> None:
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.iterable = isinstance(dataset, IterableDataset)
        self._iter: Iterator[Any] | None = iter(dataset) if self.iterable else None
        self.ended = False
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if getitems else None

    def restart(self) -> None:
        """Starts a new pass over an iterable dataset (a new epoch)."""
        if self.iterable:
            self._iter = iter(self.dataset)
            self.ended = False

    def fetch(self, index: Any) -> tuple[Any, int]:
        """Returns ``(batch, number of samples)``; raises StopIteration at an iterable's end."""
        if self.iterable:
            return self._fetch_iterable(index)
        if self.auto_collation:
            if self._getitems is not None:
                data = self._getitems(index)
            else:
                dataset = self.dataset
                data = [dataset[i] for i in index]
            return self.collate_fn(data), len(index)
        return self.collate_fn(self.dataset[index]), 1

    def _fetch_iterable(self, count: int | None) -> tuple[Any, int]:
        if self.ended:
            raise StopIteration
        assert self._iter is not None
        if count is None:
            return self.collate_fn(next(self._iter)), 1
        data = []
        for _ in range(count):
            try:
                data.append(next(self._iter))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < count):
            raise StopIteration
        return self.collate_fn(data), len(data)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seeds ``random``, torch and numpy in a worker exactly as torch's DataLoader does."""
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    # numpy >= 2 imports numpy.random lazily; this module imports it in the main process, so a
    # forked worker does not spend ~1 s importing it while competing for cores (measured).
    numpy.random.seed(_torch_worker._generate_state(base_seed, worker_id))
    return seed


def seed_datapipe(dataset: Any, shared_seed: int | None) -> Any:
    """Seeds the random operations (shuffle) of an ``IterDataPipe`` graph from the shared seed,
    as torch's DataLoader does in the main process and in each worker; other datasets as they are.
    """
    if shared_seed is None or not isinstance(dataset, IterDataPipe):
        return dataset
    rng = torch.Generator()
    rng.manual_seed(shared_seed)
    return _graph_settings.apply_random_seed(dataset, rng)


def shard_datapipe(dataset: Any, num_shards: int, shard: int) -> None:
    """Shards a datapipe graph (``sharding_filter``) as torch does: ranks first, then workers."""
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        _graph_settings.apply_sharding(dataset, num_shards, shard)


def _watch_parent(parent: int) -> None:
    """Ends the worker when its main process is gone, even while user code runs."""
    while True:
        time.sleep(WORKER_POLL_INTERVAL_S)
        if os.getppid() != parent:
            os._exit(0)


def _unpicklable(slot: int, index: Any, data: Any, exc: Exception) -> ExceptionWrapper:
    """The error a batch that cannot be sent to the main process becomes."""
    culprit = data
    parts = data if isinstance(data, (list, tuple)) else []
    if isinstance(data, dict):
        parts = list(data.values())
    for part in parts:
        try:
            pickle.dumps(part)
        except Exception:
            culprit = part
            break
    shown = repr(index)
    shown = shown if len(shown) <= 80 else shown[:80] + "..."
    try:
        raise TypeError(
            f"the batch of sample index(es) {shown} cannot be sent to the main process: "
            f"a value of type {type(culprit).__module__}.{type(culprit).__qualname__} cannot be "
            f"pickled ({type(exc).__name__}: {exc})"
        ) from exc
    except TypeError:
        return ExceptionWrapper(where=f"in DataLoader worker process {slot}")


def worker_loop(
    slot: int,
    num_workers: int,
    dataset: Any,
    index_queue: Any,
    result_queue: Any,
    done_event: Any,
    auto_collation: bool,
    collate_fn: Callable[[Any], Any],
    drop_last: bool,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
    generation: int,
    datapipe: tuple[int | None, int, int] | None = None,
) -> None:
    """Body of a worker process (module-level so that it works with spawn and forkserver).

    ``datapipe``: for a datapipe dataset, ``(shared seed, world size, rank)``: the worker seeds
    the graph's random operations and takes its shard of it, in torch's order (after the
    worker's own seeding, before ``init_fn``). Each task is ``(generation, index, key, shared
    seed)``: a new generation (epoch) re-seeds the graph with the seed it carries.
    """
    try:
        torch.set_num_threads(1)
        seed = seed_worker(base_seed, slot)
        if datapipe is not None:
            shared_seed, world, rank = datapipe
            dataset = seed_datapipe(dataset, shared_seed)
            shard_datapipe(dataset, num_workers * world, slot * world + rank)
        # torch.utils.data.get_worker_info() reads this module global; set it so that user code
        # (sharding in an IterableDataset, per-worker seeding) sees the usual values.
        _torch_worker._worker_info = _torch_worker.WorkerInfo(
            id=slot, num_workers=num_workers, seed=seed, dataset=dataset
        )
        init_error: ExceptionWrapper | None = None
        fetcher: Fetcher | None = None
        try:
            if init_fn is not None:
                init_fn(slot)
            fetcher = Fetcher(dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_error = ExceptionWrapper(where=f"in DataLoader worker process {slot}")
        manager_pid = os.getppid()
        result_queue.in_worker()
        threading.Thread(target=_watch_parent, args=(manager_pid,), daemon=True).start()
        result_queue.send((slot, generation, READY, os.getpid(), 0, 0.0, 0.0, None))
        ended = False
        delays = RunDelayClock()
        while True:
            try:
                task = index_queue.get(timeout=WORKER_POLL_INTERVAL_S)
            except queue.Empty:
                if os.getppid() != manager_pid:  # the main process died: nobody to serve
                    break
                continue
            if task is None:
                break
            if done_event.is_set():
                continue  # shutting down: skip queued work, wait for the final None
            gen, task_idx, index, shared_seed = task
            if gen != generation:
                generation = gen
                ended = False
                if fetcher is not None:
                    fetcher.dataset = seed_datapipe(fetcher.dataset, shared_seed)
                    fetcher.restart()
            t0, c0, d0 = time.perf_counter(), time.process_time(), delays.read()
            num = 0
            data: Any
            if init_error is not None:
                data = init_error  # every task reports why this worker cannot fetch
            elif ended:
                data = ITER_END
            else:
                assert fetcher is not None
                try:
                    data, num = fetcher.fetch(index)
                except StopIteration:
                    data, ended = ITER_END, True
                except Exception:
                    data = ExceptionWrapper(where=f"in DataLoader worker process {slot}")
            fetch_s, cpu_s, d1 = time.perf_counter() - t0, time.process_time() - c0, delays.read()
            delay_s = d1 - d0 if d0 is not None and d1 is not None else None
            try:
                result_queue.send((slot, gen, task_idx, data, num, fetch_s, cpu_s, delay_s))
            except (BrokenPipeError, ConnectionError):
                break  # the main process is gone
            except Exception as exc:  # the batch cannot be pickled: say so, naming it
                error = _unpicklable(slot, index, data, exc)
                result_queue.send((slot, gen, task_idx, error, 0, fetch_s, cpu_s, delay_s))
            del data, task, index
    except (KeyboardInterrupt, BrokenPipeError):
        # The main process gets the interrupt too and shuts the workers down; or it is gone.
        pass
