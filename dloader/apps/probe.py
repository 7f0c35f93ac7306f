"""``python -m dloader.apps.probe``: a real ``dloader.DataLoader`` against this node's
accelerator for a few seconds, measured; ``dloaderctl doctor`` runs it as a subprocess (the
sidecar's tools import no torch) and reads its JSON.

A synthetic image batch (uint8, 3x224x224) is decoded (converted to float) in the workers; the
trainer moves each batch to the GPU (pinned memory, ``non_blocking``) and runs a matrix product
sized to take about as long as the loader needs, so that both data wait and GPU utilisation are
meaningful. Without CUDA the "accelerator" is a sleep, and the GPU figures are absent.

Measured: the trainer's data-wait share (``loader.stats()``), NVML utilisation sampled during the
run (when NVML is there), the host-to-device copy rate from pinned and from pageable memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Dataset

from dloader import DataLoader
from dloader._shared.cli import finite

__all__ = ["gpu_utilisation", "main", "probe"]


class _Images(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        raw = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8, generator=g)
        return raw.float().div_(255.0)


def _copy_rate(pinned: bool, mib: int = 256) -> float:
    """Host-to-device GB/s for a ``mib`` MiB tensor (CUDA only)."""
    host = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty_like(host, device="cuda")
    dev.copy_(host, non_blocking=pinned)  # warm up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(4):
        dev.copy_(host, non_blocking=pinned)
    end.record()
    torch.cuda.synchronize()
    return 4 * (mib << 20) / (start.elapsed_time(end) / 1e3) / 1e9


@contextlib.contextmanager
def gpu_utilisation(index: int, interval_s: float) -> Iterator[list[tuple[float, float]]]:
    """While open, (``time.monotonic()``, NVML utilisation of GPU ``index`` in [0, 1]) every
    ``interval_s`` seconds, from a thread; none without NVML."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def run() -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            while not stop.wait(interval_s):
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                samples.append((time.monotonic(), util))
        except Exception:
            return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def probe(seconds: float, workers: int, batch_size: int = 32) -> dict[str, Any]:
    """Trains on synthetic images for ``seconds`` and returns what was measured."""
    cuda = torch.cuda.is_available()
    result: dict[str, Any] = {"cuda": cuda, "workers": workers, "batch_size": batch_size}
    if cuda:
        result["device"] = torch.cuda.get_device_name()
        result["pinned_gb_per_s"] = _copy_rate(True)
        result["pageable_gb_per_s"] = _copy_rate(False)
        weights = torch.randn(4096, 4096, device="cuda")
    loader = DataLoader(
        _Images(), batch_size=batch_size, num_workers=workers, pin_memory=cuda, shuffle=False
    )
    no_gpu: contextlib.AbstractContextManager[list[tuple[float, float]]]
    no_gpu = contextlib.nullcontext([])
    steps = 0
    began = time.monotonic()
    with gpu_utilisation(torch.cuda.current_device(), 0.2) if cuda else no_gpu as util:
        try:
            for batch in loader:
                if cuda:
                    x = batch.to("cuda", non_blocking=True).view(batch_size, -1)[:, :4096]
                    for _ in range(8):  # about a loader's batch time of GPU work on a fast GPU
                        x = torch.tanh(x @ weights)
                    torch.cuda.synchronize()
                else:
                    time.sleep(0.01)
                steps += 1
                if time.monotonic() - began >= seconds:
                    break
            stats = loader.stats()
        finally:
            del loader
    elapsed = time.monotonic() - began
    result.update(
        steps=steps,
        seconds=elapsed,
        samples_per_second=steps * batch_size / elapsed,
        data_wait_share=stats.wait_total_seconds / elapsed,
        recent_idle_share=stats.idle_share,
    )
    if util:
        result["gpu_utilization"] = sum(u for _, u in util) / len(util)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dloader.apps.probe", description=__doc__)
    p.add_argument("--seconds", type=finite, default=20.0, help="how long to train (default 20)")
    p.add_argument("--workers", type=int, default=4, help="loader workers (default 4)")
    args = p.parse_args(argv)
    if not (0 < args.seconds <= 600) or not (0 <= args.workers <= 64):
        p.error("--seconds must be within (0, 600] and --workers within [0, 64]")
    print(json.dumps(probe(args.seconds, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
