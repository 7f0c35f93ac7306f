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
