"""What the allocator benchmarks compare against: the data shipped with the package and the
average JCTs published for it (Pollux, OSDI 2021, Table 2-3: its own policy and Tiresias on
workloads 1-4, 64 GPUs)."""

from __future__ import annotations

from dloader.allocator.traces import PACKAGED_TRACES

#: The data shipped with the package: pollux/traces, pollux/workloads, philly/philly.csv.gz.
DATA = PACKAGED_TRACES.parents[1]
#: Pollux's own policy, average JCT in hours, per workload.
POLLUX_H = {1: 0.58, 2: 0.92, 3: 0.61, 4: 0.76}
#: Tiresias, average JCT in hours, per workload (as Pollux published it).
TIRESIAS_H = {1: 0.69, 2: 1.43, 3: 1.08, 4: 0.91}
