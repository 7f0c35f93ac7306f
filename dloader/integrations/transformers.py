"""The Hugging Face ``Trainer`` with ``dloader.DataLoader`` as its training loader.

The Trainer builds its own ``torch.utils.data.DataLoader`` and prepares it with accelerate, so
there is no loader to pass in. :class:`DLoaderTrainer` is the Trainer with one change: its
training loader is a ``dloader.DataLoader`` built from the same arguments (the Trainer's sampler,
collator, worker count, pinning, prefetching, worker seeding), sharded over processes by
:func:`dloader.integrations.accelerate.prepare_data_loader` exactly as accelerate shards the
Trainer's own loader. Live resize, batch-size changes, stats and the node sidecar then work
during ``trainer.train()``, and ``resume_from_checkpoint`` skips the trained batches without
loading them::

    from dloader.integrations.transformers import DLoaderTrainer

    trainer = DLoaderTrainer(
        model=model, args=TrainingArguments(..., dataloader_num_workers=4),
        train_dataset=train, data_collator=collator,
        dloader_options={"min_workers": 1, "max_workers": 8, "job_name": "bert-ft"},
    )
    trainer.train()
    trainer.train_loader.stats()        # the live dloader.DataLoader

Evaluation and test loaders stay the Trainer's own (their speed rarely matters and
``gather_for_metrics`` expects accelerate's).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch.utils.data
from transformers import Trainer

from dloader import DataLoader
from dloader.integrations._sharding import worker_arguments
from dloader.integrations.accelerate import prepare_data_loader

__all__ = ["DLoaderTrainer", "from_torch"]


def from_torch(loader: torch.utils.data.DataLoader[Any], **options: Any) -> DataLoader[Any]:
    """A ``dloader.DataLoader`` with ``loader``'s arguments (which must not have been iterated
    with workers yet) plus dloader's ``options`` (``min_workers``, ``max_workers``,
    ``batch_size_range``, ``sidecar``, ``job_name``, ...)."""
    kwargs = worker_arguments(loader)
    if loader.batch_size is None and loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler  # the user's own batches
    elif isinstance(loader.dataset, torch.utils.data.IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        kwargs.update(
            batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler
        )
    return DataLoader(loader.dataset, **kwargs, **options)


class DLoaderTrainer(Trainer):
    """``transformers.Trainer`` whose training loader is a ``dloader.DataLoader``.

    Args:
        dloader_options: dloader's own arguments for the training loader (``min_workers``,
            ``max_workers``, ``batch_size_range``, ``sidecar``, ``job_name``, ...). ``epochs``
            (the job's declared length, which the sidecar forwards to the cluster allocator)
            defaults to ``num_train_epochs`` rounded up where no ``max_steps`` is set.
        *args, **kwargs: the Trainer's.
    """

    def __init__(self, *args: Any, dloader_options: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.dloader_options = dict(dloader_options or {})
        if self.args.max_steps <= 0 and self.args.num_train_epochs > 0:
            self.dloader_options.setdefault("epochs", math.ceil(self.args.num_train_epochs))
        self.train_loader: Any = None  # the AcceleratedDataLoader, once built

    def get_train_dataloader(self) -> Any:
        with self._dloader_prepare():
            loader = super().get_train_dataloader()
        self.train_loader = loader
        return loader

    @contextlib.contextmanager
    def _dloader_prepare(self) -> Iterator[None]:
        """While the Trainer builds its training loader, ``accelerator.prepare`` turns it into a
        sharded ``dloader.DataLoader`` (on this Trainer's accelerator only)."""
        accelerator = self.accelerator
        original = accelerator.prepare

        def prepare(*objects: Any, **kwargs: Any) -> Any:
            converted = [
                prepare_data_loader(from_torch(obj, **self.dloader_options), accelerator)
                if isinstance(obj, torch.utils.data.DataLoader) and not isinstance(obj, DataLoader)
                else obj
                for obj in objects
            ]
            return original(*converted, **kwargs)

        accelerator.prepare = prepare
        try:
            yield
        finally:
            del accelerator.prepare  # the class's method again
