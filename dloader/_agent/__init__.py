"""The sidecar agent: the loader's second controller, which joins it to the node sidecar.

* :mod:`.agent`: :class:`~.agent.SidecarAgent`, the thread in the training process that reports
  the loader's stats and applies the sidecar's directives through the loader's controls
  (:mod:`dloader._engine.control`);
* :mod:`.helper`: its helper process (``python -m dloader._agent.helper``), which holds the gRPC
  client (gRPC does not survive the ``fork()`` that starts loader workers).
"""
