"""``dloaderctl doctor`` on this machine (no GPU): every check gives a row; the GPU rows say
there is none; a running sidecar is found and answers; a broken socket is a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dloader.sidecar.ctl import main as ctl_main
from tests.sidecar.conftest import Sidecar

pytestmark = pytest.mark.integration


def _doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict]]:
    code = ctl_main([*argv, "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert all(r["status"] in ("ok", "warn", "fail", "skip") for r in rows)
    return code, {r["name"]: r for r in rows}


def test_doctor_checks_the_node_and_a_real_loader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows = _doctor(
        capsys, "--socket", str(tmp_path / "none.sock"), "doctor", "--seconds", "2"
    )
    assert code == 0, rows
    assert (
        rows["sidecar socket"]["status"] == "warn"
        and "does not exist" in rows["sidecar socket"]["found"]
    )
    assert rows["real loader"]["status"] == "ok" and "samples/s" in rows["real loader"]["found"]
    assert {"NVML", "CPUs for loader work"} <= set(rows)
    if rows["NVML"]["status"] == "skip":  # this machine: no GPU, and the rows say so
        assert rows["GPU measurement"]["status"] == "skip"


def test_doctor_finds_a_running_sidecar(
    sidecar: Sidecar, capsys: pytest.CaptureFixture[str]
) -> None:
    code, rows = _doctor(capsys, "--socket", sidecar.socket, "doctor", "--seconds", "0")
    assert code == 0
    assert rows["sidecar reachable"]["status"] == "ok", rows
    assert "SERVING" in rows["sidecar reachable"]["found"]
    assert "real loader" not in rows  # --seconds 0: no measurement


def test_a_path_that_is_no_socket_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.sock").write_text("")
    code, rows = _doctor(
        capsys, "--socket", str(tmp_path / "file.sock"), "doctor", "--seconds", "0"
    )
    assert code == 1 and rows["sidecar socket"]["status"] == "fail"


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl_main(["doctor", "--seconds", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--seconds -1" in err and "Traceback" not in err


H100 = {  # the probe's JSON on an H100 node (stop 37): its 4 workers starve the GPU
    "cuda": True,
    "device": "NVIDIA H100 80GB HBM3",
    "workers": 4,
    "seconds": 15.0,
    "samples_per_second": 1726.0,
    "data_wait_share": 0.93,
    "gpu_utilization": 0.04,
    "pinned_gb_per_s": 52.1,
    "pageable_gb_per_s": 17.9,
}


def test_the_gpu_rows_judge_agreement_not_the_probes_balance() -> None:
    """A probe that waits 93% on a GPU 4% busy: NVML and the data wait agree (ok); the same
    wait with the GPU 90% busy (another process on it) disagrees (warn)."""
    from dloader.sidecar.doctor import probe_checks

    rows = {c.name: c for c in probe_checks(H100)}
    assert (
        rows["data wait vs GPU"].status == "ok" and "(they agree)" in rows["data wait vs GPU"].found
    )
    assert (
        rows["pinned-memory copy"].status == "ok"
        and "52.1 GB/s pinned" in rows["pinned-memory copy"].found
    )
    shared = {c.name: c for c in probe_checks({**H100, "gpu_utilization": 0.9})}
    assert (
        shared["data wait vs GPU"].status == "warn" and "disagree" in shared["data wait vs GPU"].fix
    )
    slow_pin = {c.name: c for c in probe_checks({**H100, "pinned_gb_per_s": 10.0})}
    assert slow_pin["pinned-memory copy"].status == "warn"
    no_nvml = {
        c.name: c for c in probe_checks({k: v for k, v in H100.items() if k != "gpu_utilization"})
    }
    assert no_nvml["data wait vs GPU"].status == "warn"
