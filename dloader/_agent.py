"""The sidecar agent: a background thread that connects a loader to the node sidecar.

It registers the job, streams the loader's telemetry (one report per second), and applies the
sidecar's directives (worker count, batch size, CPU set) through the loader's own thread-safe
knobs. The gRPC connection itself lives in a helper process (:mod:`dloader._agent_proc`),
because gRPC does not survive the ``fork()`` that starts loader workers (they crashed with
SIGSEGV in tests). Training never waits for the agent: if the sidecar is absent or dies, the
loader keeps its last configuration and the agent reconnects with exponential backoff (resuming
the same job after a sidecar restart, or registering again if the sidecar forgot it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dloader._config import env_float
from dloader._iter import PROCESS_START_LOCK

if TYPE_CHECKING:
    from dloader._loader import DataLoader

__all__ = ["SidecarAgent", "parse_target"]


log = logging.getLogger(__name__)

REPORT_INTERVAL_S = env_float("DLOADER_REPORT_INTERVAL_S", 1.0)
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0


def parse_target(target: str) -> str:
    """A gRPC target from ``unix:///path``, ``unix:/path``, a bare socket path or ``host:port``.

    Raises:
        ValueError: an empty or malformed target.
    """
    t = target.strip()
    if not t:
        raise ValueError("sidecar target is empty; expected unix:///path/to.sock or host:port")
    if t.startswith("unix:"):
        path = t[len("unix:") :].lstrip("/")
        if not path:
            raise ValueError(f"sidecar target {target!r} has no socket path")
        return f"unix:///{path}"
    if t.startswith("/"):
        return f"unix://{t}"
    host, sep, port = t.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"sidecar target {target!r} is neither unix:///path nor host:port")
    return t


class SidecarAgent:
    """Connects one :class:`dloader.DataLoader` to the node sidecar at ``target``.

    The gRPC client runs in a helper process (:mod:`dloader._agent_proc`): gRPC does not survive
    ``fork()``, and DataLoader workers are forked from this process. This thread only sends the
    loader's stats to the helper once a second and applies the directives it passes back.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        target: str,
        *,
        name: str | None = None,
        token: str | None = None,
    ) -> None:
        self.target = parse_target(target)
        self.name = (
            name
            or os.environ.get("DLOADER_JOB_NAME")
            or (f"{os.path.basename(sys.argv[0]) or 'python'}-{os.getpid()}")
        )
        self._token = token if token is not None else os.environ.get("DLOADER_SIDECAR_TOKEN")
        self._loader_ref = weakref.ref(loader)  # the agent must not keep the loader alive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dloader-sidecar-agent", daemon=True)
        self._proc: subprocess.Popen[str] | None = None
        self.job_id: str | None = None
        self._cpus: list[int] = []
        self.connected = threading.Event()
        self.last_error: str | None = None

    def start(self) -> None:
        """Starts the background thread (idempotent)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stops reporting; the helper deregisters the job and exits."""
        self._stop.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the loop

    def _hello(self, loader: DataLoader[Any]) -> dict[str, Any]:
        low, high = loader.batch_size_range or (0, 0)
        return {
            "op": "hello",
            "target": self.target,
            "token": self._token,
            "name": self.name,
            "pid": os.getpid(),
            "num_workers": loader.num_workers,
            "batch_size": loader.batch_size or 1,
            "limits": {
                "min_workers": loader.min_workers,
                "max_workers": loader.max_workers or 0,
                "min_batch_size": low,
                "max_batch_size": high,
                "may_change_batch_size": loader.batch_size_range is not None,
            },
        }

    def _spawn(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[1])  # so that a source checkout works too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        # close_fds=False lets CPython use posix_spawn (no exec-status pipe to wait on); the
        # lock keeps loader workers from being forked in the middle (see PROCESS_START_LOCK).
        with PROCESS_START_LOCK:
            return subprocess.Popen(
                [sys.executable, "-m", "dloader._agent_proc"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=env,
                close_fds=False,
            )

    def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._stop.is_set():
            loader = self._loader_ref()
            if loader is None:
                break
            try:
                proc = self._proc = self._spawn()
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(self._hello(loader)) + "\n")
                del loader
                reader = threading.Thread(
                    target=self._read, args=(proc,), daemon=True, name="dloader-sidecar-directives"
                )
                reader.start()
                self._report_until_done(proc)
                backoff = BACKOFF_MIN_S
            except OSError as exc:
                self._note_error(f"agent helper failed: {exc}")
            finally:
                self.connected.clear()
                self._close_helper()
            if self._stop.wait(backoff):
                break
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _report_until_done(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        while not self._stop.is_set() and proc.poll() is None:
            loader = self._loader_ref()
            if loader is None:
                self._stop.set()
                return
            s = loader.stats()
            del loader
            self._enforce_cpus(s.workers)
            report = {
                "op": "report",
                "timestamp": time.time(),
                "num_workers": s.num_workers,
                "batch_size": s.batch_size or 1,
                "samples_per_second": s.samples_per_s,
                "idle_share": s.idle_share,
                "step_seconds": s.step_s,
                "wait_seconds": s.wait_s,
                "window_seconds": s.window_s,
                "samples": s.samples,
                "workers": [
                    {
                        "pid": w.pid or 0,
                        "fetch_seconds": w.fetch_s,
                        "cpu_seconds": w.cpu_s,
                        "batches": w.batches,
                    }
                    for w in s.workers
                ],
            }
            try:
                proc.stdin.write(json.dumps(report) + "\n")
            except (BrokenPipeError, ValueError):
                return
            self._stop.wait(REPORT_INTERVAL_S)

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("op") == "status":
                self.job_id = msg.get("job_id") or self.job_id
                if msg.get("connected"):
                    self.connected.set()
                    if self.last_error:
                        log.info(
                            "dloader: connected to sidecar %s as job %s", self.target, self.job_id
                        )
                    self.last_error = None
                else:
                    self.connected.clear()
                    self._note_error(str(msg.get("error")))
            elif msg.get("op") == "directive":
                self._apply(msg)
        self.connected.clear()

    def _note_error(self, message: str) -> None:
        if message != self.last_error:
            log.warning(
                "dloader sidecar %s: %s; training continues with the last configuration, retrying",
                self.target,
                message,
            )
            self.last_error = message

    def _close_helper(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()  # the helper deregisters and exits
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _apply(self, d: dict[str, Any]) -> None:
        loader = self._loader_ref()
        if loader is None:
            self._stop.set()
            return
        try:
            if d["num_workers"] != loader.num_workers:
                loader.resize(d["num_workers"])
            if (
                d["batch_size"]
                and loader.batch_size_range is not None
                and (d["batch_size"] != loader.batch_size)
            ):
                if _data_parallel():  # ranks switch together, at a step they agree on
                    loader.staged_batch_size = d["batch_size"]
                else:
                    loader.set_batch_size(d["batch_size"])
            self._cpus = list(d["cpus"])
            log.info(
                "dloader: sidecar directive %d applied: %d workers (%s)",
                d["revision"],
                d["num_workers"],
                d["reason"],
            )
        except (ValueError, TypeError) as exc:
            log.warning("dloader: sidecar directive %s refused: %s", d, exc)

    def _enforce_cpus(self, workers: Any) -> None:
        if not self._cpus:
            return
        for w in workers:
            if w.pid:
                with contextlib.suppress(OSError):  # exited meanwhile, or not permitted
                    os.sched_setaffinity(w.pid, self._cpus)


def _data_parallel() -> bool:
    """Whether this process is one of several ranks of a torch.distributed job."""
    from dloader.elastic import _dist  # imported here: torch.distributed only when needed

    return _dist()[1] > 1
