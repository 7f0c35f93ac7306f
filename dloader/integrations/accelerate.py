"""Hugging Face Accelerate: keep ``dloader.DataLoader`` (live resize, batch-size changes, stats,
the sidecar agent, exact resumable state) through ``Accelerator.prepare``.

``accelerator.prepare(loader)`` rebuilds any ``torch.utils.data.DataLoader`` as accelerate's own
``DataLoaderShard``, so dloader's features would be gone without a word. Instead::

    from dloader.integrations.accelerate import prepare

    accelerator = Accelerator()
    loader = dloader.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)

:func:`prepare` shards each ``dloader.DataLoader`` as accelerate would (whole batches per
process, ``even_batches`` padding, the shuffle generator shared from rank 0, accelerate's
``SeedableRandomSampler`` when ``use_seedable_sampler`` is on) and returns it as an
:class:`AcceleratedDataLoader`, still a ``dloader.DataLoader``; the other objects go through
``accelerator.prepare`` unchanged. Then, as accelerate promises:

* batches are moved to ``accelerator.device``; ``accelerator.accumulate`` and
  ``gather_for_metrics`` see the end of the loader (``GradientState``);
* ``accelerator.save_state`` / ``load_state`` save and restore the loader's exact position (the
  loader is registered as a stateful data loader);
* ``accelerator.skip_first_batches(loader, n)`` skips without loading, and returns the same
  dloader loader.

The same samples reach each process as with accelerate's own loader at the same seed (tested on
2 CPU processes). An ``IterableDataset`` is sharded with accelerate's ``IterableDatasetShard``,
every process loading its own share (accelerate's ``dispatch_batches=False``; accelerate's default
for iterable datasets is to load on rank 0 and send slices to the others).

Not supported (a clear error): ``split_batches=True``, ``dispatch_batches=True``,
``even_batches=False``, a user-supplied ``batch_sampler``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate import accelerator as _accelerator_module
from accelerate.data_loader import (
    DataLoaderStateMixin,
    IterableDatasetShard,
    SeedableRandomSampler,
)
from accelerate.data_loader import skip_first_batches as _accelerate_skip_first_batches
from accelerate.state import GradientState
from accelerate.utils import send_to_device
from torch.utils.data import IterableDataset, RandomSampler

from dloader import DataLoader
from dloader.integrations._sharding import (
    BatchShardSampler,
    broadcast_generator,
    worker_arguments,
)

__all__ = ["AcceleratedDataLoader", "prepare", "prepare_data_loader", "skip_first_batches"]

# dloader's own constructor arguments, carried over to the prepared loader
_DLOADER_ARGS = ("min_workers", "max_workers", "batch_size_range", "epochs")


class AcceleratedDataLoader(DataLoader[Any], DataLoaderStateMixin):
    """A ``dloader.DataLoader`` sharded for one accelerate process; made by :func:`prepare`.

    Besides dloader's API it has what accelerate's ``DataLoaderShard`` offers the training loop:
    ``device`` placement, ``set_epoch``, ``end_of_dataloader``/``remainder`` for
    ``GradientState``, ``total_batch_size``, ``total_dataset_length``.
    """

    use_stateful_dataloader = True  # accelerator.save_state/load_state keep its state_dict()
    _is_accelerate_prepared = True  # accelerator.prepare returns it as it is

    def __init__(
        self,
        *args: Any,
        device: torch.device | None = None,
        non_blocking: bool = False,
        num_processes: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        self.num_processes = num_processes
        self.gradient_state = GradientState()
        self.iteration = 0
        self._drop_last = self.drop_last
        self._non_blocking = non_blocking

    @property
    def total_batch_size(self) -> int:
        """The global batch size (every process's batch)."""
        return (self.batch_size or 1) * self.num_processes

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """As accelerate's loaders: the epoch of the next iteration (forwarded to the sampler
        and to a dataset with ``set_epoch``)."""
        if self.iteration != epoch:
            self.iteration = epoch
        obj: Any
        for obj in (self.sampler, self.dataset):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)
                break

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.set_epoch(self.iteration)
        if isinstance(self.sampler, BatchShardSampler):
            self.sampler.start = 0  # a new epoch, unless a loaded state positions it
            if self.batch_size is not None:
                self.sampler.begin_batch(self.batch_size)
        it = super().__iter__()
        self.begin()
        try:
            length = _len_or_none(self)  # batches of this epoch (its segment, after a restore)
            served = it.batches_yielded
            for batch in it:
                served += 1
                if length is not None and served >= length:
                    self.end_of_dataloader = True  # before the last batch, as accelerate
                if self.device is not None:
                    batch = send_to_device(batch, self.device, non_blocking=self._non_blocking)
                yield batch
            self.end_of_dataloader = True
            self.iteration += 1
        finally:
            self.end()


def _len_or_none(loader: DataLoader[Any]) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def prepare_data_loader(
    loader: DataLoader[Any], accelerator: Accelerator, *, device_placement: bool | None = None
) -> AcceleratedDataLoader:
    """Shards ``loader`` for this accelerate process; see the module docstring.

    Collective under ``torch.distributed`` (the shuffle generator is shared from rank 0): every
    process calls it for the same loaders in the same order, as with ``accelerator.prepare``.

    Raises:
        TypeError: ``loader`` is not a ``dloader.DataLoader``.
        ValueError: an accelerate option or loader argument this adapter does not support.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"loader={loader!r} is a {type(loader).__name__}, expected a dloader.DataLoader "
            "(pass torch loaders to accelerator.prepare)"
        )
    if isinstance(loader, AcceleratedDataLoader):
        return loader
    unsupported = [
        name
        for name, on in (
            ("split_batches=True", accelerator.split_batches),
            ("dispatch_batches=True", bool(accelerator.dispatch_batches)),
            ("even_batches=False", not accelerator.even_batches),
        )
        if on
    ]
    if unsupported:
        raise ValueError(
            f"dloader's accelerate adapter does not support the Accelerator's {unsupported}; "
            "use accelerate's defaults (whole batches per process, even batches)"
        )
    if loader.custom_batch_sampler:
        raise ValueError(
            f"a dloader.DataLoader with a user batch_sampler={loader.batch_sampler!r} cannot be "
            "sharded by batch size; pass batch_size= and sampler= instead"
        )
    world, rank = accelerator.num_processes, accelerator.process_index
    if device_placement is None:
        device_placement = accelerator.device_placement
    kwargs = _loader_kwargs(loader)
    if isinstance(loader.dataset, IterableDataset):
        if world > 1:
            kwargs["dataset"] = IterableDatasetShard(
                loader.dataset,
                batch_size=loader.batch_size,
                drop_last=loader.drop_last,
                num_processes=world,
                process_index=rank,
            )
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        order: Any = loader.sampler
        if accelerator.use_seedable_sampler and type(order) is RandomSampler:
            order = SeedableRandomSampler(
                data_source=order.data_source,
                replacement=order.replacement,
                num_samples=order._num_samples,
                generator=order.generator or torch.Generator(),
                data_seed=accelerator.dataloader_config.data_seed,
            )
        elif world > 1 and hasattr(order, "generator"):
            if order.generator is None:  # as accelerate: a generator seeded from torch's RNG
                seed = int(torch.empty((), dtype=torch.int64).random_().item())
                order.generator = torch.Generator().manual_seed(seed)
            broadcast_generator(order)
        if loader.batch_size is None:
            raise ValueError("a dloader.DataLoader with batch_size=None cannot be sharded")
        kwargs.update(
            batch_size=loader.batch_size,
            drop_last=loader.drop_last,
            sampler=BatchShardSampler(order, world, rank, loader.batch_size, loader.drop_last),
        )
    prepared = AcceleratedDataLoader(
        device=accelerator.device if device_placement else None,
        non_blocking=accelerator.non_blocking,
        num_processes=world,
        **kwargs,
    )
    _install_skip_dispatch()
    if loader.sidecar_agent is not None:
        loader.sidecar_agent.stop(timeout=0)  # its job is the prepared loader's now
    return prepared


def _loader_kwargs(loader: DataLoader[Any]) -> dict[str, Any]:
    """The arguments to rebuild ``loader`` (batching and sampling are set by the caller)."""
    kwargs: dict[str, Any] = {
        "dataset": loader.dataset,
        **worker_arguments(loader),
        **{name: getattr(loader, name) for name in _DLOADER_ARGS},
    }
    kwargs["stats_window_s"] = loader.stats_window_s
    agent = loader.sidecar_agent
    if agent is not None:
        kwargs.update(sidecar=agent.target, job_name=agent.name)
    return kwargs


def prepare(accelerator: Accelerator, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects)``, with each ``dloader.DataLoader`` sharded by
    :func:`prepare_data_loader` (and so kept a ``dloader.DataLoader``). Returns what
    ``accelerator.prepare`` returns (one object, or a tuple)."""
    placement = kwargs.get("device_placement")
    shards = [
        prepare_data_loader(
            obj,
            accelerator,
            device_placement=placement[i] if placement is not None else None,
        )
        if isinstance(obj, DataLoader)
        else obj
        for i, obj in enumerate(objects)
    ]
    return accelerator.prepare(*shards, **kwargs)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """``accelerate.skip_first_batches`` that keeps a ``dloader.DataLoader``: the same loader,
    whose next iteration starts ``num_batches`` in without loading them. Other loaders go to
    accelerate's own function."""
    if isinstance(dataloader, DataLoader):
        dataloader.skip_batches(num_batches)
        return dataloader
    return _accelerate_skip_first_batches(dataloader, num_batches=num_batches)


def _install_skip_dispatch() -> None:
    """Makes ``Accelerator.skip_first_batches`` (and the Hugging Face Trainer's resume, which
    calls accelerate's function) keep dloader loaders; other loaders are unaffected."""
    _accelerator_module.skip_first_batches = skip_first_batches
    with contextlib.suppress(ImportError):
        import transformers.trainer as _trainer_module

        _trainer_module.skip_first_batches = skip_first_batches
