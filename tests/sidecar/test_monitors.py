"""The process monitor on real process trees."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

from sidecar.monitors import ProcessTreeStats, process_tree_stats

T = TypeVar("T")


def _wait_for(pred: Callable[[], T | None], timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def _tree_if(pid: int, pred: Callable[[ProcessTreeStats], bool]) -> ProcessTreeStats | None:
    stats = process_tree_stats([pid])
    return stats if pred(stats) else None


def test_tree_of_a_live_process_then_of_a_dead_one() -> None:
    # a shell (the "training process") with a subshell that has its own child: 3 descendants
    root = subprocess.Popen(
        ["bash", "-c", "sleep 60 & (sleep 60 & wait) & wait"], start_new_session=True
    )
    try:
        stats = _wait_for(lambda: _tree_if(root.pid, lambda s: len(s.worker_pids) == 3))
        assert stats.alive and stats.pids == (root.pid,)
        assert root.pid not in stats.worker_pids
        assert stats.rss_bytes > 0
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    dead = _wait_for(lambda: _tree_if(root.pid, lambda s: not s.alive))
    assert dead.worker_pids == ()


def test_unknown_pid_is_not_alive() -> None:
    pid = 2**22 + 12345  # above Linux's pid_max default
    stats = process_tree_stats([pid])
    assert not stats.alive and stats.worker_pids == ()
