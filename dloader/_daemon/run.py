"""A daemon's life: its entry point and its stop signals."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from dloader.errors import DLoaderError

__all__ = ["run_daemon", "stop_on_signals"]


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """``stop`` (or a new event), set on SIGTERM or SIGINT; call from the running loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


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
        asyncio.run(serve(config))
    except (ValueError, DLoaderError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    return 0
