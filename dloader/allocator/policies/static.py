"""``static``: each job gets the GPUs and batch size it asked for, first come first served; a
running job is never changed."""

from __future__ import annotations

from collections.abc import Sequence

from dloader.allocator.optimizer import Cluster, place
from dloader.allocator.policies.state import ClusterDecision, JobState, held_placements

__all__ = [
    "StaticPolicy",
]


class StaticPolicy:
    """Requested GPUs and batch size, strict FIFO; running jobs are left alone."""

    name = "static"

    def decide(self, jobs: Sequence[JobState], cluster: Cluster) -> ClusterDecision:
        counts = {j.job_id: j.gpus for j in jobs if j.placement}
        free = cluster.capacity - sum(counts.values())
        waiting: list[str] = []
        reasons: dict[str, str] = {}
        for j in jobs:
            if j.placement:
                continue
            need = min(j.requested_gpus, cluster.capacity)
            if not waiting and need <= free:
                counts[j.job_id] = need
                free -= need
                reasons[j.job_id] = f"start on the requested {need} GPU(s)"
            else:
                waiting.append(j.job_id)
                reasons[j.job_id] = (
                    f"waiting, {len(waiting)} in line: needs {need} GPU(s), {free} free"
                )
        placements = place(counts, cluster, held_placements(jobs))
        requested = {j.job_id: j.requested_batch for j in jobs}
        batches = {k: requested[k] for k in placements}
        return ClusterDecision(placements, batches, reasons, tuple(waiting))
