"""The sidecar agent's network half, in its own process: ``python -m dloader._agent.helper``.

gRPC must not run in a process that forks (its threads and locks do not survive ``fork()``:
forked DataLoader workers crash), so the training process holds no gRPC state at all. This
helper holds it: it registers the job, streams the reports it receives on stdin, and writes the
sidecar's directives to stdout. One JSON object per line both ways:

* stdin: ``{"op": "hello", "endpoint": {"target", "token", "tls_ca"}, "registration": ...}``
  first, then ``{"op": "report", "report": ...}`` about once a second;
* stdout: ``{"op": "status", "connected", "job_id", "error"}`` on every change of connection,
  ``{"op": "directive", "directive": ...}``.

The payloads are :mod:`dloader._shared.node_messages` dataclasses in their JSON form.

It exits when stdin closes (the training process is gone), deregistering first.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from dloader._shared.client import Backoff, Endpoint
from dloader._shared.node_messages import Directive, JobReport, Registration
from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

RPC_TIMEOUT_S = 5.0
REPORT_WAIT_S = 5.0  # a session with no report for this long is kept alive by the last one


class Helper:
    def __init__(self, endpoint: Endpoint, registration: Registration) -> None:
        self.endpoint = endpoint
        self.registration = registration
        self.md = endpoint.metadata
        self.reports: queue.Queue[JobReport | None] = queue.Queue(maxsize=100)
        self.stop = threading.Event()
        self.job_id: str | None = None
        self.job_token: str | None = None
        self.out_lock = threading.Lock()
        self.last_status: tuple[bool, str | None, str | None] | None = None

    def emit(self, msg: dict[str, Any]) -> None:
        with self.out_lock:
            try:
                sys.stdout.write(json.dumps(msg) + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):  # the agent is gone: deregister and exit
                self.stop.set()
                # what is left in the buffer goes nowhere, not into a traceback at exit
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def status(self, connected: bool, error: str | None = None) -> None:
        key = (connected, self.job_id, error)
        if key != self.last_status:
            self.last_status = key
            self.emit(
                {"op": "status", "connected": connected, "job_id": self.job_id, "error": error}
            )

    def read_stdin(self) -> None:
        for line in sys.stdin:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("op") == "report":
                with contextlib.suppress(queue.Full):  # drop reports rather than block
                    self.reports.put_nowait(JobReport.from_json(msg["report"]))
        self.stop.set()
        with contextlib.suppress(queue.Full):
            self.reports.put_nowait(None)

    def run(self) -> None:
        threading.Thread(target=self.read_stdin, daemon=True).start()
        backoff = Backoff()
        while not self.stop.is_set():
            channel = self.endpoint.channel()
            try:
                self.session(pb_grpc.NodeServiceStub(channel))
                backoff.reset()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    self.job_id = self.job_token = None  # forgotten by the sidecar: register again
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                self.status(False, f"{code.name if code else 'ERROR'}: {detail}")
            finally:
                channel.close()
            if self.stop.wait(backoff.next()):
                break
        self.deregister()

    def session(self, stub: pb_grpc.NodeServiceStub) -> None:
        if self.job_id is None:
            resp = stub.RegisterJob(
                self.registration.to_pb(),
                timeout=RPC_TIMEOUT_S,
                metadata=self.md,
            )
            self.job_id, self.job_token = resp.job_id, resp.token
        self.status(True)
        over = threading.Event()
        watch = stub.WatchDirectives(
            pb.WatchDirectivesRequest(job_id=self.job_id, token=self.job_token), metadata=self.md
        )
        watcher = threading.Thread(target=self.watch, args=(watch, over), daemon=True)
        watcher.start()
        try:
            stub.Report(self.stream(over), metadata=self.md)
        finally:
            over.set()
            watch.cancel()
            watcher.join(RPC_TIMEOUT_S)

    def stream(self, over: threading.Event) -> Iterator[pb.JobReport]:
        last: JobReport | None = None
        while not self.stop.is_set() and not over.is_set():
            try:
                msg = self.reports.get(timeout=REPORT_WAIT_S)
            except queue.Empty:
                msg = last
            if msg is None:
                return
            last = msg
            yield msg.to_pb(self.job_id or "", self.job_token or "")

    def watch(self, watch: Any, over: threading.Event) -> None:
        try:
            for d in watch:
                try:
                    directive = Directive.from_pb(d)
                except ValueError:
                    continue  # a directive no loader can follow: the last one stands
                self.emit({"op": "directive", "directive": directive.to_json()})
        except grpc.RpcError:
            pass  # cancelled, or the sidecar went away: the session ends
        finally:
            over.set()

    def deregister(self) -> None:
        if self.job_id is None:
            return
        with self.endpoint.channel() as channel, contextlib.suppress(grpc.RpcError):
            pb_grpc.NodeServiceStub(channel).DeregisterJob(
                pb.DeregisterJobRequest(job_id=self.job_id, token=self.job_token),
                timeout=1.0,
                metadata=self.md,
            )


def main() -> int:
    line = sys.stdin.readline()
    if not line:
        return 0
    hello = json.loads(line)
    if hello.get("op") != "hello":
        print(f"dloader agent: expected a hello, got {line!r}", file=sys.stderr)
        return 2
    e = hello["endpoint"]
    Helper(
        Endpoint(e["target"], e.get("token"), e.get("tls_ca")),
        Registration.from_json(hello["registration"]),
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
