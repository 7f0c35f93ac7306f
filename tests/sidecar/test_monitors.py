"""The process monitor on real process trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from dloader.sidecar.monitors import ProcessTreeStats, process_tree_stats, run_delay_s

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


def _spinning_child() -> subprocess.Popen[bytes]:
    """A shell (the "training process") whose one child spins on a CPU (kill its group)."""
    return subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c 'while True: pass' & wait"], start_new_session=True
    )


@pytest.mark.integration
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


@pytest.mark.integration
def test_cpu_is_measured_between_walks_per_process() -> None:
    """A worker spinning on a CPU reads ~100% from the second walk on (0 on first sight, as
    psutil's ``cpu_percent(None)``); a sleeping training process reads ~0; the RSS is read."""
    root = _spinning_child()
    try:
        first = _wait_for(lambda: _tree_if(root.pid, lambda s: len(s.worker_pids) == 1))
        spinner = first.worker_pids[0]
        time.sleep(1.0)
        second = process_tree_stats([root.pid])
        assert 40.0 <= second.cpu_percent <= 110.0  # one core; a shared machine may lend less
        assert second.main_cpu_percent < 10.0
        assert second.rss_bytes > 0 and spinner in second.worker_pids
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_unknown_pid_is_not_alive() -> None:
    pid = 2**22 + 12345  # above Linux's pid_max default
    stats = process_tree_stats([pid])
    assert not stats.alive and stats.worker_pids == ()


@pytest.mark.integration
def test_run_delay_grows_under_contention() -> None:
    # more CPU-bound processes than CPUs: each waits on a run queue, and schedstat says so
    n = (os.cpu_count() or 1) * 2 + 1
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]
    try:
        first = run_delay_s(spinners[0].pid)
        if first is None:
            pytest.skip("this kernel has no /proc/PID/schedstat")
        time.sleep(1.0)
        waited = sum(run_delay_s(p.pid) or 0.0 for p in spinners)
        assert waited > 0.1  # n spinners on fewer CPUs wait about (n - CPUs) seconds a second
        # a walk reads it for a job's workers: a parent's spinning child
        parent = _spinning_child()
        spinners.append(parent)
        stats = _wait_for(lambda: _tree_if(parent.pid, lambda s: len(s.worker_pids) == 1))
        assert set(stats.run_delay_s) == set(stats.worker_pids)
    finally:
        for p in spinners:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.integration
def test_tree_stats_give_each_process_its_private_memory() -> None:
    """USS per process (what a forked worker has copied) and the tree's PSS, from the kernel."""
    import multiprocessing as mp
    import os

    from dloader.sidecar import monitors
    from dloader.sidecar.monitors import process_tree_stats

    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def child() -> None:
        blob = bytearray(32 * 2**20)  # 32 MiB written: private to the child
        blob[::4096] = b"x" * len(blob[::4096])
        ready.set()
        done.wait(30)

    p = ctx.Process(target=child)
    p.start()
    try:
        assert ready.wait(30)
        monitors._children = (-1.0, {})  # the scan is shared for 0.5 s: this child is newer
        stats = process_tree_stats([os.getpid()])
        assert p.pid in stats.worker_pids
        assert stats.uss_bytes[p.pid] >= 32 * 2**20
        assert stats.uss_bytes[os.getpid()] > 0 and stats.pss_bytes >= stats.uss_bytes[p.pid]
    finally:
        done.set()
        p.join(10)


@pytest.mark.integration
def test_a_process_exiting_while_its_memory_is_read_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading an exiting process's smaps_rollup fails with ESRCH (not ENOENT): the process is
    left out of the tree's memory, and the walk goes on (it once failed the policy loop)."""
    from dloader.sidecar import monitors

    child = subprocess.Popen(["sleep", "30"])
    real = monitors._read

    def exiting(path: str) -> bytes:
        if path == f"/proc/{child.pid}/smaps_rollup":
            raise ProcessLookupError(3, "No such process")
        return real(path)

    try:
        monkeypatch.setattr(monitors, "_read", exiting)
        monitors._memory.clear()
        monitors._children = (-1.0, {})
        stats = process_tree_stats([os.getpid()])
        assert child.pid not in stats.uss_bytes
        assert stats.uss_bytes[os.getpid()] > 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.integration
def test_a_huge_tree_is_read_to_the_limit_nearest_first() -> None:
    """#49 §1 (low): the sidecar spent 34-78% of a core walking a user's 1,500-process tree;
    a walk now stops at its limit (the node's worker budget plus a slack), nearest first."""
    # a shell with 40 sleeping children, one of which has a child of its own (depth 2)
    script = "(sleep 60 & wait) & " + "sleep 60 & " * 39 + "wait"
    root = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    try:
        full = _wait_for(lambda: _tree_if(root.pid, lambda s: len(s.worker_pids) == 41))
        assert not full.truncated
        cut = process_tree_stats([root.pid], limit=11)
        assert cut.truncated and len(cut.worker_pids) == 10  # the root and 10 of its tree
        children = set(subprocess.check_output(["pgrep", "-P", str(root.pid)]).split())
        assert {str(p).encode() for p in cut.worker_pids} <= children  # nearest first
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
