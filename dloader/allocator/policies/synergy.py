"""``synergy``: Synergy-TUNE (Mohan et al., "Looking Beyond GPUs for DNN Scheduling on
Multi-Tenant Clusters", OSDI 2022), written from its paper for comparison in the same simulator.

Synergy keeps each job's GPU demand fixed (what it asked for) and its batch size as requested,
and treats the auxiliary resources (CPU cores here; host memory is not modelled) as fungible:

* **Order.** Synergy plugs into a base policy (FIFO, SRTF, LAS or FTF in its paper). ``las``
  (the default here, the stronger in this simulator): Tiresias' discretised least attained
  service, two queues split at :data:`LAS_THRESHOLD_GPU_S` GPU-seconds, first come first served
  within a queue; jobs are admitted in that order while their GPUs fit (a job that does not fit
  is skipped), and a running job no longer admitted is preempted. ``fifo`` (its simulator's
  default configuration): strict first come first served, a running job never preempted.
* **Demand.** Each job's demand is the cores per GPU at which its profiled throughput peaks
  (optimistic profiling): here what its input model needs to feed its GPUs at its batch size
  (:meth:`InputModel.cores_for`); a job whose input is not known yet demands its
  GPU-proportional share. A CPU-light job demands less than that share, which frees cores.
* **TUNE placement.** A job goes to the server with the least free resources that fits its
  whole demand (best fit; GPU by GPU over the servers with the fewest free GPUs for a job larger
  than a server). If none fits, its demand falls to the GPU-proportional share and it tries
  again; if that still does not fit, the jobs on the servers it would use that hold more than
  their proportional share are brought back to it, and it is placed there. So no job gets less
  than its proportional share unless it needs less, and every job that the GPUs admit runs.
* A running job that stays admitted keeps its GPUs (no migration); its cores are re-tuned
  every round.

Validation against the paper: ``benchmarks/allocator/bench_cpu.py --validate`` runs it against
the same scheduler with GPU-proportional cores (``static``) on an image-heavy mix on Synergy's
server shape (8 GPUs and 24 cores); the paper reports up to 3.4x lower average JCT.

Pure code: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dloader.allocator.optimizer import Cluster
from dloader.allocator.policies.state import ClusterDecision, JobState
from dloader.allocator.policies.throughput import throughput_fn
from dloader.errors import AllocatorError

__all__ = ["LAS_THRESHOLD_GPU_S", "SynergyPolicy"]

_EPS = 1e-9


#: Tiresias' discretised LAS: a job's queue is the number of these thresholds (GPU-seconds
#: attained) it has passed.
LAS_THRESHOLD_GPU_S = (3600.0,)


class SynergyPolicy:
    """Synergy-TUNE with fixed GPU demands over a base order (see the module docstring)."""

    def __init__(self, order: str = "las", *, tune: bool = True) -> None:
        """``tune=False``: the same scheduler with GPU-proportional cores (Synergy's baseline,
        for its validation)."""
        if order not in ("las", "fifo"):
            raise AllocatorError(f"order={order!r}: expected 'las' or 'fifo'")
        self.order, self.tune = order, tune
        self.name = "synergy" if order == "las" else f"synergy-{order}"
        if not tune:
            self.name += "-proportional"

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        if self.order == "fifo":  # running jobs first, never preempted; then strict FIFO
            line = sorted(jobs, key=lambda j: not j.placement)
        else:
            line = sorted(jobs, key=lambda j: (_queue(j.attained_gpu_s), j.arrival, j.job_id))
        admitted: list[tuple[JobState, int]] = []
        free = cluster.capacity
        reasons: dict[str, str] = {}
        waiting: list[str] = []
        for j in line:
            need = j.gpus or min(j.requested_gpus, cluster.capacity)
            blocked = self.order == "fifo" and bool(waiting)
            if not blocked and need <= free:
                admitted.append((j, need))
                free -= need
                reasons[j.job_id] = "keeps its GPUs" if j.placement else f"starts on {need} GPU(s)"
            else:
                waiting.append(j.job_id)
                was = "preempted; " if j.placement else ""
                reasons[j.job_id] = (
                    f"{was}waiting, {len(waiting)} in line: needs {need} GPU(s), {free} free"
                )
        # the jobs that keep their GPUs, then the new ones
        admitted = [a for a in admitted if a[0].placement] + [
            a for a in admitted if not a[0].placement
        ]
        placements, cores = self._tune(admitted, cluster)
        for job_id, c in cores.items():
            reasons[job_id] += f"; {sum(c):.1f} cores"
        batches = {j.job_id: j.requested_batch for j, _ in admitted}
        order = {j.job_id: i for i, j in enumerate(jobs)}
        waiting.sort(key=order.__getitem__)
        return ClusterDecision(placements, batches, reasons, tuple(waiting), cores)

    @staticmethod
    def _demand(job: JobState, k: int, cluster: Cluster) -> float | None:
        """Cores per GPU the job needs to feed ``k`` GPUs at its batch (None: unknown)."""
        if job.input is None:
            return None
        fn = throughput_fn(job.model, cluster.gpus_per_node, job.local_bsz_range)
        x = fn(np.array([float(k)]), np.array([float(job.requested_batch)]))
        rate = float(np.nan_to_num(x, nan=0.0)[0])
        return job.input.cores_for(rate / k) if rate > 0 else None  # one GPU's pipeline

    def _tune(
        self, admitted: list[tuple[JobState, int]], cluster: Cluster
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[float, ...]]]:
        """Places the admitted jobs (running ones first) and gives each its cores."""
        gpus = np.array(cluster.nodes, dtype=np.int64)
        limited = cluster.cpus is not None
        cpus = np.array(cluster.cpus if limited else [0.0] * len(gpus), dtype=float)
        fair = cpus / gpus  # the GPU-proportional share per GPU (0: cores unlimited)
        free, free_cpu = gpus.copy(), cpus.copy()
        placements: dict[str, tuple[int, ...]] = {}
        cores: dict[str, np.ndarray] = {}
        for job, k in admitted:
            demand = self._demand(job, k, cluster) if limited and self.tune else None
            share: np.ndarray | None
            if job.placement:
                share = np.array(job.placement, dtype=np.int64)
            else:
                share = self._fit(k, demand, free, free_cpu, fair, gpus)
                if share is None and demand is not None:  # its demand fits nowhere:
                    demand = None  # the proportional share
                    share = self._fit(k, None, free, free_cpu, fair, gpus)
                if share is None:  # place it; the peers above their share give way below
                    share = self._any(k, free)
                if share is None:
                    continue
            free -= share
            placements[job.job_id] = tuple(int(g) for g in share)
            if not limited:
                continue
            per = fair if demand is None else np.full(len(gpus), demand)
            want = share * per
            floor = share * np.minimum(per, fair)  # never below its share, unless it needs less
            short = np.maximum(floor - free_cpu, 0.0)
            if (short > _EPS).any():
                self._reclaim(short, fair, cores, placements, free_cpu)
            got = np.minimum(np.maximum(np.minimum(want, free_cpu), floor), free_cpu)
            got = np.where(share > 0, np.maximum(got, 0.0), 0.0)
            free_cpu -= got
            cores[job.job_id] = got
        return placements, {j: tuple(float(c) for c in v) for j, v in cores.items()}

    @staticmethod
    def _fit(
        k: int,
        demand: float | None,
        free: np.ndarray,
        free_cpu: np.ndarray,
        fair: np.ndarray,
        gpus: np.ndarray,
    ) -> np.ndarray | None:
        """GPUs per node for ``k`` GPUs whose every GPU gets ``demand`` cores (None: its
        proportional share) on the servers with the least free resources, or None."""
        per = fair if demand is None else np.full(len(free), demand)
        fits = np.where(per > 0, np.floor((free_cpu + _EPS) / np.maximum(per, _EPS)), np.inf)
        room = np.minimum(free, fits).astype(np.int64)
        share = np.zeros(len(free), dtype=np.int64)
        if k <= int(gpus.max()):  # one server: the least free one that holds it all
            ok = room >= k
            if not ok.any():
                return None
            key = np.where(ok, free * 1e6 + free_cpu, np.inf)
            share[int(np.argmin(key))] = k
            return share
        # larger than a server: GPU by GPU, servers with the fewest free GPUs first
        return _fill(k, room, np.lexsort((free_cpu, free)))

    @staticmethod
    def _any(k: int, free: np.ndarray) -> np.ndarray | None:
        """``k`` GPUs wherever they are free (the fullest servers first), or None."""
        return _fill(k, free, np.argsort(free, kind="stable"))

    @staticmethod
    def _reclaim(
        short: np.ndarray,
        fair: np.ndarray,
        cores: dict[str, np.ndarray],
        placements: dict[str, tuple[int, ...]],
        free_cpu: np.ndarray,
    ) -> None:
        """Brings jobs holding more than their proportional share on the nodes ``short`` of
        cores back toward that share, until the shortfall is covered."""
        for job_id, got in cores.items():
            above = np.maximum(got - np.array(placements[job_id]) * fair, 0.0)
            give = np.minimum(above, short)
            got -= give
            free_cpu += give
            short -= give
            if (short <= _EPS).all():
                return


def _fill(k: int, room: np.ndarray, order: np.ndarray) -> np.ndarray | None:
    """GPUs per node for ``k`` GPUs taken node by node in ``order``, at most ``room`` on each;
    None if they do not add up to ``k``."""
    share = np.zeros(len(room), dtype=np.int64)
    left = k
    for node in order:
        take = min(int(room[node]), left)
        share[node] = take
        left -= take
        if not left:
            return share
    return None


def _queue(attained_gpu_s: float) -> int:
    """The LAS queue of a job that has attained this many GPU-seconds (0 first)."""
    return sum(attained_gpu_s >= t for t in LAS_THRESHOLD_GPU_S)
