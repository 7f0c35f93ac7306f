"""``dloaderctl doctor``: a node self-check to run before trusting dloader on a node.

Each check gives a row: what was checked, ``ok`` / ``warn`` / ``fail`` / ``skip``, what was
found, and what to do about it. The checks:

* **NVML**: the library and driver, the GPUs, per-process accounting (which processes use a
  GPU: how the sidecar tells GPU jobs apart);
* **cgroup v2**: the ``cpu`` controller (``--cgroup-weights``), ``cpuset``, whether this user may
  write CPU weights; the CPUs this process may use (affinity, the cgroup CPU quota as
  ``num_workers="auto"`` reads it: :mod:`dloader._shared.host`);
* **the sidecar's socket**: it exists, its folder and mode let the jobs' users in, and the
  sidecar answers its health check;
* **a real loader** (``python -m dloader.apps.probe`` in a subprocess: the sidecar's tools import
  no torch): the trainer's data-wait share against NVML utilisation, and the host-to-device copy
  rate from pinned and from pageable memory, on the GPU when there is one.

Without a GPU the GPU rows say so and the rest is checked. Exit status: 1 if a check failed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dloader._shared import host
from dloader._shared.client import Endpoint, serving_status
from dloader.sidecar import cgroups

__all__ = [
    "Check",
    "cgroup_checks",
    "checks",
    "loader_checks",
    "nvml_checks",
    "probe_checks",
    "socket_checks",
]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"

AGREE = 0.35
"""NVML's utilisation and the trainer's busy share (1 - data wait) agree within this (CUDA runs
ahead of the trainer's thread, so they are never equal)."""


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    name: str
    status: str
    found: str
    fix: str = ""


def nvml_checks() -> list[Check]:
    """The NVML library and driver, the GPUs, per-process accounting."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        return [
            Check(
                "NVML",
                SKIP,
                f"unavailable ({type(exc).__name__}: {exc})",
                "no GPU here, or no driver: the sidecar then relies on the loaders' data-wait "
                "measurements. On a GPU node: install the NVIDIA driver, and in a container "
                "mount it (NVIDIA container toolkit)",
            )
        ]
    out = []
    driver = pynvml.nvmlSystemGetDriverVersion()
    count = pynvml.nvmlDeviceGetCount()
    names = [
        str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
    ]
    out.append(Check("NVML", OK, f"driver {driver}; {count} GPU(s): {', '.join(names)}"))
    try:
        for i in range(count):
            pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
        out.append(Check("GPU process accounting", OK, "the processes on each GPU can be read"))
    except Exception as exc:
        out.append(
            Check(
                "GPU process accounting",
                WARN,
                f"cannot list the processes on a GPU ({exc})",
                "run the sidecar with the host's PID namespace (hostPID) and access to the "
                "driver; without it, GPUs are matched to jobs by their registration only",
            )
        )
    return out


def cgroup_checks(proc: Path = Path("/proc")) -> list[Check]:
    """cgroup v2 controllers and what this process may use and write."""
    out = []
    affinity = len(os.sched_getaffinity(0))
    cpus = os.cpu_count() or affinity
    mount, why = cgroups.detect(proc)
    group = cgroups.cgroup_of("self", proc) or "/"
    quota = host.limits("self", proc=proc).cpu_quota  # what num_workers="auto" obeys too
    limit = f"; the cgroup CPU quota allows {quota:.1f} CPUs" if quota else ""
    out.append(
        Check(
            "CPUs for loader work",
            OK if affinity > 1 else WARN,
            f"{affinity} of {cpus} CPUs by affinity{limit}",
            "" if affinity > 1 else "one CPU: loader workers cannot run beside the trainer",
        )
    )
    if mount is None:
        out.append(
            Check(
                "cgroup v2 cpu",
                WARN,
                why,
                "--cgroup-weights needs cgroup v2 with the cpu controller; --pin-cpus works "
                "without it",
            )
        )
        return out
    controllers = (mount / "cgroup.controllers").read_text().split()
    out.append(Check("cgroup v2 cpu", OK, f"{why}; this process in {group}"))
    out.append(
        Check(
            "cgroup v2 cpuset",
            OK if "cpuset" in controllers else WARN,
            "cpuset controller " + ("enabled" if "cpuset" in controllers else "not enabled"),
            "" if "cpuset" in controllers else "CPU sets still work through affinity (--pin-cpus)",
        )
    )
    weight = mount / group.lstrip("/") / "cpu.weight"
    writable = weight.exists() and os.access(weight, os.W_OK)
    out.append(
        Check(
            "cpu.weight writable",
            OK if writable else WARN,
            f"{weight}: " + ("writable" if writable else "not writable by this user"),
            ""
            if writable
            else "--cgroup-weights needs the sidecar to run as root or with the "
            "jobs' cgroups delegated to its user",
        )
    )
    return out


def socket_checks(socket: str, timeout: float = 3.0) -> list[Check]:
    """The sidecar's socket: there, reachable by the jobs' users, answering."""
    path = Path(socket)
    if not path.exists():
        return [
            Check(
                "sidecar socket",
                WARN,
                f"{socket} does not exist: no sidecar runs here (or it listens elsewhere)",
                "start dloader-sidecar (deploy/ has a systemd unit, a DaemonSet and Slurm "
                "scripts), or give --socket",
            )
        ]
    st = path.stat()
    if not stat.S_ISSOCK(st.st_mode):
        return [Check("sidecar socket", FAIL, f"{socket} is not a socket", "give --socket")]
    mode = stat.S_IMODE(st.st_mode)
    group_ok = mode & 0o060 == 0o060
    out = [
        Check(
            "sidecar socket mode",
            OK if group_ok else WARN,
            f"{socket}: mode {mode:o}, owner uid {st.st_uid}, group {st.st_gid}",
            "" if group_ok else "the jobs' users reach it through its group: mode 0660",
        )
    ]
    if not os.access(path, os.R_OK | os.W_OK):
        out.append(
            Check(
                "sidecar reachable",
                FAIL,
                f"this user (uid {os.geteuid()}) may not connect to {socket}",
                f"add the user to the socket's group (gid {st.st_gid})",
            )
        )
        return out
    try:
        status = serving_status(Endpoint.of(f"unix://{socket}"), timeout)
        serving = status == "SERVING"
        out.append(
            Check(
                "sidecar reachable",
                OK if serving else FAIL,
                f"health: {status}",
                "" if serving else "see the sidecar's log",
            )
        )
    except Exception as exc:
        out.append(
            Check(
                "sidecar reachable",
                FAIL,
                f"no answer on {socket} ({type(exc).__name__})",
                "a stale socket? restart dloader-sidecar (it takes a stale socket over)",
            )
        )
    return out


def loader_checks(seconds: float, workers: int) -> list[Check]:
    """A real loader against this node's accelerator, in a subprocess."""
    cmd = [
        sys.executable,
        "-m",
        "dloader.apps.probe",
        "--seconds",
        str(seconds),
        "--workers",
        str(workers),
    ]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180)
        r: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        tail = locals().get("run")
        err = tail.stderr[-300:] if tail is not None else ""
        return [Check("real loader", FAIL, f"the probe failed ({exc}) {err}".strip(), "")]
    return probe_checks(r)


def probe_checks(r: dict[str, Any]) -> list[Check]:
    """What the probe's JSON (:func:`dloader.apps.probe.probe`) says of this node."""
    wait = r["data_wait_share"]
    out = [
        Check(
            "real loader",
            OK,
            f"{r['workers']} workers, {r['samples_per_second']:.0f} samples/s; the trainer "
            f"waited for data {wait:.0%} of {r['seconds']:.0f} s",
        )
    ]
    if not r["cuda"]:
        out.append(Check("GPU measurement", SKIP, "no CUDA device: GPU checks skipped"))
        return out
    util = r.get("gpu_utilization")
    if util is None:
        out.append(Check("data wait vs GPU", WARN, f"{r['device']}: NVML gave no utilisation", ""))
    else:
        # The probe's own balance says nothing of the node (on an H100 its 4 workers starve the
        # GPU: 4% busy, 93% waiting); what matters is that the two signals agree: the sidecar
        # decides on the data wait, operators read NVML.
        agree = abs(util - (1 - wait)) <= AGREE
        out.append(
            Check(
                "data wait vs GPU",
                OK if agree else WARN,
                f"{r['device']}: NVML utilisation {util:.0%} while the trainer waited {wait:.0%}"
                + (" (they agree)" if agree else ""),
                ""
                if agree
                else "NVML and the loader's data wait disagree: another process on this GPU, or "
                "MIG? (the sidecar decides on the loaders' data wait; NVML's figure is shown)",
            )
        )
    pinned, pageable = r["pinned_gb_per_s"], r["pageable_gb_per_s"]
    out.append(
        Check(
            "pinned-memory copy",
            OK if pinned >= pageable else WARN,
            f"host to device {pinned:.1f} GB/s pinned, {pageable:.1f} GB/s pageable",
            ""
            if pinned >= pageable
            else "pinning does not help here: check the PCIe link and IOMMU settings",
        )
    )
    return out


def checks(socket: str, seconds: float, workers: int) -> list[Check]:
    """Every check, in the table's order (``seconds`` 0: no loader measurement)."""
    out = nvml_checks() + cgroup_checks() + socket_checks(socket)
    if seconds > 0:
        out += loader_checks(seconds, workers)
    return out


def as_json(rows: list[Check]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=2)
