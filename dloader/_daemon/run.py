"""A daemon's life: its entry point and its stop signals."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from dloader._daemon.server import Serving
from dloader._shared.cli import LOG_LEVELS
from dloader._shared.env import default_socket, default_state_dir, tracemalloc_dir
from dloader.errors import DLoaderError

__all__ = ["add_daemon_arguments", "run_daemon", "shut_down", "stop_on_signals"]


def add_daemon_arguments(
    p: argparse.ArgumentParser, *, socket_name: str, state_file: str, token_env: str
) -> None:
    """The flags every daemon has: where it listens, its state, TCP with token and TLS, logs."""
    p.add_argument(
        "--socket",
        default=default_socket(socket_name),
        help="Unix socket to listen on, mode 0660 (default: %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        default=default_state_dir(),
        help=f"folder for {state_file} (default: %(default)s)",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", default=None, help="also listen on TCP (needs --token)"
    )
    p.add_argument(
        "--token",
        default=None,
        help="the operator's bearer token on TCP, as itself or @FILE (the local operator on "
        f"the Unix socket needs none; default: ${token_env})",
    )
    p.add_argument("--tls-cert", default=None, help="TLS certificate (PEM) for TCP")
    p.add_argument("--tls-key", default=None, help="TLS private key (PEM) for TCP")
    p.add_argument(
        "--tls-client-ca",
        default=None,
        help="mutual TLS on TCP: clients must show a certificate this CA (PEM) signed; each is "
        "then one caller, named by its certificate's common name (per-caller caps and job "
        "ownership as by uid on the Unix socket; see SECURITY.md). Needs --tls-cert/--tls-key",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=LOG_LEVELS,
        type=str.upper,
        help="(default: %(default)s)",
    )


async def shut_down(serving: Serving, tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Stops serving (in-flight calls get a grace period), then cancels the daemon's tasks."""
    await serving.stop()
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """``stop`` (or a new event), set on SIGTERM or SIGINT; call from the running loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


HEAP_EVERY_S = 30.0


def trace_heap(path: Path, every_s: float = HEAP_EVERY_S, top: int = 15) -> None:
    """Traces the Python heap (tracemalloc) and appends a line to ``path`` every ``every_s``:
    seconds since start, bytes traced and their peak, and the ``top`` allocation sites by size
    (``DLOADER_TRACEMALLOC``: for soak runs; tracing slows allocation down)."""
    tracemalloc.start(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()

    def write() -> None:
        while True:
            time.sleep(every_s)
            traced, peak = tracemalloc.get_traced_memory()
            stats = tracemalloc.take_snapshot().statistics("lineno")[:top]
            sites = [[str(s.traceback[0]), s.size, s.count] for s in stats]
            line = {"t": time.monotonic() - began, "traced": traced, "peak": peak, "top": sites}
            with path.open("a") as f:
                f.write(json.dumps(line) + "\n")

    threading.Thread(target=write, name="dloader-heap-trace", daemon=True).start()


def run_daemon(
    prog: str,
    serve: Callable[[Any], Coroutine[Any, Any, None]],
    config: Any,
    log_level: str,
) -> int:
    """Runs a daemon's ``serve(config)`` with logging set up; a bad setting exits 2 with its
    message (no traceback)."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        folder = tracemalloc_dir()
        if folder is not None:
            trace_heap(folder / f"{prog}-{os.getpid()}.jsonl")
        asyncio.run(serve(config))
    except (ValueError, DLoaderError, OSError) as exc:  # bad settings, paths or files
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0
