"""Prometheus metrics of the sidecar (prometheus-client), on their own registry.

A collector: the values are read from the core when ``/metrics`` is scraped, so nothing runs
between scrapes (and nothing at all when no port is served).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dloader.sidecar.core import NodeCore

__all__ = ["Metrics"]

_JOB = ["job_id", "name"]
_PER_JOB = {
    "samples_per_second": "Delivered samples/s",
    "idle_share": "Share of time the trainer waited for data",
    "workers": "Loader workers",
    "batch_size": "Batch size",
    "cpu_percent": "CPU of the job's process tree, 100/core",
    "done": "Share of its declared epochs done (DataLoader(epochs=N); 0: none declared)",
}


class Metrics(Collector):
    """Per-job and node gauges of ``core``; ``node_cpu`` and ``sum_normalized`` give the node's
    CPU (100 per core) and its sum of samples/s over accelerator limits."""

    def __init__(
        self,
        core: NodeCore,
        node_cpu: Callable[[], float],
        sum_normalized: Callable[[], float],
    ) -> None:
        self.core, self.node_cpu, self.sum_normalized = core, node_cpu, sum_normalized
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serves /metrics over HTTP."""
        start_http_server(port, addr=host, registry=self.registry)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges now (the scrape's thread; the job table is copied in one step)."""
        jobs = list(self.core.jobs.values())
        families = {
            k: GaugeMetricFamily(f"dloader_job_{k}", doc, labels=_JOB)
            for k, doc in _PER_JOB.items()
        }
        for job in jobs:
            lab = [job.job_id, job.record.name]
            r = job.last_report
            families["samples_per_second"].add_metric(lab, r.samples_per_second if r else 0.0)
            families["idle_share"].add_metric(lab, r.idle_share if r else 0.0)
            families["workers"].add_metric(lab, job.record.num_workers)
            families["batch_size"].add_metric(lab, job.record.batch_size)
            families["cpu_percent"].add_metric(lab, job.tree.cpu_percent if job.tree else 0.0)
            families["done"].add_metric(lab, r.done if r else 0.0)
        yield from families.values()
        yield GaugeMetricFamily("dloader_node_jobs", "Registered jobs", value=len(jobs))
        yield GaugeMetricFamily(
            "dloader_node_cpu_percent", "Node CPU, 100 per core", value=self.node_cpu()
        )
        yield GaugeMetricFamily(
            "dloader_node_normalized_throughput",
            "Sum over jobs of samples/s / accelerator limit",
            value=self.sum_normalized(),
        )
