"""``pollux``: Pollux's scheduling policy, written from its paper, for side-by-side comparison.

Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning"
(OSDI 2021), sections 3-4. What is taken from the paper, and how it maps here:

* **Goodput.** A job on ``k`` GPUs over ``n`` nodes runs at its best global batch (gradient
  accumulation allowed) for ``throughput x statistical efficiency``: the same scaling model,
  efficiency and exploration cap (twice the GPUs measured) that ``goodput-dp`` gets through
  :meth:`dloader.allocator.policies.dp.DpPolicy.spec`, so the comparison is one of policies.
* **Speedup over the fair share.** ``SPEEDUP_j(A_j) = GOODPUT_j(A_j) / GOODPUT_j(a_f)``, with
  ``a_f`` the fair share packed on one node: ``ceil(C / J)`` GPUs (at least one).
* **Fitness** is the power mean with ``p = -1`` (weighted by priority) of each job's speedup in
  units of a node (the speedup times nodes over GPUs) plus :data:`ZERO_SPEEDUP`, so that a job
  without GPUs counts as a small positive speedup: running more jobs comes first and the mean
  decides among allocations that run as many (a plain power mean with ``p < 0`` is 0 as soon as
  one job waits, which cannot rank anything on a busy cluster).
* **Restarts.** A running job whose allocation changes keeps ``max(age - restarts * R, 0) /
  (age + R)`` of its speedup (the age-weighted penalty; ``R`` its restart time).
* **Interference avoidance.** At most one distributed job (on more than one node) per node.
* **Genetic search** over allocation matrices (jobs x nodes, GPUs per cell), the jobs ordered
  by the GPU-seconds they have had, least first (then by arrival): a population seeded with the
  current allocation and the previous decision's population; each generation, single-point
  crossover over jobs, mutation (a job's row back to its current allocation, some cells
  emptied, growth into free GPUs; see :meth:`PolluxPolicy._mutate`), then repair (the job's most
  GPUs, one distributed job per node, node capacity in the job order above, the job's fewest
  GPUs); the best of parents and children survive. The job order and the mutation moves are
  those of Pollux's published simulator (``petuum/adaptdl``, ``simulator/pollux.py``), which
  the paper does not spell out; the live allocator has no GPU-seconds per job and orders by
  arrival.

Pure code: numpy's seeded generator only, so a decision is deterministic for a seed and the
simulator runs exactly what the live allocator would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dloader.allocator.optimizer import DEFAULT_HORIZON_S, Cluster, OptimizerJob
from dloader.allocator.policies.dp import DpPolicy
from dloader.allocator.policies.state import ClusterDecision, JobState
from dloader.allocator.policies.throughput import placed_throughput
from dloader.errors import AllocatorError

__all__ = ["ZERO_SPEEDUP", "PolluxPolicy", "power_mean"]

#: Added to every job's speedup (in node units) in the fitness: what a job without GPUs counts
#: as (see the module docstring).
ZERO_SPEEDUP = 1e-3
#: Mutation: the chance a job's row goes back to its current allocation, and the chance a row
#: has cells emptied (then each cell's).
RESET_P = 0.1
DROP_P = 0.1
_PADDED_MAX = 20_000_000  # elements of the (jobs, nodes, GPUs) goodput lookup


def power_mean(values: np.ndarray, p: float, weights: np.ndarray | None = None) -> np.ndarray:
    """The weighted power mean of ``values`` along the last axis (``p = 0``: geometric)."""
    v = np.asarray(values, dtype=float)
    w = np.ones(v.shape[-1]) if weights is None else np.asarray(weights, dtype=float)
    w = w / w.sum()
    if p == 0:
        return np.exp((np.log(v) * w).sum(axis=-1))
    return ((v**p) * w).sum(axis=-1) ** (1.0 / p)


@dataclass(frozen=True)
class _Tables:
    """Per job: best goodput and the batch index reaching it, by (nodes, GPUs)."""

    goodput: list[np.ndarray]
    batch: list[np.ndarray]
    base: np.ndarray
    """Goodput at the fair share, per job."""
    batch_sizes: list[tuple[int, ...]]
    padded: np.ndarray | None = None
    """``goodput`` as one (jobs, nodes, GPUs) array, when that is small enough: one lookup
    per generation instead of one per job."""


class PolluxPolicy:
    """Pollux's policy (see the module docstring)."""

    def __init__(
        self,
        *,
        population: int = 100,
        generations: int = 100,
        p: float = -1.0,
        seed: int = 0,
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        if population < 2 or generations < 0:
            raise AllocatorError(f"{population=} must be >= 2 and {generations=} >= 0")
        self.name = "pollux"
        self.population = population
        self.generations = generations
        self.p = p
        self._rng = np.random.default_rng(seed)
        # The model view goodput-dp has: batch grid, accumulation, limits, exploration cap.
        self._view = DpPolicy(
            "pollux",
            objective="goodput",
            fixed_batch=False,
            horizon_s=horizon_s,
            accumulate=True,
            fairness=0.0,
        )
        self._previous: tuple[list[str], np.ndarray] | None = None

    # ------------------------------------------------------------------ goodput

    def _tables(self, jobs: Sequence[JobState], specs: list[OptimizerJob], c: Cluster) -> _Tables:
        nodes = len(c.nodes)
        share = c.capacity / max(len(jobs), 1)
        goodput, batch, base = [], [], []
        for job, spec in zip(jobs, specs, strict=True):
            kmax = min(spec.max_gpus, c.capacity)
            g, b = _goodput_grid(job, spec, kmax, min(nodes, kmax))
            goodput.append(g)
            batch.append(b)
            # the best goodput within the fair share, packed (the share may exceed what the
            # job is allowed to explore: the model's prediction there is still its yardstick)
            fair = min(max(math.ceil(share), 1), c.capacity)
            k = np.arange(1, fair + 1, dtype=float)
            bs = np.asarray(spec.batch_sizes, dtype=float)
            x = np.nan_to_num(spec.throughput(k[:, None], bs[None, :]), nan=0.0)
            e = spec.efficiency(bs) if spec.efficiency is not None else 1.0
            best = float((x * e).max())
            base.append(best if best > 0 else 1.0)  # 1.0: it cannot run
        shape = (len(jobs), max(g.shape[0] for g in goodput), max(g.shape[1] for g in goodput))
        padded = None
        if math.prod(shape) <= _PADDED_MAX:
            padded = np.zeros(shape)
            for j, g in enumerate(goodput):
                padded[j, : g.shape[0], : g.shape[1]] = g
        return _Tables(goodput, batch, np.asarray(base), [s.batch_sizes for s in specs], padded)

    # ------------------------------------------------------------------ the search

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        if not jobs:
            return ClusterDecision({}, {}, {}, ())
        # The least-served jobs first (then the oldest): repair gives them a node's GPUs first.
        # Pollux's model is the fitted lines alone (no per node count corrections and no bound
        # on the sync terms' growth: those are ours).
        jobs = sorted(
            (replace(j, model=j.model.extrapolated) for j in jobs),
            key=lambda j: (j.attained_gpu_s, j.arrival),
        )
        specs = [self._view.spec(j, cluster) for j in jobs]
        tables = self._tables(jobs, specs, cluster)
        ids = [j.job_id for j in jobs]
        cap = np.asarray(cluster.nodes)
        current = np.zeros((len(jobs), len(cap)), dtype=np.int64)
        for i, j in enumerate(jobs):
            if j.placement and len(j.placement) == len(cap):
                current[i] = j.placement
        lo = np.array([s.min_gpus for s in specs])
        hi = np.array([min(s.max_gpus, cluster.capacity) for s in specs])
        keep = np.array(
            [
                s.restart_keep(self._view.horizon_s) if j.placement else 1.0
                for j, s in zip(jobs, specs, strict=True)
            ]
        )
        weights = np.array([j.priority for j in jobs], dtype=float)

        unit = len(cap) / cluster.capacity  # a node's worth of GPUs at the fair rate is 1

        def fitness(states: np.ndarray) -> np.ndarray:
            speedups = self._speedups(states, tables, current, keep)
            return power_mean(speedups * unit + ZERO_SPEEDUP, self.p, weights)

        def repair(states: np.ndarray) -> np.ndarray:
            return self._repair(states, cap, lo, hi)

        pop = repair(self._seed(ids, current, cap, hi))
        score = fitness(pop)
        for _ in range(self.generations):
            children = repair(self._mutate(self._crossover(pop), current, cap, hi))
            both = np.concatenate([pop, children])
            scores = np.concatenate([score, fitness(children)])
            order = np.argsort(-scores, kind="stable")[: self.population]
            pop, score = both[order], scores[order]
        self._previous = (ids, pop)
        return self._decision(jobs, pop[0], tables, current, keep, cluster)

    def _speedups(
        self, states: np.ndarray, t: _Tables, current: np.ndarray, keep: np.ndarray
    ) -> np.ndarray:
        k = states.sum(axis=2)
        n = (states > 0).sum(axis=2)
        if t.padded is not None:  # repair keeps k and n within each job's own table
            jobs = np.arange(k.shape[1])[None, :]
            out = t.padded[jobs, n, k] / t.base[None, :]
        else:
            out = np.empty(k.shape)
            for j, table in enumerate(t.goodput):
                kk = np.minimum(k[:, j], table.shape[1] - 1)
                out[:, j] = table[np.minimum(n[:, j], table.shape[0] - 1), kk] / t.base[j]
        moved = (states != current[None]).any(axis=2) & (current.sum(axis=1) > 0)[None]
        out = np.where(moved, out * keep[None], out)
        return out

    def _seed(
        self, ids: list[str], current: np.ndarray, cap: np.ndarray, hi: np.ndarray
    ) -> np.ndarray:
        """The current allocation, the previous population (its rows for the jobs still here),
        and mutants of the current allocation to fill up."""
        seeds = [current[None]]
        if self._previous is not None:
            old_ids, old = self._previous
            index = {k: i for i, k in enumerate(old_ids)}
            if old.shape[2] == current.shape[1]:
                adapted = np.zeros((old.shape[0], *current.shape), dtype=np.int64)
                for i, k in enumerate(ids):
                    if k in index:
                        adapted[:, i] = old[:, index[k]]
                seeds.append(adapted)
        pop = np.concatenate(seeds)[: self.population]
        missing = self.population - len(pop)
        if missing > 0:
            base = np.repeat(current[None], missing, axis=0)
            pop = np.concatenate([pop, self._mutate(base, current, cap, hi)])
        return pop

    def _crossover(self, pop: np.ndarray) -> np.ndarray:
        """Single-point crossover over jobs between random pairs of the population."""
        size, jobs = pop.shape[0], pop.shape[1]
        a = self._rng.integers(size, size=size)
        b = self._rng.integers(size, size=size)
        point = self._rng.integers(jobs + 1, size=size)
        first = np.arange(jobs)[None, :] < point[:, None]
        return np.where(first[:, :, None], pop[a], pop[b])

    def _mutate(
        self, states: np.ndarray, current: np.ndarray, cap: np.ndarray, hi: np.ndarray
    ) -> np.ndarray:
        """Three moves, each job's row on its own: back to its current allocation (probability
        :data:`RESET_P`); some of its cells emptied (a row with probability :data:`DROP_P`,
        then each cell with :data:`DROP_P`); and growth into nodes with free GPUs, a cell to a
        random count between what it holds and what the node has (each free node is picked
        for about one job, and for about one of the jobs already on it)."""
        rng = self._rng
        size, jobs, _ = states.shape
        reset = rng.random((size, jobs)) < RESET_P
        states = np.where(reset[:, :, None], current[None], states)
        drop = (rng.random((size, jobs)) < DROP_P)[:, :, None] & (rng.random(states.shape) < DROP_P)
        states = np.where(drop, 0, states)
        room = (cap[None, :] - states.sum(axis=1)) > 0  # (population, nodes)
        anyone = np.broadcast_to(room[:, None, :] / jobs, states.shape)
        on = (states > 0) & room[:, None, :]
        holders = on / np.maximum(on.sum(axis=1, keepdims=True), 1)
        grow = rng.random(states.shape) < anyone + holders - anyone * holders
        top = np.maximum(np.minimum(cap[None, None, :], hi[None, :, None]), states)
        values = states + np.floor(rng.random(states.shape) * (top - states + 1)).astype(np.int64)
        return np.where(grow, values, states)

    def _repair(
        self, states: np.ndarray, cap: np.ndarray, lo: np.ndarray, hi: np.ndarray
    ) -> np.ndarray:
        states = np.maximum(states, 0)
        # the job's most GPUs, taken over its nodes in a random order
        order = np.argsort(self._rng.random(states.shape), axis=2)
        shuffled = np.take_along_axis(states, order, axis=2)
        clipped = np.diff(np.minimum(shuffled.cumsum(axis=2), hi[None, :, None]), axis=2, prepend=0)
        states = np.take_along_axis(clipped, np.argsort(order, axis=2), axis=2)
        # at most one distributed job per node: the earliest keeps it
        distributed = (states > 0).sum(axis=2) > 1
        on = (states > 0) & distributed[:, :, None]
        states = np.where(on & (on.cumsum(axis=1) > 1), 0, states)
        # node capacity, jobs in arrival order
        states = np.diff(np.minimum(states.cumsum(axis=1), cap[None, None, :]), axis=1, prepend=0)
        # the job's fewest GPUs, else none
        short = states.sum(axis=2) < lo[None, :]
        return np.where(short[:, :, None], 0, states)

    def _decision(
        self,
        jobs: Sequence[JobState],
        best: np.ndarray,
        t: _Tables,
        current: np.ndarray,
        keep: np.ndarray,
        cluster: Cluster,
    ) -> ClusterDecision:
        speedups = self._speedups(best[None], t, current, keep)[0]
        share = cluster.capacity / len(jobs)
        placements: dict[str, tuple[int, ...]] = {}
        batches: dict[str, int] = {}
        reasons: dict[str, str] = {}
        waiting = []
        for i, job in enumerate(jobs):
            row = best[i]
            k, n = int(row.sum()), int((row > 0).sum())
            if k == 0:
                waiting.append(job.job_id)
                reasons[job.job_id] = (
                    f"waiting: the genetic search found no allocation that runs it and keeps "
                    f"the power mean (p={self.p:g}) of the jobs' speedups higher"
                )
                continue
            table = t.batch[i]
            b = t.batch_sizes[i][int(table[min(n, table.shape[0] - 1), min(k, table.shape[1] - 1)])]
            placements[job.job_id] = tuple(int(x) for x in row)
            batches[job.job_id] = int(b)
            reasons[job.job_id] = (
                f"pollux: {k} GPU(s) on {n} node(s), batch {b}: speedup {speedups[i]:.2f} over "
                f"its fair share ({share:.1f} GPUs)"
            )
        return ClusterDecision(placements, batches, reasons, tuple(waiting))


def _goodput_grid(
    job: JobState, spec: OptimizerJob, kmax: int, nmax: int
) -> tuple[np.ndarray, np.ndarray]:
    """Best goodput over the job's batch sizes, and the index of that batch, for every (nodes,
    GPUs) in ``[0, nmax] x [0, kmax]`` (0 where infeasible: more nodes than GPUs, a local batch
    below the smallest)."""
    k = np.arange(1, kmax + 1, dtype=float)
    n = np.arange(1, nmax + 1, dtype=float)
    b = np.asarray(spec.batch_sizes, dtype=float)
    kk, nn, bb = np.meshgrid(k, n, b, indexing="ij")
    x = placed_throughput(job.model, nn, kk, bb, job.local_bsz_range)
    eff = spec.efficiency(bb) if spec.efficiency is not None else 1.0
    good = np.nan_to_num(np.where(nn <= kk, x * eff, 0.0), nan=0.0)
    best = np.zeros((nmax + 1, kmax + 1))
    index = np.zeros((nmax + 1, kmax + 1), dtype=np.int64)
    best[1:, 1:] = good.max(axis=2).T
    index[1:, 1:] = good.argmax(axis=2).T
    return best, index
