"""The node policy: how many loader workers each job gets. Pure code: plain values in and out.

The whole decision sits behind one object, :class:`NodePolicy` (:mod:`.node`): every job's
state and what it learnt from its measurements in, the split out; the sidecar's core feeds it
and enacts what it decides. Its parts: :mod:`.views` (what it sees and answers),
:mod:`.allocation` (the model-led allocation), :mod:`.sharing` (how cores are shared),
:mod:`.learning` (the learning gate), :mod:`.measured` (measured truth over the model, and its
probe state machine).

``even``: the node's worker budget split equally (the baseline), within each job's limits.

``adaptive`` (A-Dloader's knob): maximise the sum over jobs of predicted throughput normalised
by the job's accelerator limit (equivalently: minimise accelerator idle), subject to

* the node's loader-worker budget ``sum k_j <= W``;
* the node's ``C`` cores, shared the way the OS shares them (:func:`cpu_shares`): job ``j``
  with ``k_j`` workers demands ``d_j = T_j(k_j) * cpu_j + k_j * u_j`` cores (``cpu_j``: CPU
  seconds per sample of its loader, from its model; ``u_j``: what each worker costs beyond its
  samples, waking, sending batches, idling, measured from its process tree), and its training
  process ``T_j(k_j) * main_j`` (CPU per sample, measured by the sidecar's process monitor).
  When the demands exceed ``C``, the scheduler gives each thread an equal share: a consumer
  that needs less than its share gets what it needs and the rest is split among the others by
  thread count. A job runs at its
  prediction scaled by the smaller fraction of demand its workers or its training process get,
  so a worker added to a CPU-bound job on a full node is worth what it takes from the other
  jobs, not what it would do alone;
* each job's own limits, and a floor of one worker (no job is starved);
* the node's memory budget ``sum k_j * m_j <= M``, ``m_j`` what one more worker of job ``j``
  costs (the private memory, USS, its workers reach: forked workers copy the dataset pages
  Python touches). No decision takes the node past ``M``: where even one worker per job would,
  the floors drop to the jobs' ``min_workers`` (0: loading in the training process), and a
  job whose next worker would gain but does not fit is reported as limited by memory. While a
  job's workers' memory still grows, it grows only to counts at which all its workers fit at
  the most one may come to hold (``worker_memory_bound``: the memory it shares with its
  trainer and may yet copy); the workers it has are counted at what they hold.

It allocates greedily: every job starts at its floor and the next worker goes to the job whose
extra worker raises the node's objective (under that CPU sharing) the most, until none adds
more than ``min_gain``; then single-worker moves between jobs (or removals) are made while they
gain, since the shared cores couple the jobs. An I/O-bound job (workers computing at most
``HEDGE_BUSY`` of the time) then gets spare workers, as many as would carry its throughput were
its storage ``HEDGE_COST`` times slower, where the budgets allow and the objective does not
drop for them: a few thousandths of a core each buy the windows a slower storage would otherwise
cost before the model sees it. It is fast: jobs x workers predictions, and one
vectorised evaluation of the sharing model per step (all of a step's trial allocations at
once): about 10 ms for 10 jobs and 64 workers. A model update calls for a new decision only
once the job's curve has moved by ``CURVE_MOVE`` since the decision it runs under. A job with
no observation yet, or one whose loader reports no worker timings and that has fewer than
``warmup`` observations, is explored instead (:func:`~dloader.predictor.exploration_plan`): one
window with its workers' timings gives each worker's I/O and CPU time per sample, from which
the model places the job at once. A new allocation replaces the previous one only if its
predicted objective is higher by ``hysteresis`` (no thrashing), or if it only releases workers
at no predicted loss.

Measured truth over the model (:func:`measured_guard`, :func:`probe`; the core keeps the
:class:`Measurements`): the model proposes, windows measured under the same neighbours decide;
a split moved to is measured before the next move.
Each split of the node (every job's worker count) is scored by what its jobs measured there,
steady, normalised by their accelerator limits. A proposal measured worse than the current
split is not taken; a split measured worse than the one left for it goes back to that one.
Steady at a measured split, the node tries the neighbour (one worker added, removed or moved)
the model ranks best among the near-ties it has not measured lately: where the model cannot
tell, measuring can (no worker is given to a job with less room to its accelerator limit than a
probe must gain to stay: it could not pay; and no probe is made that a split measured within
``PROBE_REACH`` workers of it, plus the model's difference, says would not stay). A probe that
pays is followed by the same move once more (a local search that follows a slope measured to
pay, one worker at a time). On a node whose cores the model says are all taken, near-ties that
give a CPU-bound job a worker less come first (more runnable threads than cores cost switching
and the trainers' wait for a core, which the model's sharing does not see). A probe stays only
if it measures better (such a lighter one: if it measures no worse; a tie goes to fewer
threads); each that does not doubles the wait before the next. Whether a difference is noise
is judged from each job's window-to-window spread pooled over every split it was measured at
(``WINDOW_SPREAD`` until its windows say otherwise), not from the two windows of each split;
a probe that fails its bar by less than that noise is measured longer (up to
``PROBE_WINDOWS`` windows) before it is judged. Measurements are forgotten after
``MEASURE_STALE_S`` (costs change), and all at once when a job measures unlike before at the
same split beyond their usual spread (``MEASURE_CHANGED``, ``CHANGE_Z``: its costs, or a
neighbour's, changed under it); the probe under way goes with them (judged against nothing, it
would "pay"), and the model's next proposal runs.
"""

from dloader.sidecar.node_policy.allocation import (
    CPU_BOUND_WORKER,
    CURVE_MOVE,
    HEDGE_COST,
    MAX_SPARE,
    curve_moved,
    decide,
    expected,
    fits,
    heavier,
)
from dloader.sidecar.node_policy.learning import (
    CHANGE_Z,
    COST_CHANGE,
    COST_HISTORY,
    DRIFT_WINDOWS,
    FIRST_WINDOW_S,
    MIN_WINDOW_S,
    SETTLE_S,
    SPLIT_MOVED_CHANGE,
    STEADY_AFTER,
    STEADY_EVERY,
    SURPRISE,
    CostChange,
    Learning,
    cost_change,
    learning_gate,
    run_queue_wait,
    steady_window,
)
from dloader.sidecar.node_policy.measured import (
    MAX_SPLITS,
    MEASURE_CHANGED,
    MEASURE_MARGIN,
    MEASURE_STALE_S,
    MEASURE_WINDOWS,
    NOISE_Z,
    PROBE_AFTER_S,
    PROBE_GAIN,
    PROBE_HOLD_S,
    PROBE_LOSS,
    PROBE_MAX_WAIT_S,
    PROBE_REACH,
    PROBE_WINDOWS,
    RELEASE_LOSS,
    WINDOW_SPREAD,
    MeasuredTruth,
    Measurements,
    Probe,
    Split,
    measured_guard,
    probe,
    same_jobs,
    show_split,
    split_of,
    undecided,
)
from dloader.sidecar.node_policy.node import (
    CORES_STEP,
    EVENT_KINDS,
    EWMA,
    MAIN_CPU_CHANGE,
    MAX_MAIN_CPU_PER_SAMPLE,
    MAX_UPKEEP_CORES,
    MEMORY_CHANGE,
    MEMORY_FLAT_S,
    MEMORY_GROWTH,
    MIN_ACTIVITY,
    TARGET_CHANGE,
    UNPLACED_NICE_S,
    Decided,
    NodePolicy,
    Order,
    PolicyEvent,
    PolicyJob,
    Reported,
)
from dloader.sidecar.node_policy.sharing import cpu_sets, cpu_shares, trainer_weight
from dloader.sidecar.node_policy.views import (
    POLICIES,
    Budget,
    Candidate,
    JobView,
    ReportWindow,
    TreeSample,
    WorkerDecision,
    bounds,
    check_policy,
)

__all__ = [
    "CHANGE_Z",
    "CORES_STEP",
    "COST_CHANGE",
    "COST_HISTORY",
    "CPU_BOUND_WORKER",
    "CURVE_MOVE",
    "DRIFT_WINDOWS",
    "EVENT_KINDS",
    "EWMA",
    "FIRST_WINDOW_S",
    "HEDGE_COST",
    "MAIN_CPU_CHANGE",
    "MAX_MAIN_CPU_PER_SAMPLE",
    "MAX_SPARE",
    "MAX_SPLITS",
    "MAX_UPKEEP_CORES",
    "MEASURE_CHANGED",
    "MEASURE_MARGIN",
    "MEASURE_STALE_S",
    "MEASURE_WINDOWS",
    "MEMORY_CHANGE",
    "MEMORY_FLAT_S",
    "MEMORY_GROWTH",
    "MIN_ACTIVITY",
    "MIN_WINDOW_S",
    "NOISE_Z",
    "POLICIES",
    "PROBE_AFTER_S",
    "PROBE_GAIN",
    "PROBE_HOLD_S",
    "PROBE_LOSS",
    "PROBE_MAX_WAIT_S",
    "PROBE_REACH",
    "PROBE_WINDOWS",
    "RELEASE_LOSS",
    "SETTLE_S",
    "SPLIT_MOVED_CHANGE",
    "STEADY_AFTER",
    "STEADY_EVERY",
    "SURPRISE",
    "TARGET_CHANGE",
    "UNPLACED_NICE_S",
    "WINDOW_SPREAD",
    "Budget",
    "Candidate",
    "CostChange",
    "Decided",
    "JobView",
    "Learning",
    "MeasuredTruth",
    "Measurements",
    "NodePolicy",
    "Order",
    "PolicyEvent",
    "PolicyJob",
    "Probe",
    "ReportWindow",
    "Reported",
    "Split",
    "TreeSample",
    "WorkerDecision",
    "bounds",
    "check_policy",
    "cost_change",
    "cpu_sets",
    "cpu_shares",
    "curve_moved",
    "decide",
    "expected",
    "fits",
    "heavier",
    "learning_gate",
    "measured_guard",
    "probe",
    "run_queue_wait",
    "same_jobs",
    "show_split",
    "split_of",
    "steady_window",
    "trainer_weight",
    "undecided",
]
