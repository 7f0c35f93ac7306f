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

The script sees ``DLOADER_JOB_NAME`` (the job id), ``DLOADER_ALLOCATED_GPUS`` (its processes on
this node), ``DLOADER_GLOBAL_BATCH_SIZE``, ``DLOADER_LOCAL_BATCH_SIZE`` and
``DLOADER_ACCUMULATION_STEPS`` (the allocation when it was started, as the allocator gave it),
``DLOADER_GENERATION`` (the allocation's placement generation) and ``DLOADER_JOB_KEY`` (derived
from the job's token: the script's loaders give it to the node's sidecar, which ties them to
this job by it, never by name).

Several nodes: run one launcher per node of the job, each with its ``--node-id``; one submits the
job (and writes its credential to ``--token-file`` on storage the others share, as they share
the checkpoints), the others ``--follow`` it::

    node-a$ dloader-launch --job-id bert-7 --node-id node-a --token-file /shared/bert-7.token \
                --batch-size 256 --max-gpus 16 -- train.py
    node-b$ dloader-launch --job-id bert-7 --node-id node-b --token-file /shared/bert-7.token \
                --follow -- train.py

When the allocation spans nodes, each launcher with a share runs ``torchrun --nnodes=1:N
--nproc-per-node=K --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB-GENERATION`` with
the endpoint the allocator hands out; the launcher on the job's first node hosts that
rendezvous store itself (so the store outlives any torchrun). Every change of placement is a new
generation: all launchers restart into it and the script resumes from its elastic checkpoint. A
node that dies between allocator decisions makes torchrun's own elasticity (``--max-restarts``,
minimum 1 node) restart the survivors without it, from the same checkpoint. The first node
hosts the rendezvous: if that node dies, the survivors cannot meet until the allocator moves the
job (its ``--node-timeout``).

Any launcher whose script exits 0 completes the job (the first one wins); a follower's SIGTERM
stops only its share, a submitter's cancels the job.

A launcher acts only on a job it submitted, or one whose credential it holds (``--token-file``):
a job id already taken (by another user, or an earlier run) is refused unless the token file
holds that job's token, checked with the allocator before anything runs; an id whose job has
already ended is refused, not followed. Each exit says why.
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
from typing import Any

import grpc

from dloader._shared import env, files
from dloader._shared.allocator_messages import (
    SCALING_FIELDS,
    Allocation,
    AllocationSet,
    JobSpec,
    Measurement,
    job_key,
)
from dloader._shared.cli import LOG_LEVELS, count, finite, seconds
from dloader._shared.client import Backoff, Endpoint
from dloader.errors import ConfigError, InvalidArgument, LaunchRefused
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
    p.add_argument(
        "--follow",
        action="store_true",
        help="run this node's share of a job another launcher submits (multi-node jobs); "
        "its completion needs --token-file",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        help="the job's credential: written (mode 0600) by the launcher that submits, read by "
        "--follow launchers so that whichever finishes the script can complete the job",
    )
    p.add_argument(
        "--max-restarts",
        type=count,
        default=3,
        help="torchrun's --max-restarts for jobs on several nodes (a dead peer node)",
    )
    p.add_argument(
        "--last-call",
        type=seconds,
        default=10.0,
        help="seconds torchrun's rendezvous waits for more nodes once one has joined",
    )
    p.add_argument("--batch-size", type=int, help="requested global batch size (to submit)")
    p.add_argument("--min-batch-size", type=int, default=0)
    p.add_argument("--max-batch-size", type=int, default=0)
    p.add_argument("--min-local-batch-size", type=int, default=0)
    p.add_argument("--max-local-batch-size", type=int, default=0, help="what fits on one GPU")
    p.add_argument("--min-gpus", type=int, default=1)
    p.add_argument("--max-gpus", type=int, default=0, help="0: no limit")
    p.add_argument("--priority", type=finite, default=1.0)
    p.add_argument("--restart-seconds", type=seconds, default=0.0, help="0: allocator default")
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
    p.add_argument("--grace", type=seconds, default=30.0, help="seconds torchrun gets to stop")
    p.add_argument("--log-level", default="INFO", choices=LOG_LEVELS, type=str.upper)
    p.add_argument("script", help="training script (launched by torchrun)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _measurements(path: Path) -> tuple[Measurement, ...]:
    """``--measurements``: a CSV of measured steps, each row checked (a FIFO or a folder is
    refused, not waited on)."""
    expected = (
        "expected columns nodes,replicas,local_bsz,step_time[,sync_time] with a row per "
        "measured step"
    )
    fd = files.open_regular(path, "--measurements", follow=True)
    if fd is None:
        raise ConfigError(f"--measurements {path}: no such file")
    try:
        with os.fdopen(fd, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
            if not rows:
                raise ValueError("no rows")
            return tuple(
                Measurement(
                    nodes=int(row["nodes"]),
                    replicas=int(row["replicas"]),
                    local_batch_size=int(row["local_bsz"]),
                    step_seconds=float(row["step_time"]),
                    sync_seconds=float(row.get("sync_time") or 0.0),
                )
                for row in rows
            )
    except (OSError, KeyError, ValueError, TypeError, csv.Error) as exc:
        raise ConfigError(f"--measurements {path}: {exc}; {expected}") from None


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job to submit, from the command line; every field checked here, before the
    allocator is contacted (``ConfigError`` naming the flag)."""
    scaling = None
    if args.scaling:
        try:
            scaling = {k: float(v) for k, v in json.loads(args.scaling).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"--scaling {args.scaling!r}: {exc}; expected a JSON object of "
                f"{', '.join(SCALING_FIELDS)}"
            ) from None
        unknown = set(scaling) - set(SCALING_FIELDS)
        if unknown:
            raise ConfigError(
                f"--scaling: unknown field(s) {sorted(unknown)}; expected "
                f"{', '.join(SCALING_FIELDS)}"
            )
    spec = JobSpec(
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
        scaling=scaling,
        measurements=_measurements(args.measurements) if args.measurements else (),
    )
    try:
        spec.normalised(default_restart_seconds=0.0)  # the allocator's own check, here first
    except InvalidArgument as exc:
        field = exc.field.removeprefix("job.")
        flag = "--" + field.split(".")[0].replace("_", "-")
        raise ConfigError(f"{flag}: {field}: {exc.message}") from None
    return spec


def check_token_file(path: Path) -> None:
    """``--token-file`` checked before the allocator is contacted: a path in a folder only
    this user may write, and, where a file is there already, a credential of this user's
    (``ConfigError`` saying why not: a link, a FIFO, a folder, another user's file)."""
    files.check_private_folder(path.parent, "--token-file")
    files.read_private(path, "--token-file")


class Launcher:
    """Keeps a torchrun process at the job's allocated size."""

    def __init__(
        self, args: argparse.Namespace, allocator: Endpoint, spec: JobSpec | None = None
    ) -> None:
        """``spec``: the job to submit (None: ``--follow``, another launcher submits it)."""
        self.args = args
        self.allocator = allocator
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.gpus = 0
        self.generation = -1  # the placement generation torchrun runs in
        self.restarts = 0
        self.submitted = args.follow  # a follower never submits
        self.seen = False  # the job has appeared in an allocation (a follower waits for it)
        self.store: Any = None  # the c10d rendezvous store this launcher hosts
        self.exit_code: int | None = None
        self._backoff = Backoff()  # its failures: consecutive failed connections
        self.job_token = ""  # the job's credential from SubmitJob (for CompleteJob)
        self.checked = False  # this launcher holds the job's token (checked with the allocator)
        self._meta = allocator.metadata or None

    def _torchrun(self, gpus: int, mine: Allocation) -> list[str]:
        """torchrun's arguments for this node's share of the allocation ``mine``."""
        nodes = sum(1 for g in mine.nodes.values() if g)
        if nodes < 2 or not mine.rendezvous:
            return ["--standalone", f"--nproc-per-node={gpus}"]
        return [
            f"--nnodes=1:{nodes}",
            f"--nproc-per-node={gpus}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={mine.rendezvous}",
            f"--rdzv-id={self.args.job_id}-{mine.generation}",
            f"--rdzv-conf=is_host=false,last_call_timeout={self.args.last_call:g}",
            f"--max-restarts={self.args.max_restarts}",
        ]

    def _host_rendezvous(self, mine: Allocation) -> None:
        """Hosts the generation's rendezvous store when this node is the job's first (the
        torchrun agents all connect to it as clients, so it outlives any of them)."""
        self.store = None  # the previous generation's store closes
        nodes = sorted(n for n, g in mine.nodes.items() if g)
        if len(nodes) < 2 or not mine.rendezvous or nodes[0] != self.args.node_id:
            return
        from torch.distributed import TCPStore  # only where a rendezvous is hosted

        port = int(mine.rendezvous.rsplit(":", 1)[1])
        try:
            self.store = TCPStore(
                "0.0.0.0", port, is_master=True, wait_for_workers=False, multi_tenant=True
            )
        except (RuntimeError, ValueError) as exc:  # the port is taken: torchrun will say so
            log.error(
                "job %s: cannot host the rendezvous on port %d: %s", self.args.job_id, port, exc
            )
            return
        log.info("job %s: hosting the rendezvous on port %d", self.args.job_id, port)

    async def _start(self, gpus: int, mine: Allocation) -> None:
        a = self.args
        self._host_rendezvous(mine)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *self._torchrun(gpus, mine),
            a.script,
            *[x for x in a.script_args if x != "--"],
        ]
        environ = {
            **os.environ,
            **env.launch_exports(
                a.job_id,
                gpus,
                mine.batch_size,
                mine.local_batch_size,
                mine.accumulation_steps,
                mine.generation,
                job_key(self._token()),
            ),
        }
        self.proc = await asyncio.create_subprocess_exec(*cmd, env=environ, start_new_session=True)
        self.gpus, self.generation = gpus, mine.generation
        log.info(
            "job %s: started torchrun with %d process(es) on %s, global batch %d, generation "
            "%d%s (pid %d)",
            a.job_id,
            gpus,
            a.node_id,
            mine.batch_size,
            mine.generation,
            f", rendezvous {mine.rendezvous}" if mine.rendezvous else "",
            self.proc.pid,
        )

    async def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            self.store = None
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
        try:
            await asyncio.wait_for(proc.wait(), timeout=self.args.grace)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        self.gpus, self.generation = 0, -1
        self.store = None  # this generation's rendezvous store (if hosted here) closes

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
                        if not await self._submit(stub):  # a follower can start first
                            if await self._wait_submitted(stop):
                                return 130
                            continue
                        return await self._session(stub, stop)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND and self.submitted:
                        if self.seen or not self.args.follow:
                            log.info(
                                "job %s left the allocator (completed or cancelled by another "
                                "launcher or the operator); stopping here",
                                self.args.job_id,
                            )
                            return 0
                        if await self._wait_submitted(stop):
                            return 130
                        continue
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

    async def _submit(self, stub: pb_grpc.ClusterAllocatorAsyncStub) -> bool:
        """Submits the job (a submitting launcher, once); a follower, once the job exists,
        checks that it holds the job's token. An id already taken is followed only with its
        token (:meth:`_check_token`). False: a follower has no token yet (the submitting
        launcher has not written it), and waits."""
        if self.args.follow:
            if not self.checked:
                if not self._token():
                    return False
                await self._check_token(stub)  # NOT_FOUND while not submitted yet: run() waits
            return True
        if self.submitted or self.spec is None:
            return True
        try:
            r = await stub.SubmitJob(
                pb.SubmitJobRequest(job=self.spec.to_pb()), metadata=self._meta, timeout=30
            )
            self.job_token = r.token
            if self.args.token_file is not None:
                try:
                    files.write_private(self.args.token_file, r.token, "--token-file")
                except (ConfigError, OSError) as exc:
                    await self._cancel_submitted(stub)
                    raise LaunchRefused(
                        f"job {r.job_id} submitted, but its token could not be written "
                        f"({exc}): the job was cancelled"
                    ) from None
            log.info("job %s submitted (queue position %d)", r.job_id, r.queue_position)
            self.checked = True
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
            await self._check_token(stub, taken=True)
            log.info("job %s already submitted, with this token: following it", self.args.job_id)
        self.submitted = True
        return True

    async def _check_token(
        self, stub: pb_grpc.ClusterAllocatorAsyncStub, taken: bool = False
    ) -> None:
        """That the job is active and this launcher holds its token (an empty UpdateJob: the
        allocator checks the token and changes nothing); else :class:`LaunchRefused` saying
        why. ``taken``: SubmitJob said the id is already taken."""
        a = self.args
        token = self._token()
        if not token:
            raise LaunchRefused(
                f"job id {a.job_id!r} is already taken (by another launcher or user, or an "
                "earlier run of this one), and this launcher has no token for it: refusing to "
                "run on another's job. Use a new --job-id, or give the job's --token-file"
            )
        try:
            await stub.UpdateJob(
                pb.UpdateJobRequest(job_id=a.job_id, token=token), metadata=self._meta, timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                raise LaunchRefused(
                    f"the token in {a.token_file} is not job {a.job_id!r}'s: refusing to run on "
                    "a job this launcher did not submit"
                ) from None
            if exc.code() == grpc.StatusCode.NOT_FOUND and taken:
                raise LaunchRefused(
                    f"job {a.job_id!r} has already ended (completed or cancelled): not running "
                    "the script again. Use a new --job-id to run it again"
                ) from None
            raise
        self.checked = True

    async def _wait_submitted(self, stop: asyncio.Event) -> bool:
        """A follower waits (with backoff) for the job and its token file; True if stopped."""
        if self._backoff.failures == 0:
            log.info(
                "job %s: waiting for it to be submitted (and its token in %s)",
                self.args.job_id,
                self.args.token_file,
            )
        return await self._wait_offline(stop, self._backoff.next())

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

    def _token(self) -> str:
        """The job's token: from SubmitJob, else from ``--token-file`` where a trusted file is
        there (:func:`dloader._shared.files.read_private`; "": none yet)."""
        if not self.job_token and self.args.token_file is not None:
            try:
                self.job_token = files.read_private(self.args.token_file, "--token-file") or ""
            except ConfigError as exc:
                raise LaunchRefused(str(exc)) from None
        return self.job_token

    async def _cancel_submitted(self, stub: pb_grpc.ClusterAllocatorAsyncStub) -> None:
        """Ends the job this launcher just submitted (it could not keep its token)."""
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.CompleteJob(
                pb.CompleteJobRequest(job_id=self.args.job_id, failed=True, token=self.job_token),
                metadata=self._meta,
                timeout=10,
            )

    async def _complete(self, stub: pb_grpc.ClusterAllocatorAsyncStub, code: int) -> int:
        try:
            await stub.CompleteJob(
                pb.CompleteJobRequest(
                    job_id=self.args.job_id, failed=code != 0, token=self._token()
                ),
                metadata=self._meta,
                timeout=10,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            log.info("job %s was already completed (by another node)", self.args.job_id)
        log.info(
            "job %s finished (exit code %d, %d restart(s))", self.args.job_id, code, self.restarts
        )
        return code

    async def _session(self, stub: pb_grpc.ClusterAllocatorAsyncStub, stop: asyncio.Event) -> int:
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
                    if a.follow:  # a follower stops its share; the job goes on elsewhere
                        log.info("job %s: stopped on %s", a.job_id, a.node_id)
                        return 130
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub.CompleteJob(
                            pb.CompleteJobRequest(job_id=a.job_id, failed=True),
                            metadata=self._meta,
                            timeout=10,
                        )
                    log.info("job %s cancelled", a.job_id)
                    return 130
                if exited is not None and exited in done:
                    code = exited.result()
                    self.proc, self.gpus, self.generation = None, 0, -1
                    if code != 0 and a.follow:
                        log.warning(
                            "job %s: torchrun on %s exited with %d; waiting for the next "
                            "allocation (the submitting launcher decides the job's fate)",
                            a.job_id,
                            a.node_id,
                            code,
                        )
                        continue
                    self.exit_code = code
                    return await self._complete(stub, code)
                snapshot = watch.result()  # an RPC error here: reconnect, training goes on
                if not isinstance(snapshot, pb.AllocationSet):  # grpc.aio.EOF
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
                if await self._follow(AllocationSet.from_pb(snapshot)):
                    await self._stop()
                    log.info("job %s ended; nothing left to run on %s", a.job_id, a.node_id)
                    return 0
        finally:
            watch.cancel()
            stopping.cancel()

    async def _follow(self, snapshot: AllocationSet) -> bool:
        """Keeps torchrun at this node's share of the job's allocation; True once the job has
        left the allocations (completed or cancelled elsewhere)."""
        if snapshot.dry_run:
            return False
        mine = snapshot.get(self.args.job_id)
        if mine is None:
            return self.seen
        self.seen = True
        here = mine.nodes.get(self.args.node_id, 0)
        running = self.proc is not None
        if (
            here == self.gpus
            and (mine.generation == self.generation or not here)
            and (running or here == 0)
        ):
            return False
        if running:
            log.info(
                "job %s: GPUs here %d -> %d, generation %d -> %d (%s); restarting",
                self.args.job_id,
                self.gpus,
                here,
                self.generation,
                mine.generation,
                mine.reason,
            )
            self.restarts += 1
            await self._stop()
        if here:
            await self._start(here, mine)
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dloader-launch``."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s: %(message)s")
    target = args.allocator or env.allocator_target()
    if not target:
        print("dloader-launch: --allocator (or $DLOADER_ALLOCATOR) is required", file=sys.stderr)
        return 2
    try:
        allocator = Endpoint.of(target, env.secret(args.token or env.allocator_token(), "--token"))
    except ValueError as exc:
        print(f"dloader-launch: --allocator: {exc}", file=sys.stderr)
        return 2
    if args.follow == (args.batch_size is not None):
        print(
            "dloader-launch: give --batch-size to submit the job, or --follow to run this "
            "node's share of a job another launcher submits (not both)",
            file=sys.stderr,
        )
        return 2
    if args.follow and args.token_file is None:
        print("dloader-launch: --follow needs --token-file (to complete the job)", file=sys.stderr)
        return 2
    if not Path(args.script).is_file():
        print(f"dloader-launch: script {args.script!r} does not exist", file=sys.stderr)
        return 2
    try:
        spec = None if args.follow else job_spec(args)
        if args.token_file is not None:
            check_token_file(args.token_file)
    except ConfigError as exc:
        print(f"dloader-launch: {exc}", file=sys.stderr)
        return 2

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await Launcher(args, allocator, spec).run(stop)

    try:
        return asyncio.run(go())
    except LaunchRefused as exc:
        print(f"dloader-launch: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"dloader-launch: allocator: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
