"""The lock under which dloader starts every process of a training process (loader workers, the
sidecar agent's helper).

A ``fork()`` in one thread copies every file descriptor open in the others, ``O_CLOEXEC`` or
not: a worker forked while ``subprocess.Popen`` waits on its exec-status pipe keeps that pipe
open, and ``Popen`` blocks until the worker exits (seen: a 60 s stall). Starting processes one
at a time rules that out.
"""

from __future__ import annotations

import threading

__all__ = ["PROCESS_START_LOCK"]

PROCESS_START_LOCK = threading.Lock()
