"""``num_workers="auto"``: the loader's own worker-count controller, with no sidecar.

* :mod:`.tuner`: :class:`~.tuner.WorkerTuner`, the decisions (pure: windows in, a count out);
* :mod:`.controller`: :class:`~.controller.AutoTuner`, the thread that measures a loader and
  applies the tuner's counts through the loader's controls (:mod:`dloader._engine.control`);
* :mod:`.peers`: the board through which one user's tuned loaders on a machine share CPU.
"""
