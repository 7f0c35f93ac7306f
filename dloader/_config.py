"""Timeouts, intervals and environment variables, in one place.

Environment variables read by dloader (each documented here and in the README):

``DLOADER_POLL_INTERVAL_S``
    How often (seconds) the main process wakes while waiting for a batch, to apply pending
    resizes and notice dead workers. Default 0.05.
"""

from __future__ import annotations

import os

__all__ = [
    "DEATH_GRACE_S",
    "JOIN_TIMEOUT_S",
    "POLL_INTERVAL_S",
    "STATS_WINDOW_S",
    "WORKER_POLL_INTERVAL_S",
    "env_float",
]


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    """Reads a float environment variable, with a clear error naming the value when invalid."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None
    if not value > minimum:
        raise ValueError(f"environment variable {name}={raw!r} must be > {minimum}")
    return value


#: Main-process wake-up interval while waiting for data (resizes, dead-worker detection).
POLL_INTERVAL_S: float = env_float("DLOADER_POLL_INTERVAL_S", 0.05)
#: Worker wake-up interval while idle, to notice that the main process has died.
WORKER_POLL_INTERVAL_S: float = 1.0
#: How long shutdown waits for a worker to exit before terminating it.
JOIN_TIMEOUT_S: float = 1.0
#: After a failed read from the workers, how long to wait for the culprit's exit to show.
DEATH_GRACE_S: float = 1.0
#: Default telemetry window for "recent" statistics.
STATS_WINDOW_S: float = 5.0
