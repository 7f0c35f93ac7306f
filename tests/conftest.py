"""Test order: the loader tests first.

Many tests host a real gRPC server in the pytest process (``tests/_daemon.ThreadedDaemon``).
gRPC's threads stay alive after the server stops, and a process that forks while they run
("Other threads are currently calling into gRPC, skipping fork() handlers") can give its forked
children a lock held by one of them: a loader worker forked from it may hang. Real trainers
hold no gRPC state (the agent's client runs in a helper process), so the loader tests, which
fork workers from the pytest process, run before any test starts a gRPC server in it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_LOADER_TESTS = Path(__file__).resolve().parent / "dloader"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: 0 if _LOADER_TESTS in Path(str(item.fspath)).parents else 1)
