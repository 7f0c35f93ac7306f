"""Shared helpers for the benchmarks: machine description, tables, the output folder
(``--out-dir``), matplotlib, RSS sampling."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

OUT_DIR = Path(__file__).resolve().parent / "out"


def machine() -> str:
    """One line describing where the benchmark ran (these machines are shared and noisy)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu}; {len(os.sched_getaffinity(0))} cores usable; {mem:.0f} GiB RAM; "
        f"Python {platform.python_version()}; torch {torch.__version__}; {platform.system()} "
        f"{platform.release()}"
    )


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (pastes into issue notes as is)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    return "\n".join(lines)


def add_out_dir(parser: argparse.ArgumentParser) -> None:
    """The one output option every benchmark takes: ``--out-dir`` (default benchmarks/out/)."""
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=OUT_DIR,
        help="where the JSON and the PNG go (default: benchmarks/out)",
    )


def outputs(folder: Path) -> Callable[[str], Path]:
    """A benchmark's output files: ``name`` under ``folder`` (its ``--out-dir``, created now)."""
    folder.mkdir(parents=True, exist_ok=True)
    return lambda name: folder / name


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no screen on these machines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class RssSampler:
    """Samples the RSS of this process plus its children every ``interval`` s; keeps the peak.

    Forked workers share pages with the parent, so the sum over-counts shared memory the same
    way for every loader compared.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # a worker exited meanwhile
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
