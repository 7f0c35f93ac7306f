"""Enforcing the CPU division: disjoint CPU sets for loader workers, cgroup v2 cpu.weight.

cgroup v2 is tested against a directory laid out like cgroupfs (and a fake /proc): this
project's machines have no cgroup v2 cpu controller to test against.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from dloader._shared.node_messages import JobReport, Registration, WorkerReport
from dloader.sidecar.cgroups import CgroupWeights, detect
from dloader.sidecar.config import PolicySettings
from dloader.sidecar.core import NodeCore
from dloader.sidecar.node_policy import UNPLACED_NICE_S, cpu_sets
from dloader.sidecar.store import SidecarStore


def test_cpu_sets_are_disjoint_and_proportional() -> None:
    sets = cpu_sets({"cpu": 5.0, "io": 2.0, "gpu": 0.1}, list(range(8)))
    assert [len(sets[j]) for j in ("cpu", "io", "gpu")] == [5, 2, 1]
    flat = [c for s in sets.values() for c in s]
    assert sorted(flat) == list(range(8))  # disjoint and complete
    assert cpu_sets({"a": 1.0, "b": 1.0, "c": 1.0}, [0, 1]) == {}  # cannot keep 3 jobs apart
    assert cpu_sets({"a": 0.0, "b": 0.0}, [4, 5]) == {"a": (4,), "b": (5,)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_core_pins_each_job_to_its_own_cpus(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    core = NodeCore(
        SidecarStore(tmp_path / "s.db"), PolicySettings("adaptive", 8, 2, 1.0), pin_cpus=cpus
    )
    ids = [
        core.register(Registration(n, pids=(os.getpid(),), num_workers=2, batch_size=32)).job_id
        for n in ("a", "b")
    ]
    core.decide()  # registered, no batch and no loader workers yet: no CPU set of their own
    assert not any(core.jobs[j].directive.cpus for j in ids)
    running = JobReport(
        timestamp=0.0,
        num_workers=2,
        batch_size=32,
        samples_per_second=300.0,
        idle_share=0.5,
        step_seconds=32 / 300.0,
        wait_seconds=0.0,
        window_seconds=2.0,
        samples=600,
        workers=(WorkerReport(201, 0.2, 0.1, 10), WorkerReport(202, 0.2, 0.1, 10)),
    )
    for j in ids:  # their loaders run
        core.report(core.jobs[j], running)
    core.decide()
    cpus = [core.jobs[j].directive.cpus for j in ids]
    assert all(cpus) and not set(cpus[0]) & set(cpus[1])
    assert core.jobs[ids[0]].directive.reason.startswith("CPU set")


def fake_system(tmp_path: Path, *, controllers: str = "cpu memory") -> tuple[Path, Path]:
    proc, fs = tmp_path / "proc", tmp_path / "cgroupfs"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mounts").write_text(f"cgroup2 {fs} cgroup2 rw 0 0\n")
    (proc / "self" / "cgroup").write_text("0::/system.slice/dloader-sidecar.service\n")
    fs.mkdir()
    (fs / "cgroup.controllers").write_text(controllers + "\n")
    for pid, group in ((101, "/kubepods/pod-a"), (102, "/kubepods/pod-b"), (103, "/")):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(f"0::{group}\n")
        if group != "/":
            (fs / group.lstrip("/")).mkdir(parents=True)
            (fs / group.lstrip("/") / "cpu.weight").write_text("100\n")
    return proc, fs


def test_detect_says_why_not(tmp_path: Path) -> None:
    proc, fs = fake_system(tmp_path, controllers="memory io")
    assert detect(proc) == (
        None,
        f"cgroup v2 at {fs} has no cpu controller (cgroup v1 may hold it)",
    )
    (proc / "self" / "mounts").write_text("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n")
    assert detect(proc) == (None, "no cgroup v2 hierarchy is mounted")
    proc, fs = fake_system(tmp_path / "ok")
    assert detect(proc) == (fs, f"cgroup v2 cpu.weight at {fs}")


def test_weights_follow_shares_and_skip_shared_cgroups(tmp_path: Path, caplog) -> None:
    proc, fs = fake_system(tmp_path)
    w = CgroupWeights(fs, proc=proc)
    with caplog.at_level(logging.WARNING):
        w.apply({"a": ([101], 1.5), "b": ([102], 0.5), "root": ([103], 1.0)})
        w.apply({"a": ([101], 1.5), "b": ([102], 0.5), "root": ([103], 1.0)})
    assert (fs / "kubepods/pod-a/cpu.weight").read_text() == "150\n"
    assert (fs / "kubepods/pod-b/cpu.weight").read_text() == "50\n"
    assert caplog.text.count("not in a cgroup of its own") == 1  # said once
    (fs / "kubepods/pod-b/cpu.weight").unlink()
    (fs / "kubepods/pod-b").rmdir()  # the job's cgroup is gone (or not writable)
    with caplog.at_level(logging.WARNING):
        w.apply({"a": ([101], 1.0), "b": ([102], 1.0)})
    assert (fs / "kubepods/pod-a/cpu.weight").read_text() == "100\n"
    assert "job b: cannot write" in caplog.text


def test_kubernetes_pods_are_weighted_at_the_pod_level() -> None:
    from dloader.sidecar.cgroups import weighted_group

    uid = "0e6f2a3c-1b2d-4c5e-8f90-a1b2c3d4e5f6"
    assert (
        weighted_group(f"/kubepods/burstable/pod{uid}/cri-containerd-0123abcd")
        == f"/kubepods/burstable/pod{uid}"
    )
    slice_pod = "kubepods-burstable-pod0e6f2a3c_1b2d_4c5e_8f90_a1b2c3d4e5f6.slice"
    assert (
        weighted_group(
            f"/kubepods.slice/kubepods-burstable.slice/{slice_pod}/cri-containerd-1.scope"
        )
        == f"/kubepods.slice/kubepods-burstable.slice/{slice_pod}"
    )
    assert weighted_group("/user.slice/user-1000.slice/session-3.scope") == (
        "/user.slice/user-1000.slice/session-3.scope"
    )  # not a pod: its own cgroup


def test_a_pod_containers_weight_is_written_on_the_pod(tmp_path: Path) -> None:
    proc, fs = tmp_path / "proc", tmp_path / "cgroupfs"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/system.slice/dloader-sidecar.service\n")
    pods = {}
    for pid, pod in ((201, "pod11111111-aaaa"), (202, "pod22222222-bbbb")):
        group = f"/kubepods/burstable/{pod}/cri-containerd-{pid}"
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(f"0::{group}\n")
        (fs / group.lstrip("/")).mkdir(parents=True)
        pods[pid] = fs / "kubepods" / "burstable" / pod
    weights = CgroupWeights(fs, proc=proc)
    weights.apply({"a": ([201], 1.5), "b": ([202], 0.5)})
    assert (pods[201] / "cpu.weight").read_text() == "150\n"
    assert (pods[202] / "cpu.weight").read_text() == "50\n"


def test_every_directive_carries_the_worker_nice_value_from_registration_on(
    tmp_path: Path,
) -> None:
    store = SidecarStore(tmp_path / "s.db")
    settings = PolicySettings("even", 4, 2, 1.0)
    core = NodeCore(store, settings, worker_nice=10)
    rec = core.register(Registration("a", pids=(os.getpid(),), num_workers=1, batch_size=32))
    assert core.jobs[rec.job_id].directive.worker_nice == 10
    core.decide()  # a later directive keeps it
    assert core.jobs[rec.job_id].directive.worker_nice == 10
    assert NodeCore(store, settings, worker_nice=10).jobs[rec.job_id].directive.worker_nice == 10
    assert NodeCore(store, settings).jobs[rec.job_id].directive.worker_nice is None  # 0: off
    with pytest.raises(ValueError, match="worker_nice=20"):
        NodeCore(store, settings, worker_nice=20)


def test_a_new_jobs_workers_are_niced_once_the_adaptive_policy_places_it(
    tmp_path: Path,
) -> None:
    """Under ``adaptive`` a new job registers with its workers' nice value left alone (they
    run at the trainers' priority, so its first timed batches come soon on a crowded node);
    it comes after ``UNPLACED_NICE_S`` if no model placed the job first, and stays in every
    directive after, and after a restart."""
    store = SidecarStore(tmp_path / "s.db")
    settings = PolicySettings("adaptive", 8, 2, 1.0)
    now = [0.0]
    core = NodeCore(store, settings, worker_nice=10, clock=lambda: now[0])
    rec = core.register(Registration("a", pids=(os.getpid(),), num_workers=2, batch_size=32))
    job = core.jobs[rec.job_id]
    assert job.directive.worker_nice is None
    core.decide()
    assert job.directive.worker_nice is None
    now[0] = UNPLACED_NICE_S
    core.policy.dirty = True
    core.decide()
    assert job.directive.worker_nice == 10 and "nice 10" in job.directive.reason
    assert NodeCore(store, settings, worker_nice=10).jobs[rec.job_id].directive.worker_nice == 10
