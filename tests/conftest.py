"""The test lanes, by rule.

* **unit**: no real process, no server. A test that starts one (``subprocess``,
  ``multiprocessing``, ``os.fork``, a gRPC server) without the ``integration`` mark fails,
  naming what it started: the lanes cannot drift from what ``scripts/test --unit`` promises.
* **integration**: real processes and servers. Marked by hand where a test starts processes
  (``pytestmark = pytest.mark.integration``), and by rule for every test of a module that
  touches gRPC (imports ``grpc`` or ``tests._daemon``, itself or through a fixture): those
  also run in a forked child of their own (the ``isolated`` mark, :func:`_run_isolated`).
* **slow**: excluded from the default run (``scripts/test --slow``).

Why gRPC tests run in a child: gRPC's threads stay alive after a server or channel closes, and a
process that forks while they run ("Other threads are currently calling into gRPC, skipping
fork() handlers") can hand its children a lock held by one of them, so a loader worker forked
later from the same process may hang. In a child of its own, a gRPC test leaves the pytest
process without gRPC threads, so the loader tests, which fork workers from it, are safe whatever
the order (``scripts/test --random-order`` proves it). Real trainers hold no gRPC state: the
agent's client runs in a helper process.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import pickle
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc
import grpc.aio
import pytest

_TALKS_GRPC: dict[str, bool] = {}


def _talks_grpc(module: ModuleType | None) -> bool:
    """Whether a module uses gRPC: it references ``grpc``, or something (a module, a class, a
    function) from a module of ``tests`` or ``dloader`` that does, followed transitively. So a
    test that calls ``dloaderctl``'s ``main`` in-process, or hosts a daemon through a helper
    class, counts, while the library (which keeps gRPC out of the training process) does not."""
    if module is None or module.__name__ == __name__:  # this file imports grpc to guard it
        return False
    name = module.__name__
    if name in _TALKS_GRPC:
        return _TALKS_GRPC[name]
    _TALKS_GRPC[name] = False  # an import cycle reads "not (yet)"
    found = False
    for value in list(vars(module).values()):
        if isinstance(value, ModuleType):
            # a package's namespace holds whatever of its submodules anyone imported: those
            # are not what the package's own code uses
            own = value.__name__.startswith(name + ".")
            other: ModuleType | None = None if own else value
        else:
            try:
                owner = value.__module__ if isinstance(value, type | Callable) else None
            except Exception:
                owner = None
            other = sys.modules.get(owner) if isinstance(owner, str) else None
        if other is None or other is module:
            continue
        top = other.__name__.split(".")[0]
        if top == "grpc" or (top in ("tests", "dloader") and _talks_grpc(other)):
            found = True
            break
    _TALKS_GRPC[name] = found
    return found


def _fixture_modules(item: pytest.Item) -> Iterator[ModuleType | None]:
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for d in defs:
            yield sys.modules.get(getattr(d.func, "__module__", ""))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Builds matplotlib's font cache before any test runs. On a fresh machine its first import
    runs ``fc-list`` in a subprocess, which the unit lane's guard would refuse in whichever unit
    test happens to plot first (so the lane passed or failed by test order and cache state)."""
    with contextlib.suppress(ImportError):  # plots are optional (the ``bench`` extra)
        import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        here = getattr(item, "module", None)
        if _talks_grpc(here) or any(_talks_grpc(m) for m in _fixture_modules(item)):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.isolated)


#: What a unit test may not start: (owner, attribute, what it is).
_STARTERS: list[tuple[Any, str, str]] = [
    (subprocess.Popen, "__init__", "a subprocess"),
    (multiprocessing.process.BaseProcess, "start", "a multiprocessing process"),
    (os, "fork", "a forked process"),
    (grpc, "server", "a gRPC server"),
    (grpc.aio, "server", "a gRPC server"),
]


@pytest.fixture(autouse=True)
def _unit_tests_start_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("integration") is not None:
        yield
        return
    started: list[str] = []
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in _STARTERS]

    def refuse(what: str) -> Callable[..., Any]:
        def starter(*args: Any, **kwargs: Any) -> Any:
            started.append(what)
            raise RuntimeError(f"a unit test started {what}: mark it pytest.mark.integration")

        return starter

    for owner, attr, what in _STARTERS:
        setattr(owner, attr, refuse(what))
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)
    call = getattr(request.node, "_lane_call", None)
    if started and (call is None or call.passed):  # a test that swallowed the refusal
        pytest.fail(
            f"{request.node.nodeid} is not marked integration but started "
            f"{', '.join(sorted(set(started)))}: mark it pytest.mark.integration "
            "(tests/conftest.py says why)",
            pytrace=False,
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Runs an ``isolated`` test in a forked child; the parent logs the child's reports."""
    if item.get_closest_marker("isolated") is None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run_isolated(item, nextitem):
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _fresh_forkserver() -> None:
    """In a forked child: forget the parent's multiprocessing forkserver (not this process's
    child: waiting for it fails with ECHILD); the first forkserver process starts a new one."""
    import multiprocessing.forkserver as fs

    fresh = fs.ForkServer()
    fs._forkserver = fresh
    for name in ("ensure_running", "get_inherited_fds", "connect_to_new_process"):
        setattr(fs, name, getattr(fresh, name))
    fs.set_forkserver_preload = fresh.set_forkserver_preload


def _run_isolated(item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
    """Setup, call and teardown of ``item`` in a forked child, its reports sent back through a
    pipe as pytest serialises them for xdist. A child that dies gives a failed report."""
    from _pytest.runner import runtestprotocol

    config = item.config
    # the parent keeps pytest's setup stack as runtestprotocol would: what the previous item set
    # up and this one does not share is torn down here, before the fork (the child sets up and
    # tears down its own), and again after, for the next item
    state = item.session._setupstate
    state.teardown_exact(item)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, send the reports, exit without running the parent's atexit
        os.close(read_end)
        os.setpgid(0, 0)  # its own process group: a timeout kills it with what it started
        _fresh_forkserver()
        code = 0
        try:
            reports = runtestprotocol(item, log=False, nextitem=None)
            payload = [
                config.hook.pytest_report_to_serializable(config=config, report=r) for r in reports
            ]
            data = pickle.dumps(("ok", payload))
        except BaseException:
            data, code = pickle.dumps(("error", traceback.format_exc())), 1
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
        os._exit(code)
    os.close(write_end)
    # pytest-timeout armed its alarm for this test in this process, where the test does not
    # run: it would fail the wait below and leave the child running. The limit is kept here.
    signal.setitimer(signal.ITIMER_REAL, 0)
    limit = _timeout_s(item)
    data, timed_out = _read_until(read_end, None if limit is None else time.monotonic() + limit)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    state.teardown_exact(nextitem)
    if timed_out:
        why = (
            f"timed out after {limit:g} s (pytest-timeout's limit): the isolated child and the "
            "processes it started were killed"
        )
    elif data:
        kind, payload = pickle.loads(data)
        if kind == "ok":
            return [
                config.hook.pytest_report_from_serializable(config=config, data=d) for d in payload
            ]
        why = f"the isolated child failed:\n{payload}"
    else:
        why = f"the isolated child died ({_status(status)}) before reporting"
    return [
        pytest.TestReport(
            item.nodeid, item.location, dict.fromkeys(item.keywords, 1), "failed", why, "call"
        )
    ]


def _timeout_s(item: pytest.Item) -> float | None:
    """The test's pytest-timeout limit (its ``timeout`` mark, else the configured one). In a
    forked child pytest-timeout's alarm does not reach the test: the parent enforces it."""
    marker = item.get_closest_marker("timeout")
    value = marker.args[0] if marker is not None and marker.args else item.config.getini("timeout")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _read_until(fd: int, deadline: float | None) -> tuple[bytes, bool]:
    """Everything from ``fd`` until its end, or until ``deadline``: (data, timed out)."""
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as src:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return b"".join(chunks), True
            ready, _, _ = select.select([src], [], [], left)
            if not ready:
                continue
            chunk = src.read(1 << 16)
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item._lane_call = report  # type: ignore[attr-defined]
    return report


def pytest_report_header() -> str:
    return "lanes: unit (starts nothing), integration (gRPC tests isolated in forked children)"
