"""CPU cores for the jobs' input pipelines: in the GPU decision, in the placement, on each node.

**The resource model.** A job on ``k`` GPUs at global batch ``b`` computes at most
``X(k, b)`` samples/s (its scaling model); each of its GPUs has its own loader (one per rank),
and one GPU's pipeline delivers ``R(u)`` samples/s on ``u`` cores (its
:class:`~dloader.predictor.InputModel`, one GPU's as Synergy profiles it), so its ``k`` GPUs on
``c`` cores are fed ``k * R(c / k)`` (:func:`feed_rate`; Synergy's 2- and 4-GPU tables give the
same speed per GPU at the same cores per GPU as its 1-GPU ones). It runs at
``min(X, k * R(c / k))``. A node's
cores are one more per-node resource beside its GPUs (:attr:`Cluster.cpus`; None: unlimited,
and every decision is the CPU-blind one), and they serve only the jobs with GPUs on that node:
a job reaches more cores only by holding GPUs on more nodes.

**One decision over GPUs, batch sizes and cores.** The DP values a job at ``k`` GPUs and batch
``b`` at what its pipeline can feed there, ``min(X(k, b), k * R(rho))`` (:func:`fed_table`),
where ``rho`` is the cores per GPU the job can count on: the cluster's cores per GPU (one pass;
the division below then gives a CPU-hungry job beside CPU-light ones more than that share, and
its batch is refitted to the cores it got). So a GPU that the job's
pipeline cannot feed is worth only the samples its cores bring; a batch larger than the pipeline
feeds gains nothing and costs statistical efficiency; a job whose input is not known yet is
valued as today. With unlimited cores ``R`` never binds and the decision is today's.

**Placement and division.** The placer puts a job's part on one node where the free cores cover
what that part needs, where a node allows (so a CPU-hungry job lands beside CPU-light ones);
then each node's cores are divided by water-filling (:func:`divide_cores`): every job there gets
what its GPUs there need, or, when the node is short, an equal share per unit of priority, the
rest going to whoever still needs more. The baseline divides a node's cores in proportion to the
GPUs each job holds there (:func:`proportional_cores`).

**A pool of CPU-only nodes** (:attr:`Cluster.pool`) runs loader workers remotely (Ray): a pool
core feeds ``pool_efficiency`` of what a core on the job's node feeds. The DP counts each GPU
as bringing its share of the pool too (``rho`` grows by ``pool_efficiency * pool / GPUs``); after
each node's division, the pool goes to the jobs still short of what their GPUs need, by
water-filling (:func:`divide_pool`), within what their loaders can use (``JobState.remote_max``);
each batch is then refitted to the local and pool cores together.

**Spare cores lent across nodes** (``goodput-dp-lend``): a node's cores that its own jobs do
not need (:func:`spare_cores`) join the pool for that decision, as remote loader workers on
that node for jobs short on theirs, at the pool's efficiency; the lending node's division is
then made on what it keeps. Each job draws on the pool and each lender alike
(:func:`borrowed_cores`: what the service names in each allocation). The pooled same-cores
bound is what this approaches: work moves to the idle cores, at the cost of moving its batches.

Design for more resources: a further per-node resource (host memory, a GPU type) is one more
per-node tuple in :class:`Cluster`, one more curve per job, and one more ``min`` in
:func:`fed_table` and division in :func:`divide_cores`; the DP and the placer are unchanged.

Pure code: plain values in and out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dloader.allocator.optimizer import Cluster
from dloader.predictor import InputModel

__all__ = [
    "borrowed_cores",
    "divide_cores",
    "divide_pool",
    "fed_table",
    "feed_cores",
    "feed_rate",
    "proportional_cores",
    "spare_cores",
    "water_fill",
]


def feed_rate(model: InputModel, gpus: float, cores: float) -> float:
    """Samples/s a job's loaders feed its ``gpus`` GPUs on ``cores`` cores, each GPU's on its
    share: ``gpus * R(cores / gpus)`` (``model``: one GPU's pipeline; 0 without GPUs)."""
    return gpus * model.rate(cores / gpus) if gpus > 0 else 0.0


def feed_cores(model: InputModel, gpus: float, rate: float) -> float:
    """The cores a job's loaders need to feed its ``gpus`` GPUs ``rate`` samples/s together (the
    inverse of :func:`feed_rate`; 0 without GPUs)."""
    return gpus * model.cores_for(rate / gpus) if gpus > 0 else 0.0


def proportional_cores(
    placements: Mapping[str, tuple[int, ...]], cluster: Cluster
) -> dict[str, tuple[float, ...]]:
    """Each job's cores on each node in proportion to its GPUs there (the GPU-proportional
    baseline); empty with unlimited cores."""
    if cluster.cpus is None:
        return {}
    return {
        job: tuple(c * g / n for c, g, n in zip(cluster.cpus, p, cluster.nodes, strict=True))
        for job, p in placements.items()
    }


def water_fill(demands: np.ndarray, weights: np.ndarray, capacity: float) -> np.ndarray:
    """Shares of ``capacity`` for consumers with ``demands``: all of it when they fit; else the
    level ``L`` at which ``sum(min(demand, L * weight)) = capacity``."""
    demands = np.maximum(np.asarray(demands, dtype=float), 0.0)
    weights = np.maximum(np.asarray(weights, dtype=float), 1e-12)
    if demands.sum() <= capacity:
        return demands
    order = np.argsort(demands / weights)
    out = np.empty_like(demands)
    left, weight = capacity, weights.sum()
    for i in order:
        level = left / weight if weight > 0 else 0.0
        take = min(demands[i], level * weights[i])
        out[i] = take
        left -= take
        weight -= weights[i]
    return out


def divide_cores(
    placements: Mapping[str, tuple[int, ...]],
    need: Mapping[str, float],
    weights: Mapping[str, float],
    cluster: Cluster,
) -> dict[str, tuple[float, ...]]:
    """Each job's cores on each node: on every node, what the job's GPUs there need (its total
    ``need`` split by its GPUs; absent: as much as it can get) when the node has them, else
    water-filled by its GPUs there times its weight (``weights``, default 1: where every job
    needs more than the node has, the GPU-proportional division); the cores no job needs go the
    same way. Empty with unlimited cores."""
    if cluster.cpus is None:
        return {}
    jobs = list(placements)
    if not jobs:
        return {}
    gpus = np.array([placements[j] for j in jobs], dtype=np.int64).reshape(len(jobs), -1)
    # each job's need per GPU (inf: as much as it can get) and its weight
    per_gpu = np.array([need.get(j, math.inf) for j in jobs]) / np.maximum(gpus.sum(axis=1), 1)
    weight = np.array([weights.get(j, 1.0) for j in jobs])
    # node by node, its jobs in the placements' order; each job's row is built from the few
    # nodes it holds GPUs on (a dense jobs x nodes array of floats costs more than the rest)
    rows = [[0.0] * gpus.shape[1] for _ in jobs]
    nodes, at = np.nonzero(gpus.T)
    cut = np.flatnonzero(np.diff(nodes)) + 1
    groups = zip(nodes[np.r_[0, cut]], np.split(at, cut), strict=True) if len(nodes) else ()
    for node, here in groups:
        n = int(node)
        cores = cluster.cpus[n]
        g = gpus[here, n].astype(float)
        demand = per_gpu[here] * g
        demand = np.where(np.isfinite(demand), demand, cores)  # inf: as much as it can get
        w = weight[here] * g
        got = water_fill(demand, w, cores)
        # cores still free (every job here has what it needs): the rest goes the same way, so
        # that a pipeline the model underrates may still use it
        spare = cores - float(got.sum())
        if spare > 1e-9:
            got = got + spare * w / w.sum()
        for i, x in zip(here.tolist(), got.tolist(), strict=True):
            rows[i][n] = x
    return {j: tuple(row) for j, row in zip(jobs, rows, strict=True)}


def spare_cores(
    placements: Mapping[str, tuple[int, ...]],
    cores: Mapping[str, tuple[float, ...]],
    need: Mapping[str, float],
    cluster: Cluster,
) -> tuple[float, ...]:
    """Each node's cores its own jobs do not need: its cores less, for each job there, the
    lesser of what :func:`divide_cores` gave it (``cores``) and its ``need`` split by its GPUs
    (a job without a known need counts all it got); none on a node that may not lend
    (:attr:`Cluster.lends`). Empty with unlimited cores."""
    if cluster.cpus is None:
        return ()
    used = [0.0] * len(cluster.cpus)
    for job, row in cores.items():
        gpus = placements[job]
        total = sum(gpus)
        for n, (c, g) in enumerate(zip(row, gpus, strict=True)):
            if g:
                used[n] += min(c, need.get(job, math.inf) * g / total)
    lends = cluster.lends or (True,) * len(cluster.cpus)
    return tuple(
        max(c - u, 0.0) if may else 0.0 for c, u, may in zip(cluster.cpus, used, lends, strict=True)
    )


def borrowed_cores(
    remote: Mapping[str, float], lent: Sequence[float]
) -> dict[str, tuple[float, ...]]:
    """Each job's remote cores (``remote``: the CPU pool's and the cores nodes lend, as
    ``goodput-dp-lend`` decides them) by the node that lends them (``lent``: each node's cores
    lent): every job draws on the pool and on each lending node in the same proportion, so that
    each node lends what was decided. Jobs with none borrowed are left out; empty where no node
    lends."""
    total = sum(remote.values())
    if total <= 0 or not any(x > 0 for x in lent):
        return {}
    return {job: tuple(r * x / total for x in lent) for job, r in remote.items() if r > 0}


def divide_pool(
    short: Mapping[str, float],
    most: Mapping[str, float],
    weights: Mapping[str, float],
    cluster: Cluster,
) -> dict[str, float]:
    """Each job's cores of the cluster's CPU pool (its remote workers): what it is ``short`` of
    on its own nodes (cores), grossed up by the pool's efficiency and capped at the ``most`` its
    loaders can use, water-filled by ``weights`` where the pool cannot cover every job; jobs
    getting none are left out. Empty without a pool."""
    if cluster.pool <= 0 or cluster.cpus is None:
        return {}
    jobs = [j for j, c in short.items() if c > 1e-9 and most.get(j, 0.0) > 0]
    if not jobs:
        return {}
    demand = np.array([min(short[j] / cluster.pool_efficiency, most[j]) for j in jobs])
    got = water_fill(demand, np.array([weights.get(j, 1.0) for j in jobs]), cluster.pool)
    return {j: float(g) for j, g in zip(jobs, got, strict=True) if g > 1e-9}


def fed_table(
    model: InputModel, cores_per_gpu: float
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The DP's view of a job's pipeline: ``table`` (samples/s, one row per GPU count in
    ``gpus``, one column per batch size) capped at what ``k`` GPUs with ``cores_per_gpu``
    cores each are fed (:func:`feed_rate`)."""
    per_gpu = model.rate(cores_per_gpu)

    def feed(gpus: np.ndarray, table: np.ndarray) -> np.ndarray:
        cap = np.asarray(gpus, dtype=float) * per_gpu
        return np.minimum(table, cap[:, None])

    return feed
