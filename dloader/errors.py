"""The project's exceptions: one hierarchy, rooted at :class:`DLoaderError`.

* The library's errors keep torch's exception type where torch's DataLoader raises one
  (``WorkerDiedError`` is a ``RuntimeError``), so code written against torch keeps matching them.
* Bad values (arguments, settings, models, traces) are ``ValueError`` subclasses.
* :class:`RequestError` and its subclasses are what the daemons' cores raise for a request they
  refuse; each names the offending field and carries the name of its gRPC status code, which the
  daemons' one interceptor (:mod:`dloader._daemon.server`) maps. This module imports no gRPC.

Every type round-trips through ``pickle`` (a worker or child process can raise it to its parent).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "MAX_MESSAGE_CHARS",
    "AllocatorError",
    "AlreadyExists",
    "CheckpointError",
    "ConfigError",
    "DLoaderError",
    "InvalidArgument",
    "LaunchRefused",
    "NotFound",
    "PermissionDenied",
    "PredictorError",
    "RemoteWorkerError",
    "RequestError",
    "ResourceExhausted",
    "StateError",
    "Unauthenticated",
    "WorkerDiedError",
    "WorkerStartError",
    "finite_within",
    "shown",
]

#: A request error's message is cut to this many characters (it travels in a gRPC trailer).
MAX_MESSAGE_CHARS = 1024


def shown(value: object, limit: int = 64) -> str:
    """``repr(value)``, cut to about ``limit`` characters: what an error may echo of a value a
    client sent (a 16 KB id must not come back in a trailer, nor forge a log line)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, (str, bytes)) else ""
    return f"{text[:limit]}...{size}"


def finite_within(field: str, value: object, low: float, high: float) -> float:
    """``value`` as a float if it is a finite number within ``[low, high]``; else
    :class:`InvalidArgument` naming ``field`` and the range (bounds every number a client sends)."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    ):
        return float(value)
    raise InvalidArgument(field, f"{shown(value)} must be a finite number within [{low}, {high}]")


class DLoaderError(Exception):
    """Base class of every error dloader raises itself."""


# ---------------------------------------------------------------------- the library


class WorkerDiedError(DLoaderError, RuntimeError):
    """A loader worker process exited without being asked to (e.g. killed by a signal).

    It is a ``RuntimeError`` like torch's, with torch's wording for each worker that died
    (``DataLoader worker (pid N) is killed by signal: Segmentation fault.``, or ``... exited
    unexpectedly with exit code N. ...``), followed by which worker it was.
    """

    def __init__(self, message: str, pids: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.pids = tuple(pids)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.pids))


class WorkerStartError(DLoaderError, RuntimeError):
    """A loader worker process could not be started (it exited or failed before it was ready)."""


class RemoteWorkerError(DLoaderError, RuntimeError):
    """Remote loader workers (Ray) cannot run: Ray is not installed, the dataset cannot be sent
    to them, or a remote worker cannot load it (its files are not reachable there)."""


class StateError(DLoaderError, ValueError):
    """A loader ``state_dict`` cannot be used: wrong version, other dataset, missing fields."""


class CheckpointError(DLoaderError, ValueError):
    """An elastic checkpoint folder (:mod:`dloader.elastic`) is missing, incomplete or corrupt,
    or the ranks' states disagree."""


# ---------------------------------------------------------------------- values and settings


class ConfigError(DLoaderError, ValueError):
    """A bad setting: a command-line flag, an environment variable or a stored setting."""


class LaunchRefused(DLoaderError):
    """``dloader-launch`` will not act on a job: another's (it holds no token for it), or one
    that has already ended."""


class PredictorError(DLoaderError, ValueError):
    """Invalid input to a throughput model, or a serialised model that cannot be loaded."""


class AllocatorError(DLoaderError, ValueError):
    """Invalid input to the optimizer, a policy, the simulator or its trace files."""


# ---------------------------------------------------------------------- requests to a daemon


class RequestError(DLoaderError):
    """A request a daemon refuses; ``field`` names the offending request field.

    ``code`` is the name of the gRPC status code it maps to (``grpc.StatusCode[code]``).
    """

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str) -> None:
        field, message = field[:100], message[:MAX_MESSAGE_CHARS]
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.message))


class InvalidArgument(RequestError, ValueError):
    """Malformed or out-of-range input (INVALID_ARGUMENT)."""

    code = "INVALID_ARGUMENT"


class NotFound(RequestError):
    """An unknown job or node (NOT_FOUND)."""

    code = "NOT_FOUND"


class AlreadyExists(RequestError):
    """An id that is already taken (ALREADY_EXISTS)."""

    code = "ALREADY_EXISTS"


class PermissionDenied(RequestError):
    """A caller whose credential does not allow the action (PERMISSION_DENIED)."""

    code = "PERMISSION_DENIED"


class ResourceExhausted(RequestError):
    """A bounded list is full (RESOURCE_EXHAUSTED): too many jobs, nodes or entries."""

    code = "RESOURCE_EXHAUSTED"


class Unauthenticated(RequestError):
    """A caller without a valid credential (UNAUTHENTICATED)."""

    code = "UNAUTHENTICATED"
