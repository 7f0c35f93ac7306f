"""The workers' results to the main process: one pipe that never leaves either side hanging.

``multiprocessing.Queue`` pickles in a feeder thread: a batch that cannot be pickled is
dropped there with a printed traceback, and the main process waits for it forever. And a
worker killed in the middle of writing a large batch leaves half a message in the pipe: a
plain ``get()`` then blocks on the rest forever. So:

* a worker pickles and writes synchronously (``SimpleQueue``): a pickling error is raised in
  the worker, which reports it as the batch's error; the write blocks only while the pipe is
  full, and fails as soon as the main process is gone (workers close their copy of the read
  end, so the main process's is the only one);
* the main process reads a message with the pipe's framing itself, waiting in short polls and
  calling ``check`` between them, so that a message whose writer died raises (the caller's
  check names the dead worker) instead of hanging.
"""

from __future__ import annotations

import os
import queue
import select
import struct
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["ResultPipe"]


class ResultPipe:
    """Results from the workers (many writers) to the main process (one reader)."""

    def __init__(self, ctx: Any) -> None:
        self._q = ctx.SimpleQueue()

    # ------------------------------------------------------------------ the workers' side

    def in_worker(self) -> None:
        """Called once in each worker: drops its inherited copy of the read end, so that the
        main process's death shows as a broken pipe to a worker blocked on a full pipe."""
        self._q._reader.close()

    def send(self, msg: Any) -> None:
        """Pickles and writes ``msg`` now (raises if it cannot be pickled; nothing is written)."""
        self._q.put(msg)

    # ------------------------------------------------------------------ the main side

    def recv(self, timeout: float, check: Callable[[], None], poll_s: float) -> Any:
        """The next message; ``queue.Empty`` if none begins within ``timeout`` seconds. Once a
        message has begun, waits for the rest in ``poll_s`` steps, calling ``check()`` between
        them (it raises if the writer died)."""
        reader = self._q._reader
        if not reader.poll(timeout):
            raise queue.Empty
        fd = reader.fileno()
        (size,) = struct.unpack("!i", self._read(fd, 4, check, poll_s))
        if size == -1:  # multiprocessing.connection's framing of messages of 2 GiB and more
            (size,) = struct.unpack("!Q", self._read(fd, 8, check, poll_s))
        return ForkingPickler.loads(self._read(fd, size, check, poll_s))

    @staticmethod
    def _read(fd: int, size: int, check: Callable[[], None], poll_s: float) -> bytearray:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if not ready:
                check()
                continue
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise EOFError("the workers' result pipe closed in the middle of a message")
            got += n
        return buf

    def close(self) -> None:
        """Closes the main process's ends."""
        self._q.close()
