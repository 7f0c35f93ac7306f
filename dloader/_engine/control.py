"""What a loader's controllers may do to it: the one contract between
:class:`dloader.DataLoader` and the two programs that steer it from a thread of their own, the
``num_workers="auto"`` tuner (:mod:`dloader._autotune`) and the sidecar agent
(:mod:`dloader._agent`).

A controller gets a :class:`LoaderControls`, never the loader: it reads the loader's stats and
bounds, resizes it, and asks for a batch size. Nothing else. The controls hold the loader
weakly: a controller never keeps a dropped loader alive, and learns that it is gone
(``stats()`` returns None, the actions return False).

* :meth:`~LoaderControls.resize` is a controller's resize: unlike the user's
  ``loader.resize()``, it does not stop the tuner, and it is refused once ``unless`` is set
  (the user took over: their resize stopped the controller while it was deciding).
* :meth:`~LoaderControls.resize_remote` sets the count of its remote workers (Ray actors on
  other machines' CPUs), where the loader was given ``remote=RayWorkers(...)``.
* :meth:`~LoaderControls.set_batch_size` is the one route of a batch size a controller
  directs: applied at once in a single process; in a data-parallel job (one rank of several),
  staged, for :func:`dloader.integrations.torchrun.sync_batch_size` to apply on every rank at
  the same batch. A loader without a ``batch_size_range`` takes none.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from dloader._engine.telemetry import LoaderStats

__all__ = ["ControlLimits", "LoaderControls"]


@dataclass(frozen=True)
class ControlLimits:
    """The bounds a controller works within, as the loader's owner declared them."""

    min_workers: int
    max_workers: int
    """The owner's ``max_workers`` (0: none declared)."""
    worker_bound: int
    """The most workers the loader may have now (``max_workers``, else the ceiling the
    process's open-file limit, or for ``"auto"`` its CPUs, allow)."""
    batch_size_range: tuple[int, int] | None
    """The batch sizes a controller may set (None: it may not change the batch size)."""
    prefetch_factor: int
    """Batches each worker may hold undelivered."""
    max_remote_workers: int = 0
    """Remote (Ray) workers the loader may have (``RayWorkers.max_workers``; 0: none)."""


class LoaderControls(Protocol):
    """A controller's handle on one loader (see the module's docstring)."""

    def stats(self) -> LoaderStats | None:
        """The loader's telemetry now (None: the loader is gone)."""
        ...

    def limits(self) -> ControlLimits | None:
        """The loader's bounds now (None: the loader is gone)."""
        ...

    def resize(self, num_workers: int, *, unless: threading.Event | None = None) -> bool:
        """Sets the worker count (checked against the bounds: ``ValueError``) unless
        ``unless`` is set; False if not applied (``unless`` set, or the loader gone)."""
        ...

    def set_batch_size(self, batch_size: int) -> bool:
        """Applies, or stages for the ranks to apply together, a directed batch size (checked
        against the range: ``ValueError``); False if the loader takes none (no range, the
        same size, or gone)."""
        ...

    def tune(self, up_to: int | None) -> bool:
        """Lets the loader's own tuner choose its count, up to ``up_to`` workers (starting one
        if it had none); False where it cannot tune (an iterable dataset, a tuner the user's
        ``resize()`` stopped, or the loader gone). None: a tuner the sidecar started stops, and
        False."""
        ...

    def resize_remote(self, workers: Mapping[str, int]) -> bool:
        """Sets the remote (Ray) workers by where they run (``""``: the pool; else a lending
        node's id), within ``RayWorkers.max_workers`` in all (the pool's first, then by node
        id); False if the loader has no remote workers configured, or is gone."""
        ...
