"""The lock under which dloader starts every process of a training process (loader workers, the
sidecar agent's helper).

A ``fork()`` in one thread copies every file descriptor open in the others, ``O_CLOEXEC`` or
not: a worker forked while ``subprocess.Popen`` waits on its exec-status pipe keeps that pipe
open, and ``Popen`` blocks until the worker exits (seen: a 60 s stall). Starting processes one
at a time rules that out.

A process forked by other code (``os.fork``, a ``fork`` launcher) while one of its threads held
the lock would inherit it held, by a thread the child does not have: the child's first process
start would wait forever (seen: the sidecar agent, started with its loader, was starting its
helper at the fork). A forked child gets the lock fresh.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["PROCESS_START_LOCK"]


class _StartLock:
    """A lock (``with PROCESS_START_LOCK:``) that a forked child gets released."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def renew(self) -> None:
        self._lock = threading.Lock()


PROCESS_START_LOCK = _StartLock()
os.register_at_fork(after_in_child=PROCESS_START_LOCK.renew)
