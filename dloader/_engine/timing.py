"""The loader's timeouts and intervals, in one place (environment variables: :mod:`._env`)."""

from __future__ import annotations

from dloader._shared.env import env_float

__all__ = [
    "DEATH_GRACE_S",
    "JOIN_TIMEOUT_S",
    "POLL_INTERVAL_S",
    "STATS_WINDOW_S",
    "WORKER_POLL_INTERVAL_S",
]


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
