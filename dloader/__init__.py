"""dloader: keeps accelerators busy on shared training nodes.

The public surface of the in-process library:

* :class:`DataLoader`: a drop-in ``torch.utils.data.DataLoader`` with live ``resize()`` and
  ``set_batch_size()``, telemetry (``stats()``) and resumable mid-epoch state.
* :class:`ElasticDistributedSampler`: a ``DistributedSampler`` whose epoch continues under a
  new world size; :mod:`dloader.elastic`: checkpoints of model, optimizer and data position.
* :class:`LoaderStats`, :class:`WorkerStats`: the telemetry snapshot types.
* :mod:`dloader.errors`: the exceptions.
"""

from dloader._elastic_sampler import ElasticDistributedSampler
from dloader._loader import DataLoader
from dloader._stats import LoaderStats, WorkerStats
from dloader.errors import DLoaderError, StateError, WorkerDiedError

__all__ = [
    "DLoaderError",
    "DataLoader",
    "ElasticDistributedSampler",
    "LoaderStats",
    "StateError",
    "WorkerDiedError",
    "WorkerStats",
]

__version__ = "0.1.0"
