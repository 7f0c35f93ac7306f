"""The loader -> sidecar report, built from a loader's stats."""

from __future__ import annotations

from dloader._engine.telemetry import LoaderStats, WorkerStats
from dloader._shared.node_messages import JobReport


def stats(*workers: WorkerStats) -> LoaderStats:
    return LoaderStats(
        timestamp=0.0, num_workers=2, batch_size=32, samples=640, batches=20, epoch=1,
        wait_total_seconds=1.0, window_seconds=5.0, samples_per_second=128.0,
        wait_seconds=0.5, step_seconds=0.25, idle_share=0.1, queue_depth=0, in_flight=2,
        workers=workers,
    )  # fmt: skip


def test_a_report_carries_each_local_workers_window_and_leaves_out_remote_ones() -> None:
    """A worker with batches in the window (its start-up batch not among them) is reported by
    the window's means and timed wait; one without any, by its moving averages and no wait; a
    remote worker (its PID is another node's) not at all: the node's model is of this node's
    CPU."""
    timed = WorkerStats(0, 101, "ready", 9, 1, 0.9, 0.5, 4.0, window_batches=8,
                        window_fetch_seconds=0.3, window_cpu_seconds=0.2,
                        window_run_delay_seconds=0.05)  # fmt: skip
    idle = WorkerStats(1, 102, "ready", 1, 1, 0.7, 0.1, 0.1)
    remote = WorkerStats(1000, 9, "ready", 5, 1, 0.2, 0.2, 1.0, remote=True, window_batches=4,
                         window_fetch_seconds=0.2, window_cpu_seconds=0.2)  # fmt: skip
    r = JobReport.from_stats(stats(timed, idle, remote), 1.0)
    assert [(w.pid, w.fetch_seconds, w.cpu_seconds, w.batches, w.run_delay_seconds)
            for w in r.workers] == [(101, 0.3, 0.2, 9, 0.05), (102, 0.7, 0.1, 1, None)]  # fmt: skip
    assert (r.num_workers, r.batch_size, r.samples_per_second) == (2, 32, 128.0)


def test_a_report_carries_the_share_of_the_declared_epochs_done() -> None:
    from dataclasses import replace

    assert JobReport.from_stats(stats(), 1.0).done == 0.0  # none declared
    r = JobReport.from_stats(replace(stats(), done=0.4), 1.0)
    assert r.done == 0.4
    assert JobReport.from_pb(r.to_pb("j", "t")).done == 0.4
    assert JobReport.from_json(r.to_json()).done == 0.4
