"""The loader's engine: what runs behind :class:`dloader.DataLoader` in the training process.

* :mod:`.iterator`: :class:`~.iterator.LoaderIterator`, the resizable pool of worker processes
  that delivers batches in order;
* :mod:`.workers`: the worker processes' loop and the in-process fetcher;
* :mod:`.result_pipe`: the pipe the workers send results through;
* :mod:`.index_stream`: the epoch's sample order cut into batches at a changeable size;
* :mod:`.position`: the saved position in an epoch (``state_dict()``), and its validation;
* :mod:`.telemetry`: waits, steps and per-worker costs (``loader.stats()``);
* :mod:`.control`: what the loader's controllers (``num_workers="auto"``, the sidecar agent)
  may do to it;
* :mod:`.processes`: the lock every process dloader starts is started under;
* :mod:`.ranks`: this process's rank and world in ``torch.distributed``;
* :mod:`.timing`: its timeouts and intervals.

The engine never imports the facade (:mod:`dloader._dataloader`): the loader hands it what it
needs explicitly.
"""
