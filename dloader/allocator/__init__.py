"""The cluster-level elastic GPU allocator.

* :mod:`allocator.optimizer`: the dynamic-programming optimizer (GPU count and batch size per
  job) and node packing. Pure code.
* :mod:`allocator.policies`: the policies (``static``, ``elastic-gpu``, ``elastic-dp``,
  ``goodput-dp``) over plain job states, shared by the simulator and the live service.
* :mod:`allocator.traces`: application behaviour from the Pollux traces (the simulator's truth)
  and workload readers.
* :mod:`allocator.simulator`: the trace-driven simulator behind ``dloader-sim``.
* :mod:`allocator.service`: the ``ClusterAllocator`` gRPC service and its autoscaler loop.
"""

from dloader.allocator.optimizer import Assignment, Cluster, JobSpec, Plan, optimize, place
from dloader.errors import AllocatorError

__all__ = [
    "AllocatorError",
    "Assignment",
    "Cluster",
    "JobSpec",
    "Plan",
    "optimize",
    "place",
]
