"""Exceptions raised by dloader (one domain exception per subsystem).

Errors that torch's DataLoader also raises keep torch's exception type (and message prefix), so
code written against torch keeps matching them; dloader's own types subclass that type.
"""

from __future__ import annotations

__all__ = ["DLoaderError", "StateError", "WorkerDiedError"]


class DLoaderError(Exception):
    """Base class for dloader's own errors."""


class WorkerDiedError(DLoaderError, RuntimeError):
    """A loader worker process exited without being asked to (e.g. killed by a signal).

    It is a ``RuntimeError`` like torch's, and its message starts like torch's
    (``DataLoader worker (pid(s) ...) exited unexpectedly``), followed by the signal or exit code.
    """

    def __init__(self, message: str, pids: tuple[int, ...]) -> None:
        super().__init__(message)
        self.pids = pids


class StateError(DLoaderError, ValueError):
    """A loader ``state_dict`` cannot be used: wrong version, other dataset, missing fields."""
