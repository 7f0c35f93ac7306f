"""``dloader.DataLoader``: torch's DataLoader, plus live resize, batch-size changes, telemetry and
resumable state."""

from __future__ import annotations

import logging
import os
import resource
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

import torch.utils.data
from torch.utils.data import BatchSampler, Dataset, IterableDataset, Sampler

from dloader._agent.agent import SidecarAgent
from dloader._autotune.controller import AutoTuner, start_count
from dloader._engine import ranks
from dloader._engine.control import ControlLimits
from dloader._engine.iterator import EpochPlan, IteratorConfig, LoaderIterator
from dloader._engine.position import STATE_VERSION, check_state
from dloader._engine.remote import RayWorkers, check_placement, check_remote
from dloader._engine.telemetry import LoaderStats, Telemetry
from dloader._engine.timing import STATS_WINDOW_S
from dloader._shared import env
from dloader._shared.node_messages import fit_remote
from dloader.errors import StateError

__all__ = ["DataLoader"]

_T_co = TypeVar("_T_co", covariant=True)

log = logging.getLogger("dloader")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int")
    if value < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    return value


#: File descriptors one worker process holds open in the trainer (measured: 4).
FDS_PER_WORKER = 4
_FDS_SPARE = 64  # for everything else the trainer opens


def worker_ceiling() -> int:
    """The most workers :meth:`DataLoader.resize` accepts when no ``max_workers`` was given:
    as many as the soft open-file limit leaves descriptors for, at most 1,024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(1, min(1024, (soft - _FDS_SPARE) // FDS_PER_WORKER))


def auto_ceiling() -> int:
    """The most workers ``num_workers="auto"`` tries when no ``max_workers`` was given: 8 per
    usable CPU, at least 32 (I/O-bound pipelines want many more workers than CPUs), within
    :func:`worker_ceiling`."""
    return min(worker_ceiling(), max(32, 8 * len(os.sched_getaffinity(0))))


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose worker count and batch size can change
    while it runs, which measures how long the trainer waits for data, and whose position in an
    epoch can be saved and restored.

    The positional and keyword arguments up to ``in_order`` are torch's, with torch's defaults
    and meaning. With none of the options below used, it yields the same batches in the same
    order as torch's DataLoader for the same seed.

    Args:
        num_workers: torch's, or ``"auto"``: the loader finds the worker count that maximises
            the training loop's throughput by measuring it, holds it, and searches again when
            the step time or the per-sample cost changes; within ``[max(min_workers, 1),
            max_workers]``, the CPUs and memory the process may use (affinity, cgroup quota
            and memory limit, each worker's measured private memory). ``loader.stats().tuner``
            says what it chose and why. With a sidecar configured, the sidecar decides instead.
            See ``docs/autotune.md``.
        min_workers: lowest worker count :meth:`resize` accepts (default 0).
        max_workers: highest worker count :meth:`resize` accepts (default: as many as the
            process's open-file limit allows, :func:`worker_ceiling`).
        batch_size_range: ``(low, high)`` inclusive bounds for :meth:`set_batch_size`
            (default: any positive size).
        stats_window_s: length of the "recent" window of :meth:`stats`, seconds.
        sidecar: the node sidecar to cooperate with (``unix:///path.sock`` or ``host:port``;
            default: ``$DLOADER_SIDECAR``, else none). A background agent registers the job as
            the loader is created, reports every second and applies the sidecar's directives.
            If the sidecar is absent or dies, training goes on unchanged.
        job_name: the job's name at the sidecar (default: ``$DLOADER_JOB_NAME`` or the
            script name and PID).
        epochs: the epochs the job will run over this loader, its declared length (optional):
            ``stats().done`` is then the share done, which the sidecar forwards to the cluster
            allocator; ``goodput-dp`` gives GPUs more readily to jobs nearer done
            (``docs/allocator.md``).
        remote: loader workers on other machines' CPUs, as Ray actors
            (:class:`dloader.RayWorkers`; needs ``dloader-elastic[ray]``), beside the local
            ``num_workers``. A map-style dataset only, picklable, its files reachable from the
            remote nodes (checked here and by each remote worker at its start). They keep the
            order, exactly-once and the position as local workers do; a remote worker that
            dies has its batches given to the others. :meth:`resize_remote` changes their
            count live. See ``docs/remote.md``.

    Live changes:
        * :meth:`resize` applies mid-epoch for map-style datasets; workers added report ready
          before they receive tasks, so the trainer never waits on a starting process; retired
          workers finish the batches they hold. For an ``IterableDataset`` each worker holds its
          own shard of the stream, so a resize applies from the next epoch (with a warning).
        * :meth:`set_batch_size` applies to the next batch not yet dispatched. Up to
          ``prefetch_factor * num_workers`` batches already handed to workers keep the old size.

    Only the most recently created iterator of a loader follows live changes.
    """

    def __init__(
        self,
        dataset: Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int | Literal["auto"] = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        min_workers: int = 0,
        max_workers: int | None = None,
        batch_size_range: tuple[int, int] | None = None,
        stats_window_s: float = STATS_WINDOW_S,
        sidecar: str | None = None,
        job_name: str | None = None,
        remote: RayWorkers | None = None,
        epochs: int | None = None,
    ) -> None:
        _check_int("min_workers", min_workers, 0)
        if epochs is not None:
            _check_int("epochs", epochs, 1)
        if remote is not None:
            if not isinstance(remote, RayWorkers):
                raise TypeError(f"remote={remote!r}: expected a dloader.RayWorkers")
            check_remote(dataset, collate_fn, worker_init_fn)
        if max_workers is not None:
            _check_int("max_workers", max_workers, 1)
            if max_workers < min_workers:
                raise ValueError(f"{max_workers=} must be >= {min_workers=}")
        auto = isinstance(num_workers, str)
        if isinstance(num_workers, str):
            if num_workers != "auto":
                raise ValueError(f"num_workers={num_workers!r} must be an int >= 0 or 'auto'")
            num_workers = start_count(max(min_workers, 1), max_workers or auto_ceiling())
        # By keyword: Lightning re-instantiates loaders from the arguments their __init__ got
        # and needs each to reach torch's under its own name.
        with warnings.catch_warnings():
            if auto:  # torch's warning about more workers than CPUs: the tuner measures that
                warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
            super().__init__(
                dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=num_workers,
                collate_fn=collate_fn,
                pin_memory=pin_memory,
                drop_last=drop_last,
                timeout=timeout,
                worker_init_fn=worker_init_fn,
                multiprocessing_context=multiprocessing_context,
                generator=generator,
                prefetch_factor=prefetch_factor,
                persistent_workers=persistent_workers,
                pin_memory_device=pin_memory_device,
                in_order=in_order,
            )
        if (
            not min_workers
            <= num_workers
            <= (max_workers if max_workers is not None else num_workers)
        ):
            raise ValueError(
                f"num_workers={num_workers} is outside [min_workers={min_workers}, "
                f"max_workers={max_workers}]"
            )
        if batch_size_range is not None:
            batch_size_range = self._check_range(batch_size_range, batch_size)
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.batch_size_range = batch_size_range
        self.remote = remote
        self.epochs = epochs
        self.remote_placement: dict[str, int] = {"": remote.workers} if remote is not None else {}
        """Remote workers the loader is set to, by where they run (:meth:`resize_remote`)."""
        self._staged_batch_size: int | None = None
        self._user_batch_sampler = batch_sampler is not None
        self._is_iterable = isinstance(dataset, IterableDataset)
        self._telemetry = Telemetry(stats_window_s)
        self._epoch = 0
        self._live: weakref.ref[LoaderIterator] | None = None
        self._live_id: int | None = None  # id() of the newest iterator (see _leave_state)
        self._last_state: dict[str, Any] | None = None  # position left by a closed iterator
        self._pending_state: dict[str, Any] | None = None
        self._pending_skip = 0  # batches the next epoch skips (skip_batches)
        self._control = threading.Lock()
        target = sidecar if sidecar is not None else env.sidecar_target()
        self.sidecar_agent: SidecarAgent | None = None
        if target is not None:
            self.sidecar_agent = SidecarAgent(_Controls(self), target, name=job_name)
        self.autotuner: AutoTuner | None = None
        """The worker-count tuner of ``num_workers="auto"`` (None: not tuning)."""
        if auto:
            self._start_auto(max(min_workers, 1))
        if self.sidecar_agent is not None:
            # registered now: its helper process starts while the job sets up, not after its
            # first batch (a second on a busy node, which the job's first placement waited for)
            self.sidecar_agent.start()

    def _start_auto(self, minimum: int) -> None:
        if self.sidecar_agent is not None:
            log.info(
                "dloader: num_workers='auto' with a sidecar (%s): the sidecar decides the worker "
                "count; starting from %d",
                self.sidecar_agent.target,
                self.num_workers,
            )
        elif self._is_iterable:
            warnings.warn(
                "num_workers='auto' needs a map-style dataset: an IterableDataset's workers "
                "each hold a shard of the stream, so their count cannot change mid-epoch. "
                f"Using {self.num_workers} workers; pass an int to choose",
                UserWarning,
                stacklevel=3,
            )
        else:
            self.autotuner = self._new_tuner(minimum)

    def _new_tuner(self, minimum: int) -> AutoTuner:
        return AutoTuner(
            _Controls(self),
            start=self.num_workers,
            minimum=minimum,
            maximum=self.worker_bound(),
            peers=env.auto_peers(),
        )

    def _tune_within(self, up_to: int | None) -> bool:
        """The sidecar's guided policy: this loader's own tuner chooses its count, up to
        ``up_to`` workers (a tuner is started if it had none). False where it cannot tune:
        an iterable dataset, or a tuner the user's ``resize()`` stopped (the count is theirs).
        ``up_to`` None: the sidecar sets the count again; a tuner it started stops."""
        if up_to is None:
            with self._control:
                if self.autotuner is not None and self.sidecar_agent is not None:
                    self.autotuner.stop("the sidecar sets the count")
                    self.autotuner = None
            return False
        if self._is_iterable:
            return False
        with self._control:
            tuner = self.autotuner
            if tuner is None:
                log.info("dloader: the sidecar's guided policy: tuning the worker count itself")
                tuner = self.autotuner = self._new_tuner(max(self.min_workers, 1))
            elif tuner.stopped_because:
                return False
            tuner.limit(up_to)
            tuner.start()  # directives come once iteration began (the agent starts there)
            return True

    def worker_bound(self) -> int:
        """The most workers this loader may have: ``max_workers``, else (tuning)
        :func:`auto_ceiling` or (not tuning) :func:`worker_ceiling`."""
        if self.max_workers is not None:
            return self.max_workers
        return auto_ceiling() if self.autotuner is not None else worker_ceiling()

    @staticmethod
    def _check_range(batch_size_range: Any, batch_size: int | None) -> tuple[int, int]:
        try:
            low, high = batch_size_range
        except (TypeError, ValueError):
            raise ValueError(
                f"batch_size_range={batch_size_range!r} must be a (low, high) pair"
            ) from None
        _check_int("batch_size_range[0]", low, 1)
        _check_int("batch_size_range[1]", high, 1)
        if low > high:
            raise ValueError(f"batch_size_range={batch_size_range!r} must have low <= high")
        if batch_size is not None and not low <= batch_size <= high:
            raise ValueError(f"batch_size={batch_size} is outside {batch_size_range=}")
        return (low, high)

    # ------------------------------------------------------------------ iteration

    @property
    def custom_batch_sampler(self) -> bool:
        """Whether the batches come from a user-supplied ``batch_sampler`` (which
        :meth:`set_batch_size` cannot re-cut)."""
        return self._user_batch_sampler

    @property
    def stats_window_s(self) -> float:
        """The length of :meth:`stats`' recent window, seconds (the constructor's
        ``stats_window_s``)."""
        return self._telemetry.window_seconds

    @property
    def staged_batch_size(self) -> int | None:
        """A batch size a controller directed to this process while it is one rank of several
        (None: none). The ranks apply it together, at one batch
        (:func:`dloader.integrations.torchrun.sync_batch_size`), not one by one; applying any
        batch size clears it."""
        return self._staged_batch_size

    def _iterator_config(self) -> IteratorConfig:
        ref = weakref.ref(self)

        def leave_state(iterator_id: int, state: dict[str, Any]) -> None:
            loader = ref()
            if loader is not None and loader._live_id == iterator_id:
                loader._last_state = state

        return IteratorConfig(
            dataset=self.dataset,
            iterable=self._is_iterable,
            auto_collation=self._auto_collation,
            collate_fn=self.collate_fn,
            timeout=self.timeout,
            in_order=self.in_order,
            worker_init_fn=self.worker_init_fn,
            persistent_workers=self.persistent_workers,
            multiprocessing_context=self.multiprocessing_context,
            prefetch_factor=self.prefetch_factor,
            pin_memory=self.pin_memory,
            pin_memory_device=self.pin_memory_device,
            generator=self.generator,
            telemetry=self._telemetry,
            leave_state=leave_state,
            remote=self.remote,
        )

    def _epoch_plan(self, restore: dict[str, Any] | None) -> EpochPlan:
        """The next epoch's inputs; takes the pending ``skip_batches``."""
        skip, self._pending_skip = self._pending_skip, 0
        batched = self._user_batch_sampler
        return EpochPlan(
            epoch=self._epoch,
            num_workers=self.num_workers,
            source=None if self._is_iterable else (self.batch_sampler if batched else self.sampler),
            batched=batched,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            restore=restore,
            skip_batches=skip,
            len_called=self._IterableDataset_len_called,
            remote_workers=self.remote_placement,
        )

    def _get_iterator(self) -> LoaderIterator:  # type: ignore[override]
        restore, self._pending_state = self._pending_state, None
        if restore is not None:
            self._epoch = int(restore.get("epoch", self._epoch))
        else:
            self._epoch += 1
        if self.num_workers > 0 and self.autotuner is None:
            self.check_worker_number_rationality()  # torch warns here too
        it = LoaderIterator(self._iterator_config(), self._epoch_plan(restore))
        self._live, self._live_id, self._last_state = weakref.ref(it), id(it), None
        return it

    def __iter__(self) -> LoaderIterator:  # type: ignore[override]
        if self.sidecar_agent is not None:
            self.sidecar_agent.start()  # in the background: training never waits for it
        if self.autotuner is not None:
            self.autotuner.start()
        old = self._iterator
        if self.persistent_workers and isinstance(old, LoaderIterator):
            if self._is_iterable and old.live_workers != self.num_workers:
                # Each worker owns a shard of the stream: a new count needs a fresh pool.
                old.close()
            else:
                restore, self._pending_state = self._pending_state, None
                self._epoch = int(restore.get("epoch", self._epoch)) if restore else self._epoch + 1
                self._telemetry.begin_epoch()
                old.reset(self._epoch_plan(restore))
                self._live, self._live_id, self._last_state = weakref.ref(old), id(old), None
                return old
        self._telemetry.begin_epoch()
        it = self._get_iterator()
        if self.persistent_workers and self.num_workers > 0:
            self._iterator = it  # type: ignore[assignment]  # torch types it as its own iterator
        return it

    def _live_iterator(self) -> LoaderIterator | None:
        it = self._live() if self._live is not None else None
        return None if it is None or (it.exhausted and not self.persistent_workers) else it

    # ------------------------------------------------------------------ the knobs

    def resize(self, num_workers: int) -> None:
        """Sets the number of worker processes, now (map-style) or from the next epoch (iterable).

        Safe to call from any thread at any time. The iterating thread applies it before its next
        batch, or within ``DLOADER_POLL_INTERVAL_S`` while it waits. ``resize(0)`` switches to
        in-process loading once the workers' outstanding batches are delivered. On a loader
        with ``num_workers="auto"`` it stops the tuner: the count is then yours.

        Raises:
            TypeError: ``num_workers`` is not an int.
            ValueError: it is negative or outside ``[min_workers, max_workers]``.
        """
        self._check_workers(num_workers)
        with self._control:
            if self.autotuner is not None:
                self.autotuner.stop(f"resize({num_workers}) called")
            self._set_workers(num_workers)

    def _check_workers(self, num_workers: int) -> None:
        _check_int("num_workers", num_workers, 0)
        if num_workers < self.min_workers or (
            self.max_workers is not None and num_workers > self.max_workers
        ):
            raise ValueError(
                f"num_workers={num_workers} is outside [min_workers={self.min_workers}, "
                f"max_workers={self.max_workers}]"
            )
        ceiling = worker_ceiling()
        if self.max_workers is None and num_workers > max(ceiling, self.num_workers):
            raise ValueError(
                f"num_workers={num_workers} is above {ceiling}, the most workers this process "
                f"can open files for (each takes {FDS_PER_WORKER} descriptors; RLIMIT_NOFILE "
                "allows the rest): pass max_workers= to the DataLoader to set the bound yourself"
            )

    def _set_workers(self, num_workers: int) -> None:
        # with self._control held
        self.num_workers = num_workers
        if num_workers > 0 and self.prefetch_factor is None:
            self.prefetch_factor = 2
        it = self._live_iterator()
        if it is None:
            return
        if self._is_iterable:
            if it.live_workers != num_workers:
                warnings.warn(
                    f"resize(num_workers={num_workers}) on an IterableDataset applies from "
                    "the next epoch: each worker iterates its own shard of the dataset, so "
                    "the worker count cannot change mid-epoch",
                    UserWarning,
                    stacklevel=3,
                )
            return
        it.request_resize(num_workers)

    @property
    def remote_workers(self) -> int:
        """Remote workers the loader is set to, wherever they run (:meth:`resize_remote`)."""
        return sum(self.remote_placement.values())

    def resize_remote(self, workers: int | Mapping[str, int]) -> None:
        """Sets the remote workers (``remote=RayWorkers(...)``), as :meth:`resize` sets the
        local ones: safe from any thread, applied between batches. New remote workers take
        tasks once their actor is up and has loaded its probe sample; retired ones finish the
        batches they hold.

        ``workers``: a count, to run wherever ``RayWorkers.resources`` allow; or counts by
        where they run, ``{"": 2, "gpu-node-7": 3}``: ``""`` as a count does, any other key a
        node that lends the job its spare cores (its Ray node advertises
        ``dloader_node:<key>``, one unit a core: docs/remote.md). Places left out get none.

        Raises:
            ValueError: the loader has no remote workers configured, a count is negative, a
                place is not a node name, or the total is above ``RayWorkers.max_workers``.
        """
        if self.remote is None:
            raise ValueError(
                "resize_remote(): this loader has no remote workers; construct it with "
                "remote=dloader.RayWorkers(...)"
            )
        placement = check_placement(workers, self.remote.max_workers, "resize_remote(workers)")
        with self._control:
            self.remote_placement = placement
            it = self._live_iterator()
            if it is not None:
                it.request_remote_resize(placement)

    def set_batch_size(self, batch_size: int, *, at_batch: int | None = None) -> None:
        """Changes the batch size from the next batch not yet dispatched to a worker.

        The sample stream stays continuous: no sample is skipped or repeated. Batches already
        dispatched (at most ``prefetch_factor * num_workers``) keep the old size. With
        ``drop_last=True`` only a final batch shorter than the size then current is dropped.

        ``at_batch``: switch exactly at this batch of the current iteration (counted from its
        start; see :attr:`batches_cut`), which must not be dispatched yet. Data-parallel ranks
        pass the same index so that they switch in lockstep (see
        ``dloader.integrations.torchrun.sync_batch_size``).

        Raises:
            ValueError: the loader uses a user-supplied ``batch_sampler`` or ``batch_size=None``,
                or ``batch_size`` is outside ``batch_size_range``.
            TypeError: ``batch_size`` is not an int.
        """
        if self._user_batch_sampler:
            raise ValueError(
                "set_batch_size() cannot change the batches of a user-supplied "
                f"batch_sampler={self.batch_sampler!r}; pass batch_size= and sampler= instead"
            )
        if self.batch_size is None:
            raise ValueError(
                "set_batch_size() needs auto-batching, but this loader has batch_size=None"
            )
        _check_int("batch_size", batch_size, 1)
        if self.batch_size_range is not None:
            low, high = self.batch_size_range
            if not low <= batch_size <= high:
                raise ValueError(
                    f"batch_size={batch_size} is outside batch_size_range={self.batch_size_range}"
                )
        with self._control:
            # torch forbids assigning these after __init__; the batch sampler is rebuilt so that
            # len(loader) follows the new size.
            object.__setattr__(self, "batch_size", batch_size)
            if not self._is_iterable:
                object.__setattr__(
                    self, "batch_sampler", BatchSampler(self.sampler, batch_size, self.drop_last)
                )
            it = self._live_iterator()
            if it is not None:
                it.cut_batches_at(batch_size, at_batch)
            self._staged_batch_size = None

    def _stage_batch_size(self, batch_size: int) -> None:
        """Keeps a directed batch size for the ranks to apply together (checked now)."""
        low, high = self.batch_size_range or (1, batch_size)
        _check_int("batch_size", batch_size, 1)
        if not low <= batch_size <= high:
            raise ValueError(
                f"batch_size={batch_size} is outside batch_size_range={self.batch_size_range}"
            )
        self._staged_batch_size = batch_size

    def skip_batches(self, num_batches: int) -> None:
        """Makes the next ``iter(loader)`` start ``num_batches`` into its epoch, as if they had
        been delivered: they are not loaded (a map-style dataset's indices are skipped; an
        iterable dataset's batches are read and dropped, as torch has no other way). For
        resuming a run that counts steps (``accelerate.skip_first_batches``); a saved
        :meth:`state_dict` resumes more exactly.

        Raises:
            TypeError, ValueError: ``num_batches`` is not an int >= 0.
            dloader.errors.StateError: a state loaded by :meth:`load_state_dict` is pending.
        """
        _check_int("num_batches", num_batches, 0)
        if self._pending_state is not None and num_batches:
            raise StateError(
                "skip_batches() with a state from load_state_dict() pending: the state "
                "already positions the next epoch"
            )
        self._pending_skip = num_batches

    # ------------------------------------------------------------------ telemetry and state

    @property
    def batches_cut(self) -> int:
        """Batches of the current iteration cut from the sampler so far (yielded, or dispatched
        to a worker); 0 without a live iterator."""
        it = self._live_iterator()
        return it.batches_cut if it is not None else 0

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read by Hugging Face Accelerate's ``prepare_data_loader`` just before it replaces a
        loader by its own ``DataLoaderShard``. A plain ``dloader.DataLoader`` is not prepared;
        the replacement would drop dloader silently, so this says so, loudly, once per loader.
        (``dloader.integrations.accelerate.prepare`` shards it and keeps it a dloader one.)"""
        if self.__dict__.get("_accelerate_prepared"):
            return True
        if not self.__dict__.get("_accelerate_warned"):
            self.__dict__["_accelerate_warned"] = True
            warnings.warn(
                "accelerator.prepare() replaces this dloader.DataLoader by accelerate's "
                "DataLoaderShard: resize(), set_batch_size(), stats() and the node sidecar will "
                "not reach the loader that trains. Use "
                "dloader.integrations.accelerate.prepare(accelerator, model, optimizer, loader) "
                "instead: it shards the loader as accelerate would and keeps it a "
                "dloader.DataLoader.",
                UserWarning,
                stacklevel=3,
            )
        return False

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_accelerate_prepared"] = bool(value)

    def stats(self) -> LoaderStats:
        """A snapshot of this loader's telemetry; cheap enough to call every step."""
        return self._telemetry.snapshot(
            num_workers=self.num_workers,
            batch_size=self.batch_size,
            epoch=self._epoch,
            tuner=self.autotuner.summary if self.autotuner is not None else "",
            remote_workers=self.remote_workers,
            done=self._done(),
        )

    def _done(self) -> float | None:
        """The share of the declared ``epochs`` done: the epochs before this one, and this
        one's batches over its length (an iterable dataset's epoch counts when it ends). Read
        from any thread: plain reads of the iterator's counters."""
        if self.epochs is None:
            return None
        if self._epoch < 1:
            return 0.0
        it = self._live() if self._live is not None else None
        state = self._last_state
        if it is not None:
            exhausted, batches = it.exhausted, it.batches_yielded
        elif state is not None:
            exhausted, batches = bool(state.get("exhausted")), int(state["batches_yielded"])
        else:  # its iterator ran to the end and is gone
            exhausted, batches = True, 0
        within = 1.0
        if not exhausted:  # len() of an iterable dataset is not asked for: torch records it
            within = 0.0 if self._is_iterable else min(batches / max(len(self), 1), 1.0)
        return min((self._epoch - 1 + within) / self.epochs, 1.0)

    def state_dict(self) -> dict[str, Any]:
        """The position in the current epoch, as a few integers and the sampler's seed.

        Restoring it with :meth:`load_state_dict` into a new loader over the same dataset
        continues with exactly the remaining samples of the epoch, whatever that loader's
        ``num_workers`` or batch size. The position survives the iterator: after ``break`` (or
        ``close()``), it is the point where iteration stopped. For an ``IterableDataset`` the
        position is replayed
        (batches re-read and dropped), which needs the same ``num_workers`` and batch size.
        """
        it = self._live_iterator()
        if it is not None:
            return it.state()
        if self._last_state is not None:
            return dict(self._last_state)
        return {
            "version": STATE_VERSION,
            "dataset_kind": "iterable" if self._is_iterable else "map",
            "epoch": self._epoch,
            "samples_yielded": 0,
            "batches_yielded": 0,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "sampler": None,
            "exhausted": True,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Makes the next ``iter(loader)`` resume from ``state_dict`` (see :meth:`state_dict`).

        Raises:
            dloader.errors.StateError: the state is malformed, of another version, or was saved
                for a dataset of another kind or length.
            ValueError: an iterable dataset's state is restored with another worker count or
                batch size.
        """
        dataset_len = None if self._is_iterable else len(self.dataset)  # type: ignore[arg-type]
        state = check_state(state_dict, iterable=self._is_iterable, dataset_len=dataset_len)
        if self._is_iterable and not state["exhausted"]:
            for key, value in (("num_workers", self.num_workers), ("batch_size", self.batch_size)):
                if state.get(key) != value:
                    raise ValueError(
                        f"an IterableDataset is resumed by replay, which needs the same {key}: "
                        f"saved {key}={state.get(key)!r}, this loader has {key}={value!r}"
                    )
        self._pending_state = dict(state)
        self._last_state = dict(state)  # state_dict() reports it until iteration resumes


class _Controls:
    """A loader's :class:`~dloader._engine.control.LoaderControls`: what its controllers (the
    ``num_workers="auto"`` tuner, the sidecar agent) may do to it. Holds it weakly."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._ref = weakref.ref(loader)

    def stats(self) -> LoaderStats | None:
        loader = self._ref()
        return loader.stats() if loader is not None else None

    def limits(self) -> ControlLimits | None:
        loader = self._ref()
        if loader is None:
            return None
        return ControlLimits(
            min_workers=loader.min_workers,
            max_workers=loader.max_workers or 0,
            worker_bound=loader.worker_bound(),
            batch_size_range=loader.batch_size_range,
            prefetch_factor=loader.prefetch_factor or 2,
            max_remote_workers=loader.remote.max_workers if loader.remote is not None else 0,
        )

    def resize(self, num_workers: int, *, unless: threading.Event | None = None) -> bool:
        loader = self._ref()
        if loader is None:
            return False
        loader._check_workers(num_workers)
        with loader._control:  # not if the user's resize() stopped the controller meanwhile
            if unless is not None and unless.is_set():
                return False
            if num_workers != loader.num_workers:
                loader._set_workers(num_workers)
        return True

    def tune(self, up_to: int | None) -> bool:
        loader = self._ref()
        return loader is not None and loader._tune_within(up_to)

    def resize_remote(self, workers: Mapping[str, int]) -> bool:
        loader = self._ref()
        if loader is None or loader.remote is None:
            return False
        lent = {place: n for place, n in workers.items() if place}
        pool, on = fit_remote(workers.get("", 0), lent, loader.remote.max_workers)
        placement = {"": pool, **dict(on)}
        if placement != loader.remote_placement:
            loader.resize_remote(placement)
        return True

    def set_batch_size(self, batch_size: int) -> bool:
        loader = self._ref()
        if loader is None or loader.batch_size_range is None or batch_size == loader.batch_size:
            return False
        if ranks.rank_and_world()[1] > 1:  # ranks switch together, at a step they agree on
            loader._stage_batch_size(batch_size)
        else:
            loader.set_batch_size(batch_size)
        return True
