"""The sidecar agent: a background thread that connects a loader to the node sidecar.

It registers the job when the loader is created (its helper process takes a second to start on
a busy node: started then, it is ready by the first batch), streams the loader's telemetry (one
report per second; four a second for the first three seconds after its first batch), and
applies the sidecar's directives (worker count, batch size, CPU set) through the loader's own
thread-safe knobs. The gRPC connection itself lives in a helper process
(:mod:`dloader._agent.helper`), because gRPC does not survive the ``fork()`` that starts loader
workers (they crashed with SIGSEGV in tests). Training never waits for the agent: if the
sidecar is absent or dies, the loader keeps its last configuration and the agent reconnects with
exponential backoff (resuming the same job after a sidecar restart, or registering again if the
sidecar forgot it). A process forked from the loader's runs an agent of its own when it
iterates (a job of its own).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dloader._engine.control import ControlLimits, LoaderControls
from dloader._engine.processes import PROCESS_START_LOCK
from dloader._engine.telemetry import LoaderStats
from dloader._shared import env
from dloader._shared.client import Backoff, Endpoint
from dloader._shared.node_messages import Directive, JobLimits, JobReport, Registration

__all__ = ["SidecarAgent"]


log = logging.getLogger(__name__)

EARLY_REPORTS = 12
"""Reports sent at ``EARLY_INTERVAL_S`` from the loader's first batch (then one per report
interval): the sidecar places a job from its first half second of batches."""
EARLY_INTERVAL_S = 0.25


class SidecarAgent:
    """Connects one :class:`dloader.DataLoader` to the node sidecar at ``target``.

    The gRPC client runs in a helper process (:mod:`dloader._agent.helper`): gRPC does not survive
    ``fork()``, and DataLoader workers are forked from this process. This thread only sends the
    loader's stats to the helper once a second and applies the directives it passes back.
    """

    def __init__(
        self,
        controls: LoaderControls,
        target: str,
        *,
        name: str | None = None,
        token: str | None = None,
    ) -> None:
        try:
            self.endpoint = Endpoint.of(target, token if token is not None else env.sidecar_token())
        except ValueError as exc:
            raise ValueError(f"sidecar {exc}") from None
        self.target = self.endpoint.target
        self.name = (
            name or env.job_name() or (f"{os.path.basename(sys.argv[0]) or 'python'}-{os.getpid()}")
        )
        self._report_interval_s = env.report_interval_s()
        self._job_key = env.job_key()  # a bad value is an error here, at the loader's start
        self._controls = controls  # they hold the loader weakly: the agent never keeps it alive
        self._stop = threading.Event()
        self._thread = self._new_thread()
        self._proc: subprocess.Popen[str] | None = None
        self.job_id: str | None = None
        self._cpus: list[int] = []
        self._nice: int | None = None
        self.connected = threading.Event()
        self.last_error: str | None = None

    def _new_thread(self) -> threading.Thread:
        self._pid = os.getpid()
        return threading.Thread(target=self._run, name="dloader-sidecar-agent", daemon=True)

    def start(self) -> None:
        """Starts the background thread (idempotent). In a process forked from the one that
        started it, a fresh thread with its own helper: a job per process, as registered."""
        if self._pid != os.getpid():
            self._proc, self.job_id = None, None  # the parent's helper and job
            self.connected.clear()
            self._thread = self._new_thread()
        if self._thread.ident is None and not self._stop.is_set():  # never started
            self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        """Stops reporting; the helper deregisters the job and exits (waits up to ``timeout``
        seconds for that)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the loop

    def _hello(self, s: LoaderStats, limits: ControlLimits) -> dict[str, Any]:
        low, high = limits.batch_size_range or (0, 0)
        registration = Registration(
            name=self.name,
            pids=(os.getpid(),),
            num_workers=s.num_workers,
            batch_size=s.batch_size or 1,
            limits=JobLimits(
                min_workers=limits.min_workers,
                max_workers=limits.max_workers,
                min_batch_size=low,
                max_batch_size=high,
                may_change_batch_size=limits.batch_size_range is not None,
                max_remote_workers=limits.max_remote_workers,
            ),
            job_key=self._job_key,
        )
        e = self.endpoint
        return {
            "op": "hello",
            "endpoint": {"target": e.target, "token": e.token, "tls_ca": e.tls_ca},
            "registration": registration.to_json(),
        }

    def _spawn(self) -> subprocess.Popen[str]:
        environ = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])  # so that a source checkout works too
        environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, environ.get("PYTHONPATH")) if p)
        # close_fds=False lets CPython use posix_spawn (no exec-status pipe to wait on); the
        # lock keeps loader workers from being forked in the middle (see PROCESS_START_LOCK).
        with PROCESS_START_LOCK:
            return subprocess.Popen(
                [sys.executable, "-m", "dloader._agent.helper"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=environ,
                close_fds=False,
            )

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            s, limits = self._controls.stats(), self._controls.limits()
            if s is None or limits is None:
                break  # the loader is gone
            try:
                proc = self._proc = self._spawn()
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(self._hello(s, limits)) + "\n")
                reader = threading.Thread(
                    target=self._read, args=(proc,), daemon=True, name="dloader-sidecar-directives"
                )
                reader.start()
                self._report_until_done(proc)
                backoff.reset()
            except OSError as exc:
                self._note_error(f"agent helper failed: {exc}")
            finally:
                self.connected.clear()
                self._close_helper()
            if self._stop.wait(backoff.next()):
                break

    def _report_until_done(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        early = 0  # reports sent since the loader's first batch
        sent_at = -math.inf
        while not self._stop.is_set() and proc.poll() is None:
            s = self._controls.stats()
            if s is None:  # the loader is gone
                self._stop.set()
                return
            self._enforce_cpus(s.workers)
            self._enforce_nice(s.workers)
            # Four reports a second from the first batch: the sidecar places a job from its
            # first half second of batches. Before it (the job still setting up), one report
            # per interval says it is alive, and the loop looks for that batch as often.
            waiting = s.batches == 0
            now = time.monotonic()
            if not waiting or now - sent_at >= self._report_interval_s:
                report = JobReport.from_stats(s, time.time())
                try:
                    proc.stdin.write(
                        json.dumps({"op": "report", "report": report.to_json()}) + "\n"
                    )
                except (BrokenPipeError, ValueError):
                    return
                sent_at, early = now, early + (not waiting)
            self._stop.wait(
                min(self._report_interval_s, EARLY_INTERVAL_S)
                if waiting or early <= EARLY_REPORTS
                else self._report_interval_s
            )

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
                try:
                    directive = Directive.from_json(msg["directive"])
                except (ValueError, TypeError, KeyError) as exc:
                    log.warning("dloader: sidecar directive %s refused: %s", msg, exc)
                    continue
                self._apply(directive)
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

    def _apply(self, d: Directive) -> None:
        try:
            tuning = self._controls.tune(d.tune_up_to)
            if not tuning and not self._controls.resize(d.num_workers):
                self._stop.set()  # the loader is gone
                return
            if d.batch_size:
                self._controls.set_batch_size(d.batch_size)
            if d.remote_workers is not None:
                self._controls.resize_remote({"": d.remote_workers, **dict(d.remote_lent)})
            self._cpus = list(d.cpus)
            if d.worker_nice is not None:
                self._nice = d.worker_nice
            log.info(
                "dloader: sidecar directive %d applied: %s (%s)",
                d.revision,
                f"tuning itself up to {d.tune_up_to} workers"
                if tuning
                else f"{d.num_workers} workers",
                d.reason,
            )
        except (ValueError, TypeError) as exc:
            log.warning("dloader: sidecar directive %s refused: %s", d, exc)

    def _enforce_cpus(self, workers: Any) -> None:
        # Only within the job's own allocation (a Slurm or Kubernetes CPU set): CPUs the
        # trainer may not use are dropped; if none is left, the workers keep theirs.
        cpus = set(self._cpus) & os.sched_getaffinity(0)
        if not cpus:
            return
        for w in workers:
            if w.pid and not w.remote:  # a remote worker's pid is another machine's
                with contextlib.suppress(OSError):  # exited meanwhile, or not permitted
                    os.sched_setaffinity(w.pid, cpus)

    def _enforce_nice(self, workers: Any) -> None:
        # Raises each local worker's threads to the directed nice value (never lowers one: an
        # unprivileged process may not); a worker started since the last report gets it here.
        if self._nice is None:
            return
        for w in workers:
            if w.pid and not w.remote:
                raise_nice(w.pid, self._nice)


def raise_nice(pid: int, nice: int) -> None:
    """Raises every thread of process ``pid`` to at least ``nice`` (a thread or process that
    exited meanwhile, or that this user may not change, is skipped)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
