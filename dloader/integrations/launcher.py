"""``dloader-launch``: run a training script under torchrun with as many GPUs as the cluster
allocator gives it, restarting it with a new world size whenever that changes.

    dloader-launch --allocator unix:///run/dloader/allocator.sock --job-id bert-7 \\
        --batch-size 256 --min-batch-size 64 --max-batch-size 1024 --max-gpus 8 \\
        --measurements profile.csv -- train.py --lr 0.1

The launcher submits the job, watches its allocation and runs
``torchrun --standalone --nproc-per-node=K script ...`` with ``K`` the job's GPUs on this node.
When ``K`` changes, it stops torchrun (SIGTERM, then SIGKILL after ``--grace``) and starts it
again with the new ``K``; the script resumes from its last elastic checkpoint
(:func:`dloader.integrations.torchrun.resume`), so no sample is lost or repeated. With ``K = 0`` the
job waits. When the script exits by itself the job is completed (or failed) at the allocator.
Batch-size changes do not restart anything: the node sidecar applies them to the running
loaders (the script's ``dloader.DataLoader(..., job_name=JOB_ID, batch_size_range=...)``).

The script sees ``DLOADER_JOB_NAME`` (the job id), ``DLOADER_ALLOCATED_GPUS`` and
``DLOADER_GLOBAL_BATCH_SIZE`` (the allocation when it was started). One node per launcher: a job
whose allocation spans nodes runs only its share on ``--node-id`` (multi-node rendezvous is not
managed here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from dloader import _env
from dloader._client import Backoff, Endpoint
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["main"]

log = logging.getLogger("dloader.launch")

_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dloader-launch",
        description="Runs a training script under torchrun with as many GPUs as the cluster "
        "allocator gives the job on this node, restarting it with the new process count when "
        "that changes (the script resumes from its elastic checkpoint). Completes the job at "
        "the allocator when the script exits.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # the script's options must never be taken for the launcher's
    )
    p.add_argument(
        "--allocator",
        default=None,
        help="allocator target: unix:///path or host:port (default: $DLOADER_ALLOCATOR)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="bearer token for a TCP allocator (default: $DLOADER_ALLOCATOR_TOKEN)",
    )
    p.add_argument("--job-id", required=True, help="unique job id (also the loaders' job_name)")
    p.add_argument("--node-id", default=socket.gethostname(), help="the node this runs on")
    p.add_argument("--batch-size", type=int, required=True, help="requested global batch size")
    p.add_argument("--min-batch-size", type=int, default=0)
    p.add_argument("--max-batch-size", type=int, default=0)
    p.add_argument("--min-local-batch-size", type=int, default=0)
    p.add_argument("--max-local-batch-size", type=int, default=0, help="what fits on one GPU")
    p.add_argument("--min-gpus", type=int, default=1)
    p.add_argument("--max-gpus", type=int, default=0, help="0: no limit")
    p.add_argument("--priority", type=float, default=1.0)
    p.add_argument("--restart-seconds", type=float, default=0.0, help="0: allocator default")
    p.add_argument(
        "--scaling",
        help="scaling-model parameters as JSON (alpha_c, beta_c, alpha_n, beta_n, alpha_r, "
        "beta_r, gamma), e.g. from dloader.predictor.ScalingModel.to_dict()['params']",
    )
    p.add_argument(
        "--measurements",
        type=Path,
        help="CSV of measured steps: nodes,replicas,local_bsz,step_time[,sync_time]",
    )
    p.add_argument("--grace", type=float, default=30.0, help="seconds torchrun gets to stop")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("script", help="training script (launched by torchrun)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _spec(args: argparse.Namespace) -> pb.JobSpec:
    spec = pb.JobSpec(
        job_id=args.job_id,
        batch_size=args.batch_size,
        min_batch_size=args.min_batch_size,
        max_batch_size=args.max_batch_size,
        min_local_batch_size=args.min_local_batch_size,
        max_local_batch_size=args.max_local_batch_size,
        min_gpus=args.min_gpus,
        max_gpus=args.max_gpus,
        priority=args.priority,
        restart_seconds=args.restart_seconds,
    )
    if args.scaling:
        try:
            spec.scaling.CopyFrom(pb.ScalingParams(**json.loads(args.scaling)))
        except (ValueError, TypeError) as exc:
            raise SystemExit(f"dloader-launch: --scaling {args.scaling!r}: {exc}") from None
    if args.measurements:
        try:
            with args.measurements.open(newline="") as f:
                for row in csv.DictReader(f):
                    spec.measurements.add(
                        nodes=int(row["nodes"]),
                        replicas=int(row["replicas"]),
                        local_batch_size=int(row["local_bsz"]),
                        step_seconds=float(row["step_time"]),
                        sync_seconds=float(row.get("sync_time") or 0.0),
                    )
        except (OSError, KeyError, ValueError) as exc:
            raise SystemExit(
                f"dloader-launch: --measurements {args.measurements}: {exc!r}; expected columns "
                "nodes,replicas,local_bsz,step_time[,sync_time]"
            ) from None
    return spec


class Launcher:
    """Keeps a torchrun process at the job's allocated size."""

    def __init__(self, args: argparse.Namespace, allocator: Endpoint) -> None:
        self.args = args
        self.allocator = allocator
        self.proc: asyncio.subprocess.Process | None = None
        self.gpus = 0
        self.restarts = 0
        self.submitted = False
        self.exit_code: int | None = None
        self._backoff = Backoff()  # its failures: consecutive failed connections
        self.job_token = ""  # the job's credential from SubmitJob (for CompleteJob)
        self._meta = allocator.metadata or None

    async def _start(self, gpus: int, batch: int) -> None:
        a = self.args
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            a.script,
            *[x for x in a.script_args if x != "--"],
        ]
        env = {
            **os.environ,
            "DLOADER_JOB_NAME": a.job_id,
            "DLOADER_ALLOCATED_GPUS": str(gpus),
            "DLOADER_GLOBAL_BATCH_SIZE": str(batch),
        }
        self.proc = await asyncio.create_subprocess_exec(*cmd, env=env, start_new_session=True)
        self.gpus = gpus
        log.info(
            "job %s: started torchrun with %d process(es), global batch %d (pid %d)",
            a.job_id,
            gpus,
            batch,
            self.proc.pid,
        )

    async def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
        try:
            await asyncio.wait_for(proc.wait(), timeout=self.args.grace)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        self.gpus = 0

    async def run(self, stop: asyncio.Event) -> int:
        """Follows the allocation until the script exits (its exit code) or ``stop`` (130).

        If the allocator goes away, the script keeps running on what it has (fail static) and
        the launcher reconnects with backoff; an exit meanwhile is reported once it is back.
        """
        try:
            while True:
                try:
                    async with self.allocator.aio_channel() as channel:
                        stub = pb_grpc.ClusterAllocatorStub(channel)
                        await self._submit(stub)
                        return await self._session(stub, stop)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in _TRANSIENT:
                        raise
                    if self._backoff.failures == 0:
                        log.warning(
                            "job %s: allocator unreachable (%s); keeping %d GPU(s), retrying",
                            self.args.job_id,
                            exc.details(),
                            self.gpus,
                        )
                    if await self._wait_offline(stop, self._backoff.next()):
                        return 130
        finally:
            await self._stop()

    async def _submit(self, stub: pb_grpc.ClusterAllocatorStub) -> None:
        if self.submitted:
            return
        try:
            r = await stub.SubmitJob(
                pb.SubmitJobRequest(job=_spec(self.args)), metadata=self._meta, timeout=30
            )
            self.job_token = r.token
            log.info("job %s submitted (queue position %d)", r.job_id, r.queue_position)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            log.info("job %s already submitted; following its allocation", self.args.job_id)
        self.submitted = True

    async def _wait_offline(self, stop: asyncio.Event, delay: float) -> bool:
        """Waits ``delay`` s while disconnected; True if stopped. Notes the script's exit."""
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(stop.wait())}
        if self.proc is not None:
            waits.add(asyncio.ensure_future(self.proc.wait()))
        _, pending = await asyncio.wait(waits, timeout=delay, return_when="FIRST_COMPLETED")
        for f in pending:
            f.cancel()
        if self.proc is not None and self.proc.returncode is not None:
            self.exit_code, self.proc, self.gpus = self.proc.returncode, None, 0
        return stop.is_set()

    async def _complete(self, stub: pb_grpc.ClusterAllocatorStub, code: int) -> int:
        await stub.CompleteJob(
            pb.CompleteJobRequest(job_id=self.args.job_id, failed=code != 0, token=self.job_token),
            metadata=self._meta,
            timeout=10,
        )
        log.info(
            "job %s finished (exit code %d, %d restart(s))", self.args.job_id, code, self.restarts
        )
        return code

    async def _session(self, stub: pb_grpc.ClusterAllocatorStub, stop: asyncio.Event) -> int:
        a = self.args
        if self.exit_code is not None:  # the script ended while the allocator was away
            return await self._complete(stub, self.exit_code)
        stream = stub.WatchAllocations(
            pb.WatchAllocationsRequest(job_id=a.job_id), metadata=self._meta
        )
        watch = asyncio.ensure_future(stream.read())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                exited = asyncio.ensure_future(self.proc.wait()) if self.proc else None
                waits = {watch, stopping} | ({exited} if exited else set())
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if exited is not None and exited not in done:
                    exited.cancel()
                if stopping in done:
                    await self._stop()
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub.CompleteJob(
                            pb.CompleteJobRequest(job_id=a.job_id, failed=True),
                            metadata=self._meta,
                            timeout=10,
                        )
                    log.info("job %s cancelled", a.job_id)
                    return 130
                if exited is not None and exited in done:
                    self.exit_code, self.proc, self.gpus = exited.result(), None, 0
                    return await self._complete(stub, self.exit_code)
                snapshot = watch.result()  # an RPC error here: reconnect, training goes on
                if snapshot is grpc.aio.EOF:
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.aio.Metadata(),
                        grpc.aio.Metadata(),
                        "the allocator closed the allocation stream",
                    )
                if self._backoff.failures:
                    log.info("job %s: allocator back", a.job_id)
                    self._backoff.reset()
                watch = asyncio.ensure_future(stream.read())
                await self._follow(snapshot)
        finally:
            watch.cancel()
            stopping.cancel()

    async def _follow(self, snapshot: pb.AllocationSet) -> None:
        mine = next((x for x in snapshot.allocations if x.job_id == self.args.job_id), None)
        if mine is None or snapshot.dry_run:
            return
        here = sum(n.gpus for n in mine.nodes if n.node_id == self.args.node_id)
        if here == self.gpus and (self.proc is not None or here == 0):
            return
        if self.proc is not None:
            log.info(
                "job %s: GPUs %d -> %d (%s); restarting",
                self.args.job_id,
                self.gpus,
                here,
                mine.reason,
            )
            self.restarts += 1
            await self._stop()
        if here:
            await self._start(here, mine.batch_size)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dloader-launch``."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    target = args.allocator or _env.allocator_target()
    if not target:
        print("dloader-launch: --allocator (or $DLOADER_ALLOCATOR) is required", file=sys.stderr)
        return 2
    try:
        allocator = Endpoint.of(
            target, _env.secret(args.token or _env.allocator_token(), "--token")
        )
    except ValueError as exc:
        print(f"dloader-launch: --allocator: {exc}", file=sys.stderr)
        return 2
    if not Path(args.script).is_file():
        print(f"dloader-launch: script {args.script!r} does not exist", file=sys.stderr)
        return 2

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await Launcher(args, allocator).run(stop)

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        print(f"dloader-launch: allocator: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
