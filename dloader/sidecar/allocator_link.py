"""The node sidecar's link to the cluster allocator (``dloader-sidecar --allocator TARGET``).

It registers the node with its GPUs and the cores its loaders may use (``--cpu-budget``),
reports every period which GPUs the allocator may use, how fast the node's allocator-managed
jobs run and what one GPU's input pipeline of each delivers on ``c`` cores (its loaders' models
here: :func:`input_curve`), and watches the allocations of this node: when a job's global batch
size changes, every loader of that job on this node (tied to it by its key, ``DLOADER_JOB_KEY``,
never by its name) is directed to the allocation's local batch size, as the allocator gave it,
which the job's agent applies with ``loader.set_batch_size``; the job's cores on this node
become the node's prior for it (:meth:`NodeCore.set_cpu_targets`). GPU-count changes are for
the job's launcher (``dloader-launch``) to apply. If the allocator is absent or goes away, the
node keeps its configuration and the link reconnects with backoff; the sidecar itself is never
affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math

import grpc

from dloader._shared.allocator_messages import (
    MAX_INPUT_POINTS,
    MAX_INPUT_RATE,
    MIN_INPUT_RATE,
    AllocationSet,
    InputCurve,
    NodeJobReport,
)
from dloader._shared.client import Backoff, Endpoint
from dloader.errors import PredictorError
from dloader.predictor import LoaderModel
from dloader.sidecar.core import NodeCore
from dloader.v1 import allocator_pb2 as pb
from dloader.v1 import allocator_pb2_grpc as pb_grpc

__all__ = ["AllocatorLink", "input_curve"]

log = logging.getLogger(__name__)


class AllocatorLink:
    """Keeps a node registered with the allocator and applies its batch sizes."""

    def __init__(
        self,
        core: NodeCore,
        allocator: Endpoint,
        *,
        node_id: str,
        gpus: int,
        address: str = "",
        host: str = "",
        period_s: float = 5.0,
        lends: bool = False,
    ) -> None:
        if gpus < 0 or (gpus == 0 and core.settings.cpu_budget <= 0):
            raise ValueError(
                f"--gpus={gpus}: a node offers at least 1 GPU to the allocator, or none and its "
                "--cpu-budget cores to the CPU pool"
            )
        self.core = core
        self.endpoint = allocator
        self.target = allocator.target
        self.node_id = node_id
        self.gpus = gpus
        self.address = address
        self.host = host  # where other nodes reach this one for a job's rendezvous
        self.period_s = period_s
        self.lends = lends  # its Ray node hosts other nodes' jobs' remote workers
        self._metadata = allocator.metadata or None
        #: the allocator's jobs with GPUs: key digest -> (job id, its GPUs on all nodes)
        self.managed: dict[str, tuple[str, int]] = {}
        #: key digests of the jobs the CPU pool serves (their remote workers are directed)
        self._pooled: set[str] = set()
        self.connected = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Connects, reports and watches until ``stop``; reconnects with backoff."""
        backoff = Backoff()
        while not stop.is_set():
            try:
                async with self.endpoint.aio_channel() as channel:
                    stub = pb_grpc.ClusterAllocatorStub(channel)
                    await stub.RegisterNode(
                        pb.RegisterNodeRequest(
                            node_id=self.node_id,
                            gpus=self.gpus,
                            sidecar_address=self.address,
                            host=self.host,
                            cpus=float(self.core.settings.cpu_budget),
                            lends=self.lends,
                        ),
                        metadata=self._metadata,
                        timeout=10,
                    )
                    log.info(
                        "registered node %s with the allocator at %s", self.node_id, self.target
                    )
                    backoff.reset()
                    self.connected.set()
                    await self._serve(stub, stop)
            except (grpc.aio.AioRpcError, OSError) as exc:
                self.connected.clear()
                if backoff.failures == 0:
                    why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc
                    log.warning("allocator at %s unreachable (%s); retrying", self.target, why)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff.next())

    async def _serve(self, stub: pb_grpc.ClusterAllocatorAsyncStub, stop: asyncio.Event) -> None:
        tasks = [
            asyncio.create_task(self._watch(stub)),
            asyncio.create_task(self._report(stub, stop)),
            asyncio.create_task(stop.wait()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # re-raises an RPC failure, for the reconnect loop
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, stub: pb_grpc.ClusterAllocatorAsyncStub) -> None:
        stream = stub.WatchAllocations(
            pb.WatchAllocationsRequest(node_id=self.node_id), metadata=self._metadata
        )
        async for snapshot in stream:
            self.apply(AllocationSet.from_pb(snapshot))

    def apply(self, snapshot: AllocationSet) -> None:
        """Directs this node's loaders of each allocated job to the allocation's local batch
        size, and gives the node the jobs' cores here as its prior. A local job is one of the
        allocator's only by the digest of its key (``DLOADER_JOB_KEY``, which dloader-launch
        derives from the job's token), never by its name: another user's jobs named like
        it get nothing of it, and say nothing in its report."""
        self.managed = {
            a.key_digest: (a.job_id, a.gpus)
            for a in snapshot.allocations
            if a.gpus and a.key_digest
        }
        if snapshot.dry_run:
            return
        self.core.set_cpu_targets(
            {
                a.key_digest: a.cpus[self.node_id]
                for a in snapshot.allocations
                if a.key_digest and self.node_id in a.cpus
            }
        )
        lent = [a.lent_cpus.get(self.node_id, 0.0) for a in snapshot.allocations]
        self.core.set_lent_cores(sum(c for c in lent if math.isfinite(c) and c > 0))
        self._direct_remote(snapshot)
        for a in snapshot.allocations:
            if not a.gpus or not a.local_batch_size:
                continue
            for job in self.core.allocator_jobs(a.key_digest):
                self.core.direct_batch_size(
                    job.job_id,
                    a.local_batch_size,
                    f"allocator v{snapshot.version}: global batch {a.batch_size} on {a.gpus} "
                    f"GPU(s), {a.local_batch_size} per process x {a.accumulation_steps} "
                    f"step(s): {a.reason}",
                )

    def _direct_remote(self, snapshot: AllocationSet) -> None:
        """Each allocated job's remote cores, as remote workers of its loaders here (one per
        core): this node's share of them (by its GPUs of the job), split among the job's ranks
        here; those of the CPU pool, and those each lending node lends (``lent_cpus``), each
        placed there. Only for jobs the pool serves or served: a loader's own remote workers
        are left alone where the allocator never gave it remote cores."""
        for a in snapshot.allocations:
            if not a.key_digest:
                continue
            ranks = self.core.allocator_jobs(a.key_digest)
            if not ranks or not (a.remote_cpus > 0 or a.key_digest in self._pooled):
                continue
            if a.remote_cpus > 0:
                self._pooled.add(a.key_digest)
            else:
                self._pooled.discard(a.key_digest)
            here = a.nodes.get(self.node_id, 0) / a.gpus if a.gpus else 0.0
            lent = {n: c * here for n, c in a.lent_cpus.items() if math.isfinite(c) and c > 0}
            pool = max(a.remote_cpus * here - sum(lent.values()), 0.0)
            ranks = sorted(ranks, key=lambda j: j.job_id)
            per_rank = _split(round(pool), len(ranks))
            lent_per_rank = {node: _split(round(c), len(ranks)) for node, c in lent.items()}
            where = "".join(f", {c:.1f} lent by {node}" for node, c in sorted(lent.items()))
            for i, job in enumerate(ranks):
                self.core.direct_remote_workers(
                    job.job_id,
                    per_rank[i],
                    f"allocator v{snapshot.version}: {a.remote_cpus:.1f} remote cores for the "
                    f"job, {pool:.1f} of the CPU pool{where} for its {len(ranks)} rank(s) here",
                    {node: n[i] for node, n in lent_per_rank.items() if n[i]},
                )

    def report(self) -> pb.ReportNodeRequest:
        """This node's report: usable GPUs, and its allocator-managed jobs' throughput, input
        curves and share of their declared epochs done, the mean over their ranks here (each
        job's loaders found by its key's digest)."""
        settings = self.core.settings
        jobs = []
        for digest, (job_id, _) in sorted(self.managed.items(), key=lambda kv: kv[1][0]):
            ranks = [j for j in self.core.allocator_jobs(digest) if j.last_report]
            if not ranks:
                continue
            rate = sum(j.last_report.samples_per_second for j in ranks if j.last_report)
            curve = input_curve(
                [j.model for j in ranks], settings.cpu_budget, settings.worker_budget
            )
            remote = float(sum(j.record.limits.max_remote_workers for j in ranks))
            done = sum(j.last_report.done for j in ranks if j.last_report) / len(ranks)
            jobs.append(
                NodeJobReport(
                    job_id, rate, input_curve=curve, remote_cores_max=remote, done=done
                ).to_pb()
            )
        return pb.ReportNodeRequest(node_id=self.node_id, free_gpus=self.gpus, jobs=jobs)

    async def _report(self, stub: pb_grpc.ClusterAllocatorAsyncStub, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await stub.ReportNode(self.report(), metadata=self._metadata, timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # a job that just completed
                    raise
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.period_s)


def _split(total: int, ranks: int) -> list[int]:
    """``total`` whole workers over ``ranks`` ranks, the remainder to the first ones."""
    return [total // ranks + (i < total % ranks) for i in range(ranks)]


def input_curve(models: list[LoaderModel], cores: float, workers: int) -> InputCurve:
    """What one of a job's loaders on this node (one per rank, ``models``) delivers on ``c``
    cores, the mean over its ranks, each with its share of the node's ``workers`` (the allocator
    counts a job's pipeline per GPU: ``k`` GPUs on ``c`` cores are fed ``k`` times the curve at
    ``c / k``): at :data:`MAX_INPUT_POINTS` core counts from 1/8 of a core to the node's
    ``cores`` (empty while a loader has no model yet)."""
    ranks = len(models)
    if not ranks or not all(m.observations for m in models) or cores <= 0:
        return ()
    share = max(workers // ranks, 1)
    low = min(0.125, cores)
    steps = [low * (cores / low) ** (i / (MAX_INPUT_POINTS - 1)) for i in range(MAX_INPUT_POINTS)]
    out: list[tuple[float, float]] = []
    try:
        for c in sorted(set(steps)):
            rate = sum(m.input_rate(c, share) for m in models) / ranks
            if out and rate < out[-1][1]:
                rate = out[-1][1]  # a curve never falls as cores grow
            if rate >= MIN_INPUT_RATE and (not out or c > out[-1][0]):
                out.append((c, min(rate, MAX_INPUT_RATE)))
    except PredictorError:
        return ()
    return tuple(out)
