"""Prometheus metrics of the sidecar (prometheus-client), on their own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from dloader.sidecar.core import NodeCore

__all__ = ["Metrics"]


class Metrics:
    """Per-job and node gauges, refreshed by :meth:`update`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["job_id", "name"]
        r = self.registry
        self.tput = Gauge(
            "dloader_job_samples_per_second", "Delivered samples/s", labels, registry=r
        )
        self.idle = Gauge(
            "dloader_job_idle_share",
            "Share of time the trainer waited for data",
            labels,
            registry=r,
        )
        self.workers = Gauge("dloader_job_workers", "Loader workers", labels, registry=r)
        self.batch = Gauge("dloader_job_batch_size", "Batch size", labels, registry=r)
        self.cpu = Gauge(
            "dloader_job_cpu_percent", "CPU of the job's process tree, 100/core", labels, registry=r
        )
        self.jobs = Gauge("dloader_node_jobs", "Registered jobs", registry=r)
        self.node_cpu = Gauge("dloader_node_cpu_percent", "Node CPU, 100 per core", registry=r)
        self.sum_norm = Gauge(
            "dloader_node_normalized_throughput",
            "Sum over jobs of samples/s / accelerator limit",
            registry=r,
        )

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serves /metrics over HTTP."""
        start_http_server(port, addr=host, registry=self.registry)

    def update(self, core: NodeCore, node_cpu: float, sum_normalized: float) -> None:
        """Refreshes every gauge from the core's view (stale job series are removed)."""
        for g in (self.tput, self.idle, self.workers, self.batch, self.cpu):
            g.clear()
        for job in core.jobs.values():
            lab = (job.job_id, job.record.name)
            r = job.last_report
            self.tput.labels(*lab).set(r.samples_per_second if r else 0.0)
            self.idle.labels(*lab).set(r.idle_share if r else 0.0)
            self.workers.labels(*lab).set(job.record.num_workers)
            self.batch.labels(*lab).set(job.record.batch_size)
            self.cpu.labels(*lab).set(job.tree.cpu_percent if job.tree else 0.0)
        self.jobs.set(len(core.jobs))
        self.node_cpu.set(node_cpu)
        self.sum_norm.set(sum_normalized)
