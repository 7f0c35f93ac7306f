"""Lightning: a callback that declares the run's length to its ``dloader.DataLoader``.

Lightning needs no adapter (``train_dataloader()`` returns a ``dloader.DataLoader``, which
Lightning re-instantiates under DDP with its options), but a loader does not know how many
epochs the ``Trainer`` will run. :class:`DeclareEpochs` tells it, so that its share done
(``loader.stats().done``) reaches the cluster allocator, which gives GPUs more readily to jobs
nearer done (docs/allocator.md)::

    trainer = L.Trainer(max_epochs=10, callbacks=[dloader.integrations.lightning.DeclareEpochs()])

Requires ``lightning`` (``pip install 'dloader-elastic[lightning]'``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning_utilities.core.apply_func import apply_to_collection

import dloader

__all__ = ["DeclareEpochs"]


class DeclareEpochs(Callback):
    """At the start of training, sets the ``epochs`` of every ``dloader.DataLoader`` the
    ``Trainer`` trains on that declares none: ``epochs`` if given, else the trainer's
    ``max_epochs``. A run bounded by steps (``max_steps``) or unbounded (``max_epochs=-1``)
    declares nothing unless ``epochs`` is given: its length in epochs is not known. Lightning
    defaults ``max_epochs`` to 1000 when no limit is set; set it to what the run will train.

    Args:
        epochs: the epochs to declare (None: the trainer's ``max_epochs``).
    """

    def __init__(self, epochs: int | None = None) -> None:
        super().__init__()
        if epochs is not None and (
            isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1
        ):
            raise ValueError(f"epochs={epochs!r}: expected an integer >= 1, or None")
        self.epochs = epochs
        self.declared: int | None = None
        """What the last training start declared (None: nothing)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        epochs = self.epochs
        if epochs is None:
            bounded = trainer.max_steps is None or trainer.max_steps < 0
            most = trainer.max_epochs
            if not (bounded and isinstance(most, int) and most >= 1):
                self.declared = None
                return
            epochs = most
        found: list[dloader.DataLoader] = []  # in what it holds: one, or a list or dict
        apply_to_collection(trainer.train_dataloader, dloader.DataLoader, found.append)
        loaders = [x for x in found if x.epochs is None]
        for loader in loaders:
            loader.epochs = epochs
        self.declared = epochs if loaders else None
