"""Errors and process lifecycle: worker exceptions, dead workers, timeouts, clean exits."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import psutil
import pytest

import dloader
from dloader._engine.result_pipe import ResultPipe
from tests.loader import datasets as D

pytestmark = pytest.mark.integration


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    alive = pids
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


@pytest.mark.parametrize("num_workers", [0, 2])
def test_worker_exception_reraised_with_traceback(num_workers: int) -> None:
    loader = dloader.DataLoader(D.Failing(10, bad=5), batch_size=2, num_workers=num_workers)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(KeyError) as err:
        next(it)
    assert "sample 5 is corrupt" in str(err.value)
    if num_workers:
        assert "in DataLoader worker process" in str(err.value)
        assert "Original Traceback" in str(err.value)
        assert "datasets.py" in str(err.value)  # the worker's frames are in the message
    # Like torch, the iterator goes on after an error.
    assert next(it).tolist() == [6, 7]


def test_worker_init_fn_error_is_raised() -> None:
    loader = dloader.DataLoader(
        D.Range(8), batch_size=2, num_workers=2, worker_init_fn=D.failing_init
    )
    with pytest.raises(RuntimeError, match="init failed in worker 0"):
        list(loader)


def test_killed_worker_names_pid_and_signal_quickly() -> None:
    loader = dloader.DataLoader(D.SuicidalWorker(40, bad=9), batch_size=2, num_workers=2)
    start = time.monotonic()
    with pytest.raises(dloader.WorkerDiedError) as err:
        list(loader)
    assert time.monotonic() - start < 5
    msg = str(err.value)
    # torch's wording (torch/csrc/DataLoader.cpp), which log scrapers match; detail after it
    pid = err.value.pids[0]
    assert msg.startswith(f"DataLoader worker (pid {pid}) is killed by signal: Killed. "), msg
    assert "SIGKILL" in msg
    assert isinstance(err.value, RuntimeError)


def test_a_segfault_reads_as_torch_says_it() -> None:
    """torch: "DataLoader worker (pid N) is killed by signal: Segmentation fault." """
    import signal

    loader = dloader.DataLoader(
        D.SuicidalWorker(8, bad=3, sig=signal.SIGSEGV), batch_size=2, num_workers=1
    )
    with pytest.raises(dloader.WorkerDiedError) as err:
        list(loader)
    pid = err.value.pids[0]
    expected = f"DataLoader worker (pid {pid}) is killed by signal: Segmentation fault. "
    assert str(err.value).startswith(expected), str(err.value)


def test_timeout_raises_like_torch() -> None:
    loader = dloader.DataLoader(D.Stuck(8, bad=0), batch_size=2, num_workers=1, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.5 seconds"):
        next(iter(loader))
    assert time.monotonic() - start < 3


def test_workers_exit_when_iterator_dropped() -> None:
    loader = dloader.DataLoader(D.Range(100, sleep_s=0.01), batch_size=2, num_workers=3)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in loader.stats().workers]
    assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
    del it
    gc.collect()
    assert _wait_gone(pids, 10) == []


def test_workers_exit_at_end_of_epoch_and_persist_when_asked() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    pids = [w.pid for w in loader.stats().workers]
    list(it)
    assert _wait_gone(pids, 10) == []
    persistent = dloader.DataLoader(
        D.Range(10), batch_size=2, num_workers=2, persistent_workers=True
    )
    list(persistent)
    first = sorted(w.pid for w in persistent.stats().workers)
    list(persistent)
    assert sorted(w.pid for w in persistent.stats().workers) == first


def test_workers_exit_when_main_process_dies(tmp_path: object) -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        sys.path.insert(0, os.getcwd())
        import dloader
        from tests.loader import datasets as D
        loader = dloader.DataLoader(D.Range(10**6, sleep_s=0.01), batch_size=2, num_workers=2)
        it = iter(loader)
        next(it)
        print(" ".join(str(w.pid) for w in loader.stats().workers), flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Orphaned workers notice within their poll interval (1 s) and exit.
    assert _wait_gone(pids, 10) == []


def test_a_worker_killed_mid_write_raises_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each batch is 64 MB of numpy data, written through a 64 KB pipe. The receiver thread
    # reads as messages arrive; here it starts on a message's body only 3 s after its header
    # (as a receiver kept from running would), so the worker blocks in the middle of its
    # write, and is killed there
    read = ResultPipe._read

    def late(fd: int, size: int, *args: Any) -> bytearray:
        if size > 2**20:
            time.sleep(3.0)
        return read(fd, size, *args)

    monkeypatch.setattr(ResultPipe, "_read", staticmethod(late))
    loader = dloader.DataLoader(
        D.Big(8, mb=64), batch_size=None, num_workers=1, collate_fn=lambda x: x
    )
    it = iter(loader)
    time.sleep(0.5)
    pid = loader.stats().workers[0].pid
    assert pid is not None
    time.sleep(1.5)  # the worker has fetched and is blocked writing the first batch
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(dloader.WorkerDiedError, match="SIGKILL"):
        next(it)
    assert time.monotonic() - start < 10  # torch raises within ~15 ms; never a hang


def test_a_sample_that_cannot_be_pickled_is_an_error_naming_it() -> None:
    loader = dloader.DataLoader(
        D.Unpicklable(8, bad=5), batch_size=2, num_workers=2, collate_fn=list
    )
    it = iter(loader)
    assert next(it) == [0, 1] and next(it) == [2, 3]
    with pytest.raises(TypeError) as err:
        next(it)
    msg = str(err.value)
    assert "sample index(es) [4, 5]" in msg and "_thread.lock" in msg, msg
    assert next(it) == [6, 7]  # like any worker error, the iterator goes on


def test_workers_of_a_killed_trainer_exit_busy_or_blocked() -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        sys.path.insert(0, os.getcwd())
        import dloader
        from tests.loader import datasets as D
        # worker 0 is blocked writing a 64 MB batch nobody reads; worker 1 is busy in a
        # 60-second __getitem__
        big = dloader.DataLoader(D.Big(4, mb=64), batch_size=None, num_workers=1,
                                 collate_fn=lambda x: x)
        busy = dloader.DataLoader(D.Big(4, mb=1, sleep_s=60), batch_size=None, num_workers=1,
                                  collate_fn=lambda x: x)
        a, b = iter(big), iter(busy)
        time.sleep(1.0)
        pids = [w.pid for w in big.stats().workers + busy.stats().workers]
        print(" ".join(str(p) for p in pids), flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    start = time.monotonic()
    assert _wait_gone(pids, 10) == []
    assert time.monotonic() - start < 5  # the watchdog polls each second


def test_resize_errors_name_the_value() -> None:
    loader = dloader.DataLoader(D.Range(10), num_workers=1, min_workers=1, max_workers=4)
    with pytest.raises(
        ValueError, match=r"num_workers=5 is outside \[min_workers=1, max_workers=4\]"
    ):
        loader.resize(5)
    with pytest.raises(ValueError, match=r"num_workers=0 is outside"):
        loader.resize(0)
    with pytest.raises(ValueError, match=r"num_workers=-1 must be >= 0"):
        loader.resize(-1)
    with pytest.raises(TypeError, match=r"num_workers='2' must be an int"):
        loader.resize("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_workers=0 is outside \[min_workers=1"):
        dloader.DataLoader(D.Range(10), num_workers=0, min_workers=1)
    with pytest.raises(ValueError, match=r"max_workers=1 must be >= min_workers=2"):
        dloader.DataLoader(D.Range(10), num_workers=2, min_workers=2, max_workers=1)


def test_batch_size_errors_name_the_value() -> None:
    loader = dloader.DataLoader(D.Range(10), batch_size=4, batch_size_range=(2, 8))
    with pytest.raises(ValueError, match=r"batch_size=9 is outside batch_size_range=\(2, 8\)"):
        loader.set_batch_size(9)
    with pytest.raises(ValueError, match=r"batch_size=0 must be >= 1"):
        loader.set_batch_size(0)
    with pytest.raises(ValueError, match=r"batch_size=1 is outside"):
        dloader.DataLoader(D.Range(10), batch_size=1, batch_size_range=(2, 8))
    with pytest.raises(ValueError, match=r"must be a \(low, high\) pair"):
        dloader.DataLoader(D.Range(10), batch_size=4, batch_size_range=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"user-supplied batch_sampler"):
        dloader.DataLoader(D.Range(10), batch_sampler=[[0, 1]]).set_batch_size(3)
    with pytest.raises(ValueError, match=r"batch_size=None"):
        dloader.DataLoader(D.Range(10), batch_size=None).set_batch_size(3)
    with pytest.raises(ValueError, match=r"stats_window_s=0 must be > 0"):
        dloader.DataLoader(D.Range(10), stats_window_s=0)
