"""dloader._shared.host: what the process may use, read from directories laid out like /proc and
cgroupfs (this machine has cgroup v1 without a CPU quota, so both layouts are built here), and
from the real /proc for the readers every Linux has."""

from __future__ import annotations

import os
from pathlib import Path

from dloader._shared import host


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_the_tightest_level_counts(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    _write(proc / "42" / "cgroup", "0::/kubepods/pod1/ctr\n")
    _write(cg / "kubepods" / "cpu.max", "max 100000\n")
    _write(cg / "kubepods" / "pod1" / "cpu.max", "250000 100000\n")  # 2.5 CPUs
    _write(cg / "kubepods" / "pod1" / "ctr" / "cpu.max", "400000 100000\n")
    _write(cg / "kubepods" / "pod1" / "memory.max", str(4 * 2**30))
    _write(cg / "kubepods" / "pod1" / "memory.current", str(3 * 2**30))
    _write(cg / "kubepods" / "pod1" / "ctr" / "memory.max", "max")
    _write(cg / "kubepods" / "pod1" / "ctr" / "memory.current", str(2**30))
    limits = host.limits(42, proc=proc, cgroup=cg)
    assert limits.cpu_quota == 2.5
    assert limits.memory_room == 2**30


def test_cgroup_v1_quota_and_memory(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    _write(proc / "7" / "cgroup", "4:memory:/job\n3:cpu,cpuacct:/job\n1:name=systemd:/\n")
    _write(cg / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us", "150000\n")
    _write(cg / "cpu,cpuacct" / "job" / "cpu.cfs_period_us", "100000\n")
    _write(cg / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(cg / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    _write(cg / "memory" / "job" / "memory.limit_in_bytes", str(2**31))
    _write(cg / "memory" / "job" / "memory.usage_in_bytes", str(2**31 + 5))
    _write(cg / "memory" / "memory.limit_in_bytes", "9223372036854771712")  # no limit
    _write(cg / "memory" / "memory.usage_in_bytes", "1")
    limits = host.limits(7, proc=proc, cgroup=cg)
    assert limits.cpu_quota == 1.5
    assert limits.memory_room == 0  # over the limit: no room, never negative


def test_no_cgroup_files_means_no_limit_known(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write(proc / "1" / "cgroup", "0::/\n")
    assert host.limits(1, proc=proc, cgroup=tmp_path / "none") == host.Limits(None, None)
    assert host.limits(2, proc=proc, cgroup=tmp_path) == host.Limits(None, None)  # no process


def test_process_readers(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _write(
        proc / "9" / "smaps_rollup",
        "Rss: 900 kB\nShared_Clean: 500 kB\nPrivate_Clean: 100 kB\nPrivate_Dirty: 300 kB\n",
    )
    assert host.private_bytes(9, proc) == 400 * 1024
    tick = os.sysconf("SC_CLK_TCK")
    # a command name with spaces and parentheses must not shift the fields
    fields = ["S", *["0"] * 10, str(3 * tick), str(tick), *["0"] * 30]
    _write(proc / "9" / "stat", "9 (my (odd) job) " + " ".join(fields))
    assert host.cpu_seconds(9, proc) == 4.0
    _write(proc / "meminfo", "MemTotal: 100 kB\nMemAvailable: 64 kB\n")
    assert host.memory_available(proc) == 64 * 1024
    assert host.private_bytes(10, proc) is None and host.cpu_seconds(10, proc) is None


def test_cpu_clock_counts_only_the_allowed_cpus(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    tick = os.sysconf("SC_CLK_TCK")
    _write(
        proc / "stat",
        f"cpu  {9 * tick} 0 0 0 0 0 0 0 0 0\n"
        f"cpu0 {2 * tick} 0 {tick} 50 0 0 0 0 0 0\n"
        f"cpu1 {5 * tick} 0 0 50 0 0 0 0 0 0\n"
        f"cpu2 {tick} 0 0 50 0 0 0 0 0 0\n",
    )
    assert host.CpuClock({0, 2}, proc).busy_seconds() == 4.0


def test_the_real_proc_is_readable() -> None:
    assert host.cpu_seconds() is not None
    assert (host.private_bytes(os.getpid()) or 0) > 0
    assert (host.memory_available() or 0) > 0
    assert (host.CpuClock().busy_seconds() or 0) > 0
