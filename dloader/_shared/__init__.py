"""What every dloader process shares, beneath the library and the daemons: the typed forms of
the gRPC messages (:mod:`.node_messages`, :mod:`.allocator_messages`), how a client reaches a
daemon (:mod:`.client`), every environment variable read or exported (:mod:`.env`), and what
this host lets a process use, from ``/proc`` and cgroups (:mod:`.host`).

Nothing here imports torch or gRPC at import time: the training process loads it too.
"""
