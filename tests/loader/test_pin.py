"""Pinned memory on the pin thread: order, overlap with the training step, errors, resizes;
and the same receiver thread taking batches in without pinning.

This machine has no accelerator, so ``pin_memory=True`` is off here as in torch; these tests turn
it on and stand in for ``pin_memory`` (at the hardware boundary: pinning needs a GPU driver) with a
function that records where and when it ran. The real copy into pinned memory was measured on
an H100 (``benchmarks/gpu/bench_gpu.py``).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from typing import Any

import pytest
import torch

import dloader
from dloader._engine import iterator as _iter
from tests.loader import datasets as D
from tests.loader.datasets import Range
from tests.loader.test_faults import _wait_gone

pytestmark = pytest.mark.integration


class FakePin:
    """Records each batch it pins: its first sample, the thread and the time; ``fail_at``: the
    first sample of a batch whose pinning raises."""

    def __init__(self, seconds: float = 0.0, fail_at: int | None = None) -> None:
        self.seconds = seconds
        self.fail_at = fail_at
        self.calls: list[tuple[int, str, float]] = []

    def __call__(self, data: Any, device: Any = None) -> Any:
        try:
            first = int(data[0])
        except (TypeError, ValueError, IndexError):
            first = -1
        self.calls.append((first, threading.current_thread().name, time.monotonic()))
        if first == self.fail_at:
            raise RuntimeError(f"cannot pin batch {first}")
        time.sleep(self.seconds)
        return ("pinned", data)


@pytest.fixture
def pin(monkeypatch: pytest.MonkeyPatch) -> FakePin:
    fake = FakePin()
    monkeypatch.setattr(_iter.LoaderIterator, "_check_pin_memory", lambda self, loader: True)
    monkeypatch.setattr(_iter, "_pin_memory", fake)
    return fake


def test_batches_are_pinned_on_the_pin_thread_in_order(pin: FakePin) -> None:
    loader = dloader.DataLoader(Range(96), batch_size=4, num_workers=2, pin_memory=True)
    got = list(loader)
    assert [tag for tag, _ in got] == ["pinned"] * 24
    assert torch.cat([b for _, b in got]).tolist() == list(range(96))
    assert {name.split("_")[0] for _, name, _ in pin.calls} == {"dloader-pin"}
    assert sorted(first for first, _, _ in pin.calls) == list(range(0, 96, 4))  # each once


def test_without_pinning_batches_are_taken_in_on_the_receiver_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without pinning too, each message is read and unpickled by the receiver thread as it
    arrives, never by the training thread in its next(): unpickling a batch's tensors waits
    for the sending worker's GIL, and done in next() (in its turn, or with the batches taken
    in ahead of it) it stalled a CPU-bound loader's trainer (0.85-0.94x torch's throughput)."""
    readers: list[str] = []
    recv = _iter.ResultPipe.recv

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        readers.append(threading.current_thread().name)
        return recv(self, *args, **kwargs)

    monkeypatch.setattr(_iter.ResultPipe, "recv", recording)
    loader = dloader.DataLoader(Range(96), batch_size=4, num_workers=2)
    assert torch.cat(list(loader)).tolist() == list(range(96))
    assert readers and set(readers) == {"dloader-receive"}


def test_pinning_overlaps_the_training_step(pin: FakePin) -> None:
    """While the trainer works on batch k, batch k+1 (already received) is being pinned: its
    pinning starts before the trainer asks for it."""
    pin.seconds = 0.02
    loader = dloader.DataLoader(Range(160), batch_size=4, num_workers=2, pin_memory=True)
    asked: dict[int, float] = {}
    it = iter(loader)
    for k in range(40):
        asked[k * 4] = time.monotonic()
        next(it)
        time.sleep(0.05)  # the training step
    del it
    started = {first: t for first, _, t in pin.calls}
    early = [k for k in asked if k in started and started[k] < asked[k]]
    assert len(early) >= 30, f"pinned before asked for: {sorted(early)}"


def test_a_pinning_error_is_raised_at_its_batch(pin: FakePin) -> None:
    pin.fail_at = 20
    loader = dloader.DataLoader(Range(64), batch_size=4, num_workers=2, pin_memory=True)
    it = iter(loader)
    for _ in range(5):
        next(it)
    with pytest.raises(RuntimeError, match="cannot pin batch 20"):
        next(it)


def test_resizes_and_persistent_epochs_with_pinning(pin: FakePin) -> None:
    loader = dloader.DataLoader(
        Range(120), batch_size=3, num_workers=1, pin_memory=True, persistent_workers=True
    )
    for epoch in range(2):
        seen = []
        for step, (_, batch) in enumerate(loader):
            seen += batch.tolist()
            if step in (3, 17):
                loader.resize(3 if step == 3 else 1)
        assert seen == list(range(120)), epoch
    assert all(name.startswith("dloader-pin") for _, name, _ in pin.calls)


def test_a_worker_error_and_a_killed_worker_with_pinning(pin: FakePin) -> None:
    """Through the receiver thread, as without it: a dataset error is raised at its batch; a
    killed worker is named (torch's words) within seconds."""
    loader = dloader.DataLoader(
        D.SuicidalWorker(40, bad=9), batch_size=2, num_workers=2, pin_memory=True
    )
    start = time.monotonic()
    with pytest.raises(dloader.WorkerDiedError, match="is killed by signal: Killed"):
        list(loader)
    assert time.monotonic() - start < 5


def test_a_worker_killed_mid_write_raises_with_pinning(pin: FakePin) -> None:
    """The receiver reads eagerly, so a worker blocks in a write only while the receiver is
    busy: it pins the first 64 MB batch for 2.5 s while the worker writes the second into the
    64 KB pipe, and is killed there. The trainer gets WorkerDiedError (at the first batch or
    the second), not a hang."""
    pin.seconds = 2.5
    loader = dloader.DataLoader(
        D.Big(8, mb=64), batch_size=None, num_workers=1, collate_fn=lambda x: x, pin_memory=True
    )
    it = iter(loader)
    deadline = time.monotonic() + 20
    while not pin.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pin.calls, "the receiver never pinned the first batch"
    time.sleep(1.0)  # the worker is blocked writing the second batch
    pid = loader.stats().workers[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(dloader.WorkerDiedError, match="SIGKILL"):
        next(it)  # the first batch, or the death seen while its pinning ends (as torch)
        next(it)
    assert time.monotonic() - start < 10


def test_a_dropped_iterator_stops_its_workers_and_receiver(pin: FakePin) -> None:
    """The receiver thread holds nothing that keeps the iterator alive: dropping it stops the
    workers and the thread."""
    loader = dloader.DataLoader(
        Range(100, sleep_s=0.01), batch_size=2, num_workers=3, pin_memory=True
    )
    it = iter(loader)
    next(it)
    pids = [w.pid for w in loader.stats().workers]
    assert len(pids) == 3
    receiver = it._receiver  # type: ignore[attr-defined]
    assert receiver is not None and receiver.is_alive()
    del it
    gc.collect()
    assert _wait_gone(pids, 10) == []
    receiver.join(timeout=5)
    assert not receiver.is_alive()
