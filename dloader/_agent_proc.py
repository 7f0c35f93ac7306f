"""The sidecar agent's network half, in its own process: ``python -m dloader._agent_proc``.

gRPC must not run in a process that forks (its threads and locks do not survive ``fork()``:
forked DataLoader workers crash), so the training process holds no gRPC state at all. This
helper holds it: it registers the job, streams the reports it receives on stdin, and writes the
sidecar's directives to stdout. One JSON object per line both ways:

* stdin: ``{"op": "hello", "target", "token", "name", "pid", "limits", "num_workers",
  "batch_size"}`` first, then ``{"op": "report", ...}`` about once a second;
* stdout: ``{"op": "status", "connected", "job_id", "error"}`` on every change of connection,
  ``{"op": "directive", "num_workers", "batch_size", "cpus", "reason", "revision"}``.

It exits when stdin closes (the training process is gone), deregistering first.
"""

from __future__ import annotations

import contextlib
import json
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from dloader.v1 import node_pb2 as pb
from dloader.v1 import node_pb2_grpc as pb_grpc

BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 30.0
RPC_TIMEOUT_S = 5.0
REPORT_WAIT_S = 5.0  # a session with no report for this long is kept alive by the last one


class Helper:
    def __init__(self, hello: dict[str, Any]) -> None:
        self.hello = hello
        self.target = hello["target"]
        self.md = [("authorization", f"Bearer {hello['token']}")] if hello.get("token") else []
        self.reports: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=100)
        self.stop = threading.Event()
        self.job_id: str | None = None
        self.job_token: str | None = None
        self.out_lock = threading.Lock()
        self.last_status: tuple[bool, str | None, str | None] | None = None

    def emit(self, msg: dict[str, Any]) -> None:
        with self.out_lock:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

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
                    self.reports.put_nowait(msg)
        self.stop.set()
        with contextlib.suppress(queue.Full):
            self.reports.put_nowait(None)

    def run(self) -> None:
        threading.Thread(target=self.read_stdin, daemon=True).start()
        backoff = BACKOFF_MIN_S
        while not self.stop.is_set():
            channel = grpc.insecure_channel(self.target)
            try:
                self.session(pb_grpc.NodeServiceStub(channel))
                backoff = BACKOFF_MIN_S
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    self.job_id = self.job_token = None  # forgotten by the sidecar: register again
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                self.status(False, f"{code.name if code else 'ERROR'}: {detail}")
            finally:
                channel.close()
            if self.stop.wait(backoff):
                break
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        self.deregister()

    def session(self, stub: pb_grpc.NodeServiceStub) -> None:
        h = self.hello
        if self.job_id is None:
            lim = h["limits"]
            resp = stub.RegisterJob(
                pb.RegisterJobRequest(
                    name=h["name"],
                    limits=pb.JobLimits(**lim),
                    pids=[h["pid"]],
                    num_workers=h["num_workers"],
                    batch_size=h["batch_size"],
                ),
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
        last: dict[str, Any] | None = None
        while not self.stop.is_set() and not over.is_set():
            try:
                msg = self.reports.get(timeout=REPORT_WAIT_S)
            except queue.Empty:
                msg = last
            if msg is None:
                return
            last = msg
            yield pb.JobReport(
                job_id=self.job_id,
                token=self.job_token,
                timestamp=msg["timestamp"],
                num_workers=msg["num_workers"],
                batch_size=msg["batch_size"],
                samples_per_second=msg["samples_per_second"],
                idle_share=msg["idle_share"],
                step_seconds=msg["step_seconds"],
                wait_seconds=msg["wait_seconds"],
                window_seconds=msg["window_seconds"],
                samples=msg["samples"],
                workers=[pb.WorkerReport(**w) for w in msg["workers"]],
            )

    def watch(self, watch: Any, over: threading.Event) -> None:
        try:
            for d in watch:
                self.emit(
                    {
                        "op": "directive",
                        "num_workers": d.num_workers,
                        "batch_size": d.batch_size,
                        "cpus": list(d.cpus),
                        "reason": d.reason,
                        "revision": d.revision,
                    }
                )
        except grpc.RpcError:
            pass  # cancelled, or the sidecar went away: the session ends
        finally:
            over.set()

    def deregister(self) -> None:
        if self.job_id is None:
            return
        with grpc.insecure_channel(self.target) as channel, contextlib.suppress(grpc.RpcError):
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
    Helper(hello).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
