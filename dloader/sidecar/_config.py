"""Defaults of the sidecar and its client, and the environment variables they read.

``DLOADER_SIDECAR``
    Where a ``dloader.DataLoader`` finds the sidecar: ``unix:///path/to.sock`` or ``host:port``.
``DLOADER_SIDECAR_TOKEN``
    The bearer token for TCP (the daemon's ``--token`` and the clients').
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_socket", "default_state_dir"]


def default_socket(name: str = "sidecar.sock") -> str:
    """``$XDG_RUNTIME_DIR/dloader/<name>``, else ``/tmp/dloader-<uid>/<name>``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return str(Path(runtime) / "dloader" / name)
    return f"/tmp/dloader-{os.getuid()}/{name}"


def default_state_dir() -> str:
    """``$XDG_STATE_HOME/dloader``, else ``~/.local/state/dloader``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "dloader")
