"""The loader's iterator: a resizable pool of worker processes delivering batches in order.

How exactly-once in-order delivery survives resizes and batch-size changes:

* Only the main process cuts the sampler's order into tasks
  (:class:`~dloader._engine.index_stream.IndexStream`), numbers them (``task_idx``) and hands each
  task to exactly one worker. Tasks are never re-assigned and results are delivered strictly by
  ``task_idx``. A resize changes only *who* runs future tasks; a batch-size change only how the next
  task is cut.
* Growing starts processes at once but sends them tasks only after they report ``READY``, so a
  slow start (``spawn`` imports torch) never blocks batches behind it. Until then the existing
  workers, or in-process loading when there are none, keep the trainer fed.
* Shrinking marks workers ``retiring``: they get no new tasks, finish the ones they hold, and are
  told to exit once those are back.

With a fixed worker count the task-to-worker assignment is torch's (task ``k`` goes to worker
``k mod N``, every worker seeded ``base_seed + id``), so batches equal torch's for the same seed,
random augmentations in workers included.

Threading: ``request_resize`` may be called from any thread; it only records the target. The
thread iterating applies it between batches or while it waits (every ``POLL_INTERVAL_S``), so all
pool state is owned by that one thread and needs no locks.

Pinned memory (``pin_memory=True`` with an accelerator): as torch's pin-memory thread, a
receiver thread reads the workers' results as they arrive, pins each batch and hands it to the
iterating thread through a queue, so reading a result (unpickling, mapping the worker's shared
memory) and the copy into pinned memory overlap the training step instead of adding to the
trainer's wait. It owns no pool state: it only reads the pipe, and it stops reading (and says
so through the queue) when a worker not told to stop has exited in the middle of a message.
Measured on an H100 node before this (``benchmarks/gpu/bench_gpu.py``): ResNet-18 on JPEGs at 14
workers, 1,272 samples/s pinning in the trainer's thread against torch's 2,143; with a stand-in
for pinning (``benchmarks/loader/bench_pin.py``, no GPU) the receiver delivers 1.6-1.8x.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import queue
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import ExceptionWrapper
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from dloader._engine.index_stream import IndexStream
from dloader._engine.position import STATE_VERSION
from dloader._engine.processes import PROCESS_START_LOCK
from dloader._engine.remote import (
    FAILED,
    GONE,
    REMOTE_SLOT_BASE,
    STOPPED,
    RayWorkers,
    RemoteSlotProcess,
    RemoteSlotQueue,
    helper_loop,
    remote_payload,
)
from dloader._engine.result_pipe import ResultPipe
from dloader._engine.telemetry import Telemetry
from dloader._engine.timing import DEATH_GRACE_S, JOIN_TIMEOUT_S, POLL_INTERVAL_S
from dloader._engine.workers import (
    ITER_END,
    READY,
    Fetcher,
    seed_datapipe,
    shard_datapipe,
    worker_loop,
)
from dloader.errors import RemoteWorkerError, WorkerDiedError, WorkerStartError

__all__ = ["EpochPlan", "IteratorConfig", "LoaderIterator"]

log = logging.getLogger(__name__)

_PENDING = object()  # a task's result has not arrived yet
_DRAIN_EVERY_S = 0.1
"""How often, at most, the batches that arrived ahead of their turn are taken in while the
trainer is served from those that are ready: their workers' timings then count at most this
late (the agent reports windows of 0.25 s and more). They come from the receiver thread's inbox,
already unpickled. When the iterating thread read them from the pipe itself, taking them in
every 10 ms cost a loader of one-sample batches on 2 cores 1-23% of its throughput, and every
0.1 s a CPU-bound loader behind a training step 11% (:func:`_receive_and_pin`)."""


@dataclass(frozen=True)
class IteratorConfig:
    """What an iterator takes from its loader once: the loader's fixed settings (torch's
    arguments, as the loader holds them) and where it leaves its position."""

    dataset: Any
    iterable: bool
    """An ``IterableDataset``: each worker iterates its own copy; no sample stream here."""
    auto_collation: bool
    collate_fn: Callable[[Any], Any]
    timeout: float
    in_order: bool
    worker_init_fn: Callable[[int], None] | None
    persistent_workers: bool
    multiprocessing_context: Any
    prefetch_factor: int | None
    pin_memory: bool
    pin_memory_device: str
    generator: Any
    telemetry: Telemetry
    leave_state: Callable[[int, dict[str, Any]], None]
    """Called with ``(id(iterator), state)`` when the iterator ends or is closed, so that the
    loader still knows the position after ``break``. It must not hold the loader strongly
    (the loader would then live as long as its iterator)."""
    remote: RayWorkers | None = None
    """Where remote workers run (None: none; :mod:`dloader._engine.remote`)."""


@dataclass(frozen=True)
class EpochPlan:
    """What an iterator takes from its loader at the start of each epoch."""

    epoch: int
    num_workers: int
    source: Any
    """The sampler, or the user's batch sampler (``batched``); None for an iterable dataset."""
    batched: bool
    """``source`` yields whole batches (a user-supplied ``batch_sampler``)."""
    batch_size: int | None
    drop_last: bool
    restore: dict[str, Any] | None = None
    """A checked position to resume from (``load_state_dict``)."""
    skip_batches: int = 0
    """Batches to start past, as if delivered (``skip_batches``)."""
    len_called: int | None = None
    """``len(loader)`` as torch recorded it for an iterable dataset (its length warning)."""
    remote_workers: Mapping[str, int] = field(default_factory=dict)
    """Remote workers (Ray) beside the local ones, by where they run (:data:`Placement`)."""


@dataclass
class _Worker:
    slot: int
    process: Any
    index_queue: Any
    state: str = "starting"  # starting -> ready -> retiring; or ready -> ended (iterable, epoch)
    in_flight: int = 0  # tasks sent and not yet returned
    owed: int = 0  # tasks sent and not yet delivered to the trainer (bounded by prefetch_factor)
    stopping: bool = False  # told to exit; a clean exit is expected
    remote: bool = False  # a remote worker (a Ray actor, through the helper process)
    place: str = ""  # a remote worker's place: "" the pool, else a node lending it cores


class _Task:
    __slots__ = ("data", "index", "num", "slot")

    def __init__(self, slot: int | None, num: int, index: Any = None) -> None:
        self.slot = slot
        self.num = num
        self.index = index  # what the task fetches (given again if its remote worker is lost)
        self.data: Any = _PENDING


class _Pinned:
    """A batch the receiver thread pinned."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data


@dataclass(frozen=True)
class _ReceiveFailed:
    """The receiver thread's last word: reading the workers' results failed (the iterating
    thread names the dead worker, as when it reads itself)."""

    error: BaseException


def _receive_and_pin(
    pipe: ResultPipe,
    inbox: queue.SimpleQueue[Any],
    stop: threading.Event,
    workers: dict[int, _Worker],
    pin: bool,
    device: str | None,
    index: int | None,
) -> None:
    """The receiver thread: reads each message from the workers as it arrives, unpickles it,
    with ``pin`` pins a batch's data (a pin error becomes the batch's error, as in torch's
    pin-memory thread) and queues it for the iterating thread, until ``stop``. While a message
    is half read it checks, between polls, that no worker not told to stop has exited; if one
    has, or a read fails, it queues the failure and ends.

    Why a thread even without pinning: unpickling a batch's tensors fetches their shared-memory
    file descriptors from the sending worker's ``resource_sharer`` thread, which needs that
    worker's GIL. Just after sending, the worker mostly waits for its next task and answers at
    once; while it computes its next batch, each fetch waited for its GIL switch interval.
    Read by the iterating thread when their turn came, or taken in with the batches ahead of
    their turn, CPU-bound batches on 2 cores stalled the trainer 6-9 ms each: 0.85-0.94x torch's
    throughput at 2-4 workers, 1.02-1.04x with this thread (docs/benchmarks.md)."""
    if pin:
        if index is not None:
            torch.accelerator.set_device_index(index)  # the current device is per thread
        torch.set_num_threads(1)

    def check() -> None:
        if stop.is_set():  # the iterator is shutting down (PEP 475: never a real EINTR)
            raise InterruptedError("the DataLoader iterator is shutting down")
        for w in list(workers.values()):
            if not w.stopping and w.process.exitcode is not None:
                raise EOFError(f"worker {w.slot} exited in the middle of a message")

    while not stop.is_set():
        try:
            msg = pipe.recv(POLL_INTERVAL_S, check, POLL_INTERVAL_S)
        except queue.Empty:
            continue
        except InterruptedError:
            return
        except BaseException as exc:
            inbox.put(_ReceiveFailed(exc))
            return
        slot, gen, task_idx, payload, num, fetch_s, cpu_s, delay_s = msg
        if (
            pin
            and task_idx >= 0
            and payload is not ITER_END
            and not isinstance(payload, ExceptionWrapper)
        ):
            try:
                payload = _Pinned(_pin_memory(payload, device))
            except Exception:
                payload = ExceptionWrapper(where="in the pin-memory thread")
            msg = (slot, gen, task_idx, payload, num, fetch_s, cpu_s, delay_s)
        inbox.put(msg)


def _describe_exit(worker: _Worker) -> str:
    """torch's sentence for a worker that died (``torch/csrc/DataLoader.cpp``, which log
    scrapers and tests match), then which worker it was."""
    code, pid = worker.process.exitcode, worker.process.pid
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        text = f"DataLoader worker (pid {pid}) is killed by signal: {signal.strsignal(-code)}. "
        if -code == signal.SIGBUS:
            text += (
                "It is possible that dataloader's workers are out of shared memory. Please try "
                "to raise your shared memory limit. "
            )
        return f"{text}(worker {worker.slot}, {name})"
    return (
        f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code}. Details are "
        "lost due to multiprocessing. Rerunning with num_workers=0 may give better error "
        f"trace. (worker {worker.slot})"
    )


class LoaderIterator:
    """Iterates a :class:`dloader.DataLoader` once (or once per epoch with persistent workers)."""

    def __init__(self, config: IteratorConfig, plan: EpochPlan) -> None:
        self._loader_kind_iterable = config.iterable
        self._dataset = config.dataset
        self._auto_collation = config.auto_collation
        self._collate_fn = config.collate_fn
        self._drop_last = plan.drop_last
        self._timeout = config.timeout
        self._in_order = config.in_order
        self._worker_init_fn = config.worker_init_fn
        self._persistent = config.persistent_workers
        self._telemetry = config.telemetry
        self._generator = config.generator
        self._leave = config.leave_state  # to leave the final position with the loader
        self._len_called = plan.len_called
        self._pin_memory = self._check_pin_memory(config)
        self._pin_device = None
        self._inbox: queue.SimpleQueue[Any] | None = None  # the receiver thread's messages
        self._receiver: threading.Thread | None = None
        self._receiver_stop = threading.Event()
        if self._pin_memory:
            acc = torch.accelerator.current_accelerator()
            self._pin_device = acc.type if acc is not None else None
        initial = plan.num_workers
        if initial == 0 and self._timeout != 0:
            # Same error as torch's single-process iterator.
            raise AssertionError("_SingleProcessDataLoaderIter requires timeout == 0")
        self._ctx = config.multiprocessing_context or torch.multiprocessing
        self._prefetch = config.prefetch_factor or 2
        self._workers: dict[int, _Worker] = {}
        self._active: list[int] = []  # slots of ready workers that take new tasks, sorted
        self._balance = False  # a remote worker is active: dispatch to the least loaded
        self._target = initial
        self._pending_target: int | None = None
        self._control = threading.Lock()
        self._shutdown = False
        self._n_stopping = 0  # workers told to exit and not yet joined
        self._launchers: list[threading.Thread] = []  # threads starting workers for a resize
        self._launch_error: BaseException | None = None
        self._gen = 0
        self._result_queue: Any = None
        self._drain_at = 0.0  # when to take in the batches ahead of their turn next
        self._done_event: Any = None
        self._in_process: Fetcher | None = None
        self._remote = config.remote
        self._remote_target = dict(plan.remote_workers) if config.remote is not None else {}
        self._pending_remote: dict[str, int] | None = None
        self._helper: Any = None  # the remote workers' helper process (the Ray driver)
        self._helper_tasks: Any = None
        self._remote_serial = itertools.count(REMOTE_SLOT_BASE)
        self._remote_losses = 0  # remote workers lost in a row (replacements back off)
        self._respawn_at = 0.0  # when a lost remote worker's replacement may start
        # Datapipes, as torch: their graph's shuffles are seeded from a seed drawn from the
        # loader's generator (shared by every rank) for each epoch, and sharded over ranks (and
        # workers).
        self._datapipe = isinstance(self._dataset, (IterDataPipe, MapDataPipe))
        self._seed_group: Any = None
        self._world, self._rank = (
            (dist.get_world_size(), dist.get_rank())
            if dist.is_available() and dist.is_initialized()
            else (1, 0)
        )
        self._shared_seed: int | None = None
        self._share_seed()
        self._new_epoch(plan)
        # As torch: the workers' base seed is drawn after the sampler iterator is made and before
        # its first index, from the loader's generator.
        self._base_seed = int(
            torch.empty((), dtype=torch.int64).random_(generator=self._generator).item()
        )
        if initial > 0:
            self._spawn(initial, ready=True)
            self._share_seed()  # as torch's first reset: a second draw, for this process
            self._fill()
        elif self._datapipe:
            shard_datapipe(self._dataset, self._world, self._rank)
        elif self._loader_kind_iterable:
            self._in_process_fetcher()  # as torch: iter(dataset) when the iterator is made
        for place, count in self._remote_target.items():
            self._spawn_remote(count, place)  # they take tasks once up

    # ------------------------------------------------------------------ epoch and state

    def _new_epoch(self, plan: EpochPlan) -> None:
        self._gen += 1
        self._tasks: dict[int, _Task] = {}
        self._done_order: list[int] = []  # arrival order, for in_order=False
        self._send_idx = 0
        self._rcvd_idx = 0
        self._last_slot = -1  # as torch, each epoch's round-robin starts at worker 0
        self._samples_yielded = 0
        self._batches_yielded = 0
        self._exhausted = False
        self._stream_done = False
        self._epoch = plan.epoch
        self._drop_last = plan.drop_last
        restore = plan.restore
        self._replay = 0  # iterable datasets: batches to fetch and drop to reach a resume point
        skip = 0
        snapshot = None
        if restore is not None and not restore["exhausted"]:
            snapshot = restore["sampler"]
            self._samples_yielded = restore["samples_yielded"]
            self._batches_yielded = restore["batches_yielded"]
            if self._loader_kind_iterable:
                self._replay = restore["batches_yielded"]
                self._batches_yielded = 0  # counted again while replaying
                self._samples_yielded = 0
            else:
                skip = self._batches_yielded if plan.batched else self._samples_yielded
        skip_batches = plan.skip_batches
        if skip_batches:  # DataLoader.skip_batches(): as if they had been delivered
            if self._loader_kind_iterable:
                self._replay += skip_batches  # read and dropped (counted then)
            elif plan.batched:
                skip += skip_batches
                self._batches_yielded += skip_batches
            else:
                skip += skip_batches * (plan.batch_size or 1)
                self._samples_yielded += skip_batches * (plan.batch_size or 1)
                self._batches_yielded += skip_batches
        self._batch_size = plan.batch_size
        self._stream: IndexStream | None = None
        if not self._loader_kind_iterable:
            self._stream = IndexStream(
                plan.source,
                plan.batch_size,
                plan.drop_last,
                batched=plan.batched,
                restore=snapshot,
                skip=skip,
            )
            if snapshot is not None:
                self._stream.start()
                if self._stream.rebased:  # the position now counts from the sampler's segment
                    self._samples_yielded = self._batches_yielded = 0
        for w in self._workers.values():
            w.owed = 0  # tasks of an abandoned epoch are never delivered
            if w.state == "ended":
                w.state = "ready"
        self._rebuild_active()
        if self._in_process is not None:
            self._in_process.restart()

    def _share_seed(self) -> None:
        """Draws the epoch's datapipe seed (rank 0's, for every rank) and seeds this process's
        graph with it; workers get it with their next task."""
        if not isinstance(self._dataset, IterDataPipe):
            return
        seed = torch.empty((), dtype=torch.int64).random_(generator=self._generator)
        if self._world > 1:
            if self._seed_group is None:
                self._seed_group = dist.new_group(backend="gloo")
            dist.broadcast(seed, src=0, group=self._seed_group)
        self._shared_seed = int(seed.item())
        self._dataset = seed_datapipe(self._dataset, self._shared_seed)

    def reset(self, plan: EpochPlan) -> None:
        """Starts a new epoch on the same (persistent) workers."""
        self._len_called = plan.len_called  # as torch: len() may be new
        self._new_epoch(plan)
        self._share_seed()
        self._target = plan.num_workers
        self._apply_target()
        if self._remote is not None:
            self._remote_target = dict(plan.remote_workers)
            self._apply_remote_target()
        self._fill()

    def state(self, *, pin_order: bool = True) -> dict[str, Any]:
        """The resumable state of this epoch (see ``DataLoader.state_dict``).

        ``pin_order=False`` does not make an unstarted sampler draw its order (used when the
        iterator goes away: nothing was delivered, so there is nothing to pin)."""
        if not self._in_order:
            raise ValueError(
                "state_dict() needs in_order=True: with in_order=False the delivered samples are "
                "not a prefix of the sampler's order, so a few integers cannot describe them"
            )
        stream = self._stream
        if pin_order and stream is not None and stream.snapshot is None and not self._exhausted:
            # Nothing drawn yet (in-process loading draws at the first next()): draw now, so
            # that the state pins this epoch's order.
            stream.start()
        return {
            "version": STATE_VERSION,
            "dataset_kind": "iterable" if self._loader_kind_iterable else "map",
            "epoch": self._epoch,
            "samples_yielded": self._samples_yielded,
            "batches_yielded": self._batches_yielded,
            "batch_size": self._batch_size,
            "num_workers": self._target,
            "sampler": stream.snapshot if stream is not None else None,
            "dataset_len": None if self._loader_kind_iterable else len(self._dataset),
            "exhausted": self._exhausted,
        }

    @property
    def exhausted(self) -> bool:
        """Whether this epoch has been delivered completely."""
        return self._exhausted

    # ------------------------------------------------------------------ control (any thread)

    def request_resize(self, num_workers: int) -> None:
        """Asks for ``num_workers`` workers; applied by the iterating thread between batches."""
        with self._control:
            self._pending_target = num_workers

    def request_remote_resize(self, workers: Mapping[str, int]) -> None:
        """Asks for remote workers by place (:data:`Placement`); applied as
        :meth:`request_resize` is."""
        with self._control:
            self._pending_remote = dict(workers)

    def cut_batches_at(self, batch_size: int, at_batch: int | None = None) -> None:
        """Cuts batches not yet dispatched at ``batch_size`` (an int store: atomic), or those
        from batch ``at_batch`` of this iteration on (not dispatched yet: ValueError)."""
        if at_batch is not None and self._stream is not None:
            if at_batch < self._send_idx:
                raise ValueError(
                    f"at_batch={at_batch} is already dispatched ({self._send_idx} batches "
                    "cut so far)"
                )
            self._stream.switch = (at_batch, batch_size)
        elif self._stream is not None:
            self._stream.batch_size = batch_size
        self._batch_size = batch_size

    @property
    def batches_yielded(self) -> int:
        """Batches of this epoch delivered so far (with those skipped or restored past)."""
        return self._batches_yielded

    @property
    def batches_cut(self) -> int:
        """Batches cut from the sampler so far in this iteration (dispatched or delivered)."""
        return self._send_idx

    @property
    def live_workers(self) -> int:
        """Local workers started or ready and not retiring."""
        return sum(1 for w in self._workers.values() if w.state != "retiring" and not w.remote)

    # ------------------------------------------------------------------ pool management

    @staticmethod
    def _check_pin_memory(config: IteratorConfig) -> bool:
        if config.pin_memory and config.pin_memory_device:
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the "
                f"device,ignore pin_memory_device='{config.pin_memory_device}'.",
                stacklevel=4,
            )
        if config.pin_memory and not torch.accelerator.is_available():
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=4,
            )
        return bool(config.pin_memory and torch.accelerator.is_available())

    def _spawn(self, count: int, *, ready: bool) -> None:
        """Creates ``count`` workers. The initial pool starts here, as torch's does; workers added
        by a resize start on a launcher thread, because a fork of a large process takes tens of
        milliseconds each and the trainer must not wait for them."""
        self._open_results()
        processes = []
        for _ in range(count):
            slot = next(i for i in itertools.count() if i not in self._workers)
            index_queue = self._ctx.Queue()
            index_queue.cancel_join_thread()
            process = self._ctx.Process(
                target=worker_loop,
                args=(
                    slot,
                    self._target,
                    self._dataset,
                    index_queue,
                    self._result_queue,
                    self._done_event,
                    self._auto_collation,
                    self._collate_fn,
                    self._drop_last,
                    self._base_seed,
                    self._worker_init_fn,
                    self._gen,
                    (self._shared_seed, self._world, self._rank) if self._datapipe else None,
                ),
                daemon=True,
            )
            worker = _Worker(slot, process, index_queue, state="ready" if ready else "starting")
            self._workers[slot] = worker
            self._telemetry.worker(slot).state = worker.state
            processes.append(process)
        if ready:
            with PROCESS_START_LOCK:
                for process in processes:
                    process.start()
            for w in self._workers.values():
                if w.process in processes:
                    self._telemetry.worker(w.slot).pid = w.process.pid
            self._rebuild_active()
        else:
            launcher = threading.Thread(
                target=self._start_processes,
                args=(processes,),
                name="dloader-launcher",
                daemon=True,
            )
            self._launchers.append(launcher)
            launcher.start()

    def _start_processes(self, processes: list[Any]) -> None:
        for process in processes:
            try:
                with PROCESS_START_LOCK:
                    process.start()
            except BaseException as exc:  # e.g. an unpicklable dataset under spawn
                self._launch_error = exc
                return

    def _spawn_remote(self, count: int, place: str) -> None:
        """Adds ``count`` remote workers at ``place`` (:data:`Placement`): slots the helper
        process runs as Ray actors (the helper and the result pipe start with the first). They
        take tasks once up."""
        assert self._remote is not None
        self._open_results()
        if self._helper is None:
            self._helper_tasks = self._ctx.Queue()
            self._helper_tasks.cancel_join_thread()
            payload = remote_payload(
                self._dataset,
                self._auto_collation,
                self._collate_fn,
                self._drop_last,
                self._base_seed,
                self._worker_init_fn,
            )
            self._helper = self._ctx.Process(
                target=helper_loop,
                args=(
                    self._remote,
                    payload,
                    self._helper_tasks,
                    self._result_queue,
                    self._done_event,
                ),
                name="dloader-remote",
                daemon=True,
            )
            with PROCESS_START_LOCK:
                self._helper.start()
        total = self._target + sum(self._remote_target.values())
        for _ in range(count):
            slot = next(self._remote_serial)
            worker = _Worker(
                slot,
                RemoteSlotProcess(self._helper),
                RemoteSlotQueue(self._helper_tasks, slot),
                remote=True,
                place=place,
            )
            self._workers[slot] = worker
            rec = self._telemetry.worker(slot)
            rec.state, rec.remote, rec.place = worker.state, True, place
            self._helper_tasks.put(("add", slot, total, place))

    def _rebuild_active(self) -> None:
        self._active = sorted(s for s, w in self._workers.items() if w.state == "ready")
        self._balance = any(self._workers[s].remote for s in self._active)

    def _apply_pending(self) -> None:
        with self._control:
            target, self._pending_target = self._pending_target, None
            remote, self._pending_remote = self._pending_remote, None
        if self._shutdown:
            return
        if target is not None:
            self._target = target
            self._apply_target()
        if remote is not None and self._remote is not None:
            self._remote_target = remote
            self._apply_remote_target()

    def _apply_target(self) -> None:
        self._resize_kind(remote=False, target=self._target)

    def _apply_remote_target(self) -> None:
        places = set(self._remote_target) | {w.place for w in self._workers.values() if w.remote}
        for place in sorted(places):
            self._resize_kind(remote=True, target=self._remote_target.get(place, 0), place=place)

    def _resize_kind(self, *, remote: bool, target: int, place: str = "") -> None:
        live = [
            w
            for w in self._workers.values()
            if w.state != "retiring" and w.remote == remote and w.place == place
        ]
        if len(live) < target:
            if remote:
                self._spawn_remote(target - len(live), place)
            else:
                self._spawn(target - len(live), ready=False)
        elif len(live) > target:
            # Retire workers that have not started serving first, then the highest slots.
            live.sort(key=lambda w: (w.state != "starting", -w.slot))
            for w in live[: len(live) - target]:
                self._retire(w)
            self._rebuild_active()

    def _retire(self, w: _Worker) -> None:
        w.state = "retiring"
        self._telemetry.worker(w.slot).state = "retiring"
        if w.in_flight == 0:
            self._stop(w)

    def _stop(self, w: _Worker) -> None:
        if not w.stopping:
            w.stopping = True
            self._n_stopping += 1
            with contextlib.suppress(OSError, ValueError):  # queue already closed
                w.index_queue.put(None)

    def _reap(self) -> None:
        """Joins retired workers that have exited and raises if any other worker died."""
        if self._remote_losses:
            self._respawn_remote()
        self._check_helper()
        if self._launch_error is not None:
            exc, self._launch_error = self._launch_error, None
            self._shutdown_workers(graceful=False)
            raise WorkerStartError(f"could not start a DataLoader worker: {exc!r}") from exc
        if self._launchers:
            self._launchers = [t for t in self._launchers if t.is_alive()]
        died = []
        for slot, w in list(self._workers.items()):
            if w.process.exitcode is None:
                continue
            if w.stopping:
                w.process.join()
                w.index_queue.close()
                del self._workers[slot]
                self._n_stopping -= 1
                with self._telemetry.lock:
                    self._telemetry.workers.pop(slot, None)
            else:
                died.append(w)
        if died:
            pids = tuple(w.process.pid for w in died)
            self._shutdown_workers(graceful=False)
            raise WorkerDiedError(" ".join(_describe_exit(w) for w in died), pids)

    # ------------------------------------------------------------------ dispatch and receive

    def _next_slot(self) -> int | None:
        active = self._active
        if not active:
            return None
        if self._balance:
            # Remote workers beside local ones run at other speeds: the next task goes to the
            # ready worker with the fewest tasks out (below its prefetch share), so that a
            # fast worker gets more; without remote workers, torch's round robin.
            return self._least_loaded()
        if not self._in_order:
            # As torch: a worker takes a new task only while it holds fewer than its share.
            cap = self._prefetch
            for slot in active[bisect.bisect_right(active, self._last_slot) :] + active:
                if self._workers[slot].owed < cap:
                    return slot
            return None
        i = bisect.bisect_right(active, self._last_slot)
        return active[i] if i < len(active) else active[0]

    def _least_loaded(self) -> int | None:
        """The ready worker with the fewest tasks out and room for one more (None: none)."""
        best: int | None = None
        n = len(self._active)
        start = bisect.bisect_right(self._active, self._last_slot)
        for k in range(n):
            slot = self._active[(start + k) % n]
            w = self._workers[slot]
            if w.in_flight >= self._prefetch:
                continue
            if best is None or w.in_flight < self._workers[best].in_flight:
                best = slot
        return best

    def _fill(self) -> None:
        """Dispatches until ``prefetch_factor`` tasks per ready worker are undelivered, as torch."""
        if self._stream_done or not self._active:
            return
        workers = self._workers
        owed = sum(workers[s].owed for s in self._active)
        cap = self._prefetch * len(self._active)
        while owed < cap:
            slot = self._next_slot()
            if slot is None:
                return
            index, num = self._next_index()
            if index is _PENDING:
                return
            w = workers[slot]
            w.index_queue.put((self._gen, self._send_idx, index, self._shared_seed))
            self._tasks[self._send_idx] = _Task(slot, num, index if self._remote else None)
            self._send_idx += 1
            self._last_slot = slot
            w.in_flight += 1
            w.owed += 1
            owed += 1

    def _next_index(self) -> tuple[Any, int]:
        if self._stream is None:  # iterable: the worker's copy of the dataset decides
            return self._batch_size, 0
        try:
            return self._stream.next_task()
        except StopIteration:
            self._stream_done = True
            return _PENDING, 0

    def _receive(self, msg: tuple[Any, ...]) -> None:
        slot, gen, task_idx, payload, num, fetch_s, cpu_s, delay_s = msg
        w = self._workers.get(slot)
        if task_idx == READY:
            if w is not None:
                rec = self._telemetry.worker(slot)
                if w.remote:
                    pid, host, error = payload
                    if error is not None:
                        self._shutdown_workers(graceful=False)
                        raise RemoteWorkerError(
                            f"remote worker {slot} on {host} cannot load the dataset: {error}\n"
                            "A remote worker gets a pickled copy of the dataset and must reach "
                            "its files from its own node (docs/remote.md)"
                        )
                    payload = w.process.pid = pid
                    w.process.host = host
                    self._remote_losses = 0
                rec.pid = payload
                if w.state == "starting":
                    w.state = rec.state = "ready"
                    self._rebuild_active()
            return
        if task_idx == FAILED:
            self._shutdown_workers(graceful=False)
            raise RemoteWorkerError(f"remote workers cannot start: {payload}")
        if task_idx == STOPPED:
            if w is not None:
                w.process.stopped = True
            return
        if task_idx == GONE:
            if w is not None:
                self._lose(w, *payload)
            return
        if w is not None:
            w.in_flight -= 1
            if w.state == "retiring" and w.in_flight == 0:
                self._stop(w)
        if gen != self._gen:
            return  # a result from an abandoned epoch (persistent workers)
        task = self._tasks.get(task_idx)
        if task is None or task.slot != slot:
            return  # given again to another worker after this one was taken for lost
        self._telemetry.record_fetch(slot, fetch_s, cpu_s, delay_s)
        task.data, task.num = payload, num
        if payload is ITER_END and w is not None and w.state == "ready":
            w.state = "ended"
            self._rebuild_active()
        if not self._in_order:
            self._done_order.append(task_idx)

    def _lose(self, w: _Worker, why: str, held: list[int]) -> None:
        """A remote worker (or its node) died: its tasks not yet returned go to other workers
        with their indices unchanged (or are loaded here if none is ready), and the loader goes
        on with the workers it has. Its target stays: a replacement is started, and takes tasks
        once the cluster has room for it."""
        del self._workers[w.slot]
        if w.stopping:
            self._n_stopping -= 1
        with self._telemetry.lock:
            self._telemetry.workers.pop(w.slot, None)
        self._rebuild_active()
        given = 0
        for task_idx in held:
            task = self._tasks.get(task_idx)
            if task is None or task.slot != w.slot or task.data is not _PENDING:
                continue
            given += 1
            slot = self._least_loaded()
            if slot is None and self._active:
                slot = min(self._active, key=lambda s: self._workers[s].in_flight)
            if slot is None:
                task.slot = None
                task.data, task.num = self._fetch_index(task.index)
                if not self._in_order:
                    self._done_order.append(task_idx)
                continue
            new = self._workers[slot]
            new.index_queue.put((self._gen, task_idx, task.index, self._shared_seed))
            task.slot = slot
            new.in_flight += 1
            new.owed += 1
        log.warning(
            "dloader: remote worker %d%s lost (%s): %d batch(es) it held given to other workers",
            w.slot,
            f" on {w.process.host}" if w.process.host else "",
            why,
            given,
        )
        self._remote_losses += 1
        self._respawn_at = time.monotonic() + min(2.0 ** (self._remote_losses - 1), 60.0)

    def _check_helper(self) -> None:
        """Raises if the remote workers' helper (the Ray driver) exited unasked, with its exit
        code: its workers' tasks cannot come back. (A helper that could not join the cluster
        says why first, on the pipe: ``FAILED``.)"""
        helper = self._helper
        if helper is None or self._shutdown or helper.exitcode is None:
            return
        code = helper.exitcode
        self._drain_nowait()  # a helper that could not join the cluster said why (FAILED)
        self._shutdown_workers(graceful=False)
        raise RemoteWorkerError(
            f"the remote workers' helper process (the Ray driver, pid {helper.pid}) exited "
            f"with code {code}"
        )

    def _respawn_remote(self) -> None:
        """Starts replacements for lost remote workers once their back-off has passed (1 s,
        then twice as long after each loss in a row, at most a minute: a node that is gone
        does not make the loader start actor after actor)."""
        if self._remote is None or self._shutdown or time.monotonic() < self._respawn_at:
            return
        live = sum(1 for w in self._workers.values() if w.remote and w.state != "retiring")
        if live < sum(self._remote_target.values()):
            self._apply_remote_target()

    def _fetch_index(self, index: Any) -> tuple[Any, int]:
        """One task loaded in this process (an error is the batch's, as from a worker)."""
        try:
            return self._in_process_fetcher().fetch(index)
        except Exception:
            return ExceptionWrapper(where="in the DataLoader's main process"), 0

    def _open_results(self) -> None:
        """With the first worker, local or remote: the result pipe, the workers' shutdown event
        and the receiver thread (:func:`_receive_and_pin`). The thread is given what it reads,
        never ``self``: a thread holding the iterator would keep it from being collected (and
        its workers from being stopped) when the trainer drops it."""
        if self._result_queue is not None:
            return
        self._result_queue = ResultPipe(self._ctx)
        self._done_event = self._ctx.Event()
        self._inbox = queue.SimpleQueue()
        index = None if self._pin_device is None else torch.accelerator.current_device_index()
        self._receiver = threading.Thread(
            target=_receive_and_pin,
            args=(
                self._result_queue,
                self._inbox,
                self._receiver_stop,
                self._workers,
                self._pin_memory,
                self._pin_device,
                index,
            ),
            name="dloader-pin" if self._pin_memory else "dloader-receive",
            daemon=True,
        )
        self._receiver.start()

    def _recv(self, timeout: float) -> tuple[Any, ...]:
        """The next message from the workers (through the receiver thread); ``queue.Empty``
        if none within ``timeout``. A failed read names the dead worker."""
        assert self._inbox is not None  # opened with the result pipe (_open_results)
        try:
            item = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
            if isinstance(item, _ReceiveFailed):
                raise item.error
            return item
        except queue.Empty:
            raise
        except Exception as exc:
            # A batch whose sender died cannot be unpickled (torch shares tensors through the
            # sender's file-descriptor server): report the dead worker, as torch does.
            self._reap_after_error(exc)
            raise

    def _wait(self) -> None:
        """Blocks for one message from the workers, applying resizes and checking liveness."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            try:
                msg = self._recv(POLL_INTERVAL_S)
            except queue.Empty:
                self._reap()
                if self._pending_target is not None or self._pending_remote is not None:
                    self._apply_pending()
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} seconds"
                    ) from None
                continue
            self._receive(msg)
            return

    def _reap_after_error(self, exc: BaseException) -> None:
        deadline = time.monotonic() + DEATH_GRACE_S
        while True:
            try:
                self._reap()
            except WorkerDiedError as died:
                raise died from exc
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def _drain_nowait(self) -> None:
        """Reads messages already waiting without blocking (start-up reports, batches ahead of
        their turn)."""
        while True:
            try:
                msg = self._recv(0.0)
            except queue.Empty:
                return
            self._receive(msg)

    # ------------------------------------------------------------------ the iterator protocol

    def __iter__(self) -> LoaderIterator:
        return self

    def __next__(self) -> Any:
        enter = time.perf_counter()
        while True:
            try:
                data, num = self._next_data()
            except StopIteration:
                self._exhausted = True
                self._leave_state()
                if not self._persistent:
                    self._shutdown_workers()
                raise
            self._samples_yielded += num
            self._batches_yielded += 1
            if not self._replay:
                break
            self._replay -= 1  # resuming an iterable dataset: drop batches already delivered
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        if isinstance(data, _Pinned):
            data = data.data
        elif self._pin_memory:  # loaded in this process
            data = _pin_memory(data, self._pin_device)
        self._telemetry.record_batch(enter, time.perf_counter(), num)
        if self._len_called is not None and self._batches_yielded > self._len_called:
            self._warn_length()
        return data

    def _next_data(self) -> tuple[Any, int]:
        tasks = self._tasks
        if self._n_stopping:
            self._reap()  # join retired workers that have exited
        if self._result_queue is not None and time.monotonic() >= self._drain_at:
            # Batches that arrived ahead of their turn are taken in now, not when their turn
            # comes: their workers' timings then count in the window they were made in (with
            # 8 workers and a slow accelerator, the first timed batches otherwise reached the
            # telemetry 2-3 s late). The tasks waiting are bounded as before (``_fill``).
            self._drain_at = time.monotonic() + _DRAIN_EVERY_S
            self._drain_nowait()
        while True:
            if self._pending_target is not None or self._pending_remote is not None:
                self._apply_pending()
            if self._in_order:
                task = tasks.get(self._rcvd_idx)
                while task is not None and task.data is not _PENDING:
                    del tasks[self._rcvd_idx]
                    self._rcvd_idx += 1
                    self._settle(task)
                    if task.data is ITER_END:
                        task = tasks.get(self._rcvd_idx)
                        continue
                    self._fill()
                    self._update_depth()
                    return task.data, task.num
            elif self._done_order:
                task = tasks.pop(self._done_order.pop(0))
                self._settle(task)
                self._fill()
                if task.data is not ITER_END:
                    self._update_depth()
                    return task.data, task.num
                continue
            if not tasks:
                self._fill()
                if not tasks:
                    if self._stream_done:
                        raise StopIteration
                    if not self._active:
                        if self._loader_kind_iterable and self._workers:
                            raise StopIteration  # every worker's copy is exhausted
                        # No worker is serving (none asked for, or new ones still starting):
                        # load in this process rather than wait.
                        return self._fetch_here()
            self._wait()

    def _settle(self, task: _Task) -> None:
        w = self._workers.get(task.slot) if task.slot is not None else None
        if w is not None:
            w.owed -= 1

    def _fetch_here(self) -> tuple[Any, int]:
        if self._result_queue is not None:
            self._drain_nowait()
            if self._active:
                self._fill()
                return self._next_data()
            self._reap()
        fetcher = self._in_process_fetcher()
        if self._stream is None:
            index: Any = self._batch_size
        else:
            try:
                index, _ = self._stream.next_task()
            except StopIteration:
                self._stream_done = True
                raise
        self._send_idx += 1
        self._rcvd_idx += 1
        try:
            return fetcher.fetch(index)
        except StopIteration:
            self._stream_done = True
            raise

    def _in_process_fetcher(self) -> Fetcher:
        if self._in_process is None:
            self._in_process = Fetcher(
                self._dataset, self._auto_collation, self._collate_fn, self._drop_last
            )
        return self._in_process

    def _update_depth(self) -> None:
        tel = self._telemetry
        done = sum(1 for t in self._tasks.values() if t.data is not _PENDING)
        tel.queue_depth = done
        tel.in_flight = len(self._tasks) - done
        records = tel.workers
        for slot, w in self._workers.items():
            rec = records.get(slot)
            if rec is not None:
                rec.in_flight = w.in_flight

    def _warn_length(self) -> None:
        msg = (
            f"Length of IterableDataset {self._dataset} was reported to be {self._len_called}"
            f"(when accessing len(dataloader)), but {self._batches_yielded} samples have been "
            "fetched. "
        )
        if self._workers:
            msg += (
                "For multiprocessing data-loading, this could be caused by not properly "
                "configuring the IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset "
                "for examples."
            )
        warnings.warn(msg, stacklevel=3)

    # ------------------------------------------------------------------ shutdown

    def _shutdown_workers(self, graceful: bool = True) -> None:
        """Stops all workers: they skip queued tasks and exit; stragglers are terminated.

        ``graceful=False`` (after a timeout or a dead worker) terminates at once instead of
        waiting for a worker that may be stuck in user code.
        """
        if self._shutdown:
            return
        self._shutdown = True
        self._receiver_stop.set()  # no more reading or pinning
        for launcher in self._launchers:
            launcher.join()  # every worker is started (or failed to) before we stop them
        workers = [w for w in self._workers.values() if w.process.pid is not None and not w.remote]
        if self._done_event is not None:
            self._done_event.set()
        for w in workers:
            self._stop(w)
        deadline = time.monotonic() + (JOIN_TIMEOUT_S if graceful else 0.0)
        for w in workers:
            w.process.join(timeout=max(deadline - time.monotonic(), 0.0))
        for w in workers:
            if w.process.is_alive():
                if graceful and w.state != "starting":  # still starting: nothing to wait for
                    log.warning(
                        "dloader worker pid %s did not exit within %.0f s; terminating it",
                        w.process.pid,
                        JOIN_TIMEOUT_S,
                    )
                w.process.terminate()
                w.process.join(timeout=JOIN_TIMEOUT_S)
            w.index_queue.close()
        if self._helper is not None:
            with contextlib.suppress(OSError, ValueError):
                self._helper_tasks.put(None)  # the helper ends its actors and exits
            self._helper.join(timeout=JOIN_TIMEOUT_S)
            if self._helper.is_alive():
                self._helper.terminate()
                self._helper.join(timeout=JOIN_TIMEOUT_S)
            self._helper_tasks.close()
        if self._receiver is not None:
            self._receiver.join(timeout=JOIN_TIMEOUT_S)  # told above; it ends within a poll
        if self._result_queue is not None:
            self._result_queue.close()
        self._workers.clear()
        self._active = []
        with self._telemetry.lock:
            self._telemetry.workers.clear()

    def _leave_state(self) -> None:
        """Hands this epoch's position to the loader, so that ``loader.state_dict()`` still
        knows it after the iterator is closed or dropped (e.g. after ``break``)."""
        if self._in_order:
            self._leave(id(self), self.state(pin_order=False))

    def close(self) -> None:
        """Stops the workers now (also done when the iterator is garbage-collected)."""
        self._leave_state()
        self._shutdown_workers()

    def __del__(self) -> None:
        try:
            self._leave_state()
            self._shutdown_workers()
        except Exception:
            pass
