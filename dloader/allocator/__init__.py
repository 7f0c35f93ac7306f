"""The cluster-level elastic GPU allocator.

* :mod:`.optimizer`: the dynamic-programming optimizer (GPU count and batch size per job)
  and node packing. Pure code.
* :mod:`.policies`: the policies over plain job states, shared by the simulator and the live
  service (:data:`POLICIES`, the registry's names: what ``--policy`` accepts). Pure code.
* :mod:`.traces`: application behaviour from the Pollux traces (the simulator's truth) and
  workload readers; the traces ship with the package (``data/``, see ``data/NOTICE.md``).
* :mod:`.simulator`: the trace-driven simulator behind ``dloader-sim``.
* :mod:`.core`, :mod:`.server`: the ``ClusterAllocator`` service and its autoscaler loop;
  :mod:`.config`: its settings.
"""

from dloader.allocator.optimizer import Assignment, Cluster, OptimizerJob, Plan, optimize, place
from dloader.allocator.policies import POLICIES, make_policy
from dloader.errors import AllocatorError

__all__ = [
    "POLICIES",
    "AllocatorError",
    "Assignment",
    "Cluster",
    "OptimizerJob",
    "Plan",
    "make_policy",
    "optimize",
    "place",
]
