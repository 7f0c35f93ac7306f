"""``synergy``: Synergy-TUNE (Mohan et al., "Looking Beyond GPUs for DNN Scheduling on
Multi-Tenant Clusters", OSDI 2022), written from its paper for comparison in the same simulator.

Synergy keeps each job's GPU demand fixed (what it asked for) and its batch size as requested,
and treats the auxiliary resources (CPU cores here; host memory is not modelled) as fungible:

* **Rounds.** As the paper's artifact (``simulator/schedulers/las_synergy_new.py`` at
  msr-fiddle/synergy 1b013c2), every job's lease ends each round (:data:`ROUND_S`, 300 s) and
  the whole cluster is decided afresh: the jobs in line order, each admitted while its GPUs
  fit (a job that does not fit is skipped, a running job no longer admitted is preempted), then
  placed. Between rounds nothing moves: a new job waits for the next round and a finished
  job's GPUs idle until then (unless nothing runs). The round clock is the jobs' ages
  (``JobState.age_s``); a caller that gives none (the live service) gets a round at every
  decision.
* **Order.** Synergy plugs into a base policy (FIFO, SRTF, LAS or FTF in its paper). ``las``
  (the default, the artifact's): continuous least attained service, the fewest GPU-seconds
  first, ties by arrival. ``fifo``: arrival order.
* **Demand.** Each job's demand is the cores per GPU at which its profiled throughput peaks
  (optimistic profiling): here what its input model needs to feed its GPUs at its batch size
  (:meth:`InputModel.cores_for`); a job whose input is not known yet demands its
  GPU-proportional share. A CPU-light job demands less than that share, which frees cores.
* **TUNE placement.** The admitted jobs that ran last round keep their GPUs where these still
  hold their demand (the artifact's deployment extends such a job's lease; its simulator, where
  a move costs nothing, places every job from scratch: ``keep=False``, which here restarts
  jobs for nothing). The others are placed the largest GPU demand first (``las``, as the
  artifact sorts them when tuning; ``fifo`` in arrival order). A job goes to the server with
  the least free resources that fits its whole demand (best fit; GPU by GPU over the servers
  with the fewest free GPUs for a job larger than a server). If none fits, its demand falls to
  the GPU-proportional share and it tries again; if that still does not fit, the jobs on the
  servers it would use that hold more than their proportional share are brought back to it,
  and it is placed there. So no job gets less than its proportional share unless it needs
  less, and every job that the GPUs admit runs. A job placed elsewhere than it ran restarts
  (the simulator charges it).

Validation against the paper: ``benchmarks/allocator/bench_cpu.py --validate`` runs it against
the same scheduler with GPU-proportional cores (``synergy-proportional``) on Synergy's server
shape (8 GPUs and 24 cores); the paper reports up to 3.4x lower average JCT.

Pure code: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dloader.allocator.optimizer import Cluster
from dloader.allocator.policies.state import ClusterDecision, JobState
from dloader.allocator.policies.throughput import throughput_fn
from dloader.errors import AllocatorError

__all__ = ["ROUND_S", "SynergyPolicy"]

_EPS = 1e-9

#: Seconds of a scheduling round (the artifact's ``round_duration``).
ROUND_S = 300.0


class SynergyPolicy:
    """Synergy-TUNE with fixed GPU demands over a base order (see the module docstring)."""

    def __init__(
        self, order: str = "las", *, tune: bool = True, round_s: float = ROUND_S, keep: bool = True
    ) -> None:
        """``tune=False``: the same scheduler with GPU-proportional cores (Synergy's baseline,
        for its validation). ``keep=False``: every job placed from scratch each round, as the
        artifact's simulator (where a move costs nothing) does."""
        if order not in ("las", "fifo"):
            raise AllocatorError(f"order={order!r}: expected 'las' or 'fifo'")
        if not round_s > 0:
            raise AllocatorError(f"round_s={round_s!r}: expected seconds > 0")
        self.order, self.tune, self.round_s, self.keep = order, tune, round_s, keep
        self.name = "synergy" if order == "las" else f"synergy-{order}"
        if not tune:
            self.name += "-proportional"
        #: The last round: when it began (None: unknown), the cluster and what was decided.
        self._last: tuple[float | None, Cluster, ClusterDecision] | None = None

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        ages = [j.arrival + j.age_s for j in jobs if j.age_s is not None]
        now = max(ages) if ages else None
        held = self._between_rounds(jobs, cluster, now)
        if held is not None:
            return held
        decision = self._round(jobs, cluster)
        self._last = (now, cluster, decision)
        return decision

    def _between_rounds(
        self, jobs: Sequence[JobState], cluster: Cluster, now: float | None
    ) -> ClusterDecision | None:
        """The last round's decision for the jobs still active, or None when a round is due:
        its time has come, the clock or the cluster is not the one it was decided on, a job
        does not hold what it was given, or nothing it placed still runs."""
        if self._last is None or now is None:
            return None
        began, was, last = self._last
        if began is None or was != cluster or now >= began + self.round_s - _EPS:
            return None
        if any(j.placement and j.placement != last.placements.get(j.job_id) for j in jobs):
            return None
        ids = {j.job_id for j in jobs}
        placements = {k: v for k, v in last.placements.items() if k in ids}
        if not placements:
            return None
        nxt = began + self.round_s
        reasons = {
            j.job_id: last.reasons[j.job_id]
            if j.job_id in placements
            else f"waiting for the round at {nxt:.0f} s"
            for j in jobs
        }
        return ClusterDecision(
            placements,
            {k: last.batch_sizes[k] for k in placements},
            reasons,
            tuple(j.job_id for j in jobs if j.job_id not in placements),
            {k: v for k, v in last.cores.items() if k in placements},
        )

    def _round(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        """Every lease ended: admits in line order while the GPUs fit, places afresh."""
        if self.order == "fifo":
            line = sorted(jobs, key=lambda j: (j.arrival, j.job_id))
        else:
            line = sorted(jobs, key=lambda j: (j.attained_gpu_s, j.arrival, j.job_id))
        admitted: list[tuple[JobState, int]] = []
        free = cluster.capacity
        reasons: dict[str, str] = {}
        waiting: list[str] = []
        for j in line:
            need = min(j.requested_gpus, cluster.capacity)
            if need <= free:
                admitted.append((j, need))
                free -= need
                reasons[j.job_id] = f"{'runs' if j.placement else 'starts'} on {need} GPU(s)"
            else:
                waiting.append(j.job_id)
                was = "preempted; " if j.placement else ""
                reasons[j.job_id] = (
                    f"{was}waiting, {len(waiting)} in line: needs {need} GPU(s), {free} free"
                )
        if self.order == "las" and self.tune:  # the artifact places the largest first
            admitted.sort(key=lambda a: -a[1])
        if self.keep:  # the running jobs first: each keeps its GPUs where they still fit
            admitted.sort(key=lambda a: not a[0].placement)
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
        """Places the admitted jobs in the order given (with ``keep``, a running one where it
        ran if that still holds its demand) and gives each its cores."""
        gpus = np.array(cluster.nodes, dtype=np.int64)
        limited = cluster.cpus is not None
        cpus = np.array(cluster.cpus if limited else [0.0] * len(gpus), dtype=float)
        fair = cpus / gpus  # the GPU-proportional share per GPU (0: cores unlimited)
        free, free_cpu = gpus.copy(), cpus.copy()
        placements: dict[str, tuple[int, ...]] = {}
        cores: dict[str, np.ndarray] = {}
        for job, k in admitted:
            demand = self._demand(job, k, cluster) if limited and self.tune else None
            share = self._kept(job, demand, free, free_cpu, fair) if self.keep else None
            if share is None:
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
    def _kept(
        job: JobState,
        demand: float | None,
        free: np.ndarray,
        free_cpu: np.ndarray,
        fair: np.ndarray,
    ) -> np.ndarray | None:
        """A running job's GPUs if they are still free and hold its demand (its lease
        extended, as the artifact's deployment does when a job's allocation is unchanged)."""
        if len(job.placement) != len(free):
            return None
        held = np.array(job.placement, dtype=np.int64)
        per = fair if demand is None else np.full(len(free), demand)
        if (held <= free).all() and (held * per <= free_cpu + _EPS).all():
            return held
        return None

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
