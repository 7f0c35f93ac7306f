"""dloader: keeps accelerators busy on shared training nodes.

The public surface of the in-process library:

* :class:`DataLoader`: a drop-in ``torch.utils.data.DataLoader`` with live ``resize()`` and
  ``set_batch_size()``, telemetry (``stats()``), resumable mid-epoch state, and an optional
  agent that cooperates with the node sidecar.
* :class:`ElasticDistributedSampler`: a ``DistributedSampler`` whose epoch continues under a
  new world size; :mod:`dloader.elastic`: checkpoints of model, optimizer and data position.
* :class:`RayWorkers`: loader workers on other machines' CPUs (Ray), beside the local ones.
* :class:`LoaderStats`, :class:`WorkerStats`: the telemetry snapshot types.
* :mod:`dloader.errors`: the project's one exception hierarchy.

Names are imported on first use, so that ``import dloader.v1`` (the gRPC messages, used by the
sidecar agent's helper process) and the daemons (:mod:`dloader.sidecar`,
:mod:`dloader.allocator`, installed with the ``[sidecar]`` and ``[allocator]`` extras) do not
import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dloader.errors import DLoaderError, StateError, WorkerDiedError, WorkerStartError

if TYPE_CHECKING:
    from dloader._dataloader import DataLoader
    from dloader._elastic_sampler import ElasticDistributedSampler
    from dloader._engine.remote import RayWorkers
    from dloader._engine.telemetry import LoaderStats, WorkerStats
    from dloader._string_array import StringArray

__all__ = [
    "DLoaderError",
    "DataLoader",
    "ElasticDistributedSampler",
    "LoaderStats",
    "RayWorkers",
    "StateError",
    "StringArray",
    "WorkerDiedError",
    "WorkerStartError",
    "WorkerStats",
]

__version__ = "0.1.0"

_LAZY = {
    "DataLoader": "dloader._dataloader",
    "ElasticDistributedSampler": "dloader._elastic_sampler",
    "LoaderStats": "dloader._engine.telemetry",
    "RayWorkers": "dloader._engine.remote",
    "StringArray": "dloader._string_array",
    "WorkerStats": "dloader._engine.telemetry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dloader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
