"""What the package ships: the data the README's simulator commands use, and a light core."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dloader.allocator.sim_cli import main as sim_main
from dloader.allocator.traces import (
    PACKAGED_PHILLY,
    PACKAGED_TRACES,
    POLLUX_WORKLOADS,
    load_apps,
    packaged_workload,
    read_philly,
    read_workload,
)
from dloader.errors import AllocatorError

ROOT = Path(__file__).resolve().parents[1]


def test_packaged_traces_and_workloads_load() -> None:
    apps = load_apps(PACKAGED_TRACES)
    assert sorted(apps) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    for n in POLLUX_WORKLOADS:
        assert len(read_workload(packaged_workload(n))) == 160
    with pytest.raises(AllocatorError, match="workload 9"):
        packaged_workload(9)
    jobs = read_philly(PACKAGED_PHILLY, apps, num_jobs=20, seed=1)
    assert len(jobs) == 20


def test_sim_runs_on_packaged_data_without_paths(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = sim_main(
        [
            "--workload",
            "1",
            "--policy",
            "static",
            "--max-hours",
            "0.5",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and out.exists()


@pytest.mark.slow
@pytest.mark.integration
def test_wheel_is_one_namespace_with_its_data_and_a_light_core(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("dloader_elastic-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"dloader"}, tops
    assert "dloader/allocator/data/pollux/workloads/workload-1.csv" in names
    assert "dloader/allocator/data/pollux/workloads/workload-8.csv" in names
    assert "dloader/allocator/data/philly/philly.csv.gz" in names
    assert "dloader/allocator/data/NOTICE.md" in names
    core = sorted(
        line.split(":", 1)[1].split(";")[0].strip().split(">")[0].split("<")[0].split("=")[0]
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    )
    assert core == ["grpcio", "numpy", "protobuf", "torch"], core
