"""Bad command-line input to every command: a message and a non-zero exit, never a traceback,
and never a daemon that starts on a setting it should have refused."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dloader.allocator.cli import main as allocator_main
from dloader.allocator.sim_cli import main as sim_main
from dloader.integrations.launcher import main as launch_main
from dloader.sidecar.cli import main as sidecar_main
from dloader.sidecar.ctl import main as ctl_main

pytestmark = pytest.mark.integration

SIDECAR = [
    ["--listen", "127.0.0.1:99999", "--token", "t"],
    ["--listen", ":99999", "--token", "t"],
    ["--listen", "nohost", "--token", "t"],
    ["--listen", "127.0.0.1:0"],
    ["--period", "nan"],
    ["--period", "-1"],
    ["--period", "inf"],
    ["--worker-budget", "0"],
    ["--cpu-budget", "99999"],
    ["--metrics-port", "-1"],
    ["--metrics-port", "70000"],
    ["--job-timeout", "nan"],
    ["--job-timeout", "-5"],
    ["--gpus", "-1"],
    ["--worker-nice", "20"],
    ["--worker-nice", "-1"],
    ["--worker-nice", "low"],
    ["--spare-workers", "0.5"],
    ["--spare-workers", "nan"],
    ["--spare-workers", "9"],
    ["--allocator", "nohost"],
    ["--allocator", "unix://"],
    ["--allocator", "host:99999"],
    ["--token", "@/nonexistent/token", "--listen", "127.0.0.1:0"],
    ["--listen", "127.0.0.1:0", "--token", "t", "--tls-cert", "/nope.pem", "--tls-key", "/nope"],
    ["--tls-cert", "/nope.pem"],
    ["--policy", "greedy"],
    ["--worker-budget", "many"],
    ["--socket", "/dev/null/x.sock"],
    ["--socket", "/proc/self/x.sock"],
    # unsafe settings are refused at start-up, not run with
    ["--socket", ""],
    ["--state-dir", ""],
    ["--state-dir", "GROUP_WRITABLE"],
    ["--listen", "127.0.0.1:0", "--token", "@FOREIGN_TOKEN"],
    ["--listen", "127.0.0.1:0", "--token", "@SHARED_TOKEN"],
]
ALLOCATOR = [
    ["--interval", "nan"],
    ["--interval", "0"],
    ["--restart-cost", "-1"],
    ["--restart-cost", "1e9"],
    ["--node-timeout", "nan"],
    ["--node-timeout", "-1"],
    ["--listen", "127.0.0.1:99999", "--token", "t"],
    ["--listen", "127.0.0.1:0", "--token", "t", "--node-token", "@/nonexistent"],
    ["--policy", "fastest"],
    ["--dry-run", "yes"],
    ["--socket", "/dev/null/a.sock"],
    ["--rendezvous-ports", "29400"],
    ["--rendezvous-ports", "2000-1000"],
    ["--listen", "127.0.0.1:0", "--token", "t", "--client-token", "t"],
    ["--listen", "127.0.0.1:0", "--token", "t", "--node-token", "n", "--client-token", "n"],
]
CTL = [
    ["--target", "nohost", "jobs"],
    ["--target", "127.0.0.1:1", "--tls-ca", "/nope.pem", "jobs"],
    ["--socket", "/nonexistent/s.sock", "--timeout", "1", "jobs"],
    ["policy", "set", "greedy"],
    ["explain"],
]
SUBMIT = ["--allocator", "unix:///a.sock", "--job-id", "j", "--batch-size", "8"]
LAUNCH = [
    ["--allocator", "nohost", "--job-id", "j", "--batch-size", "8", "train.py"],
    ["--allocator", "unix:///nonexistent.sock", "--job-id", "j", "--batch-size", "8", "nope.py"],
    ["--job-id", "j", "--batch-size", "8", "train.py"],
    ["--allocator", "unix:///a.sock", "--job-id", "j", "--follow", "--batch-size", "8", "t.py"],
    ["--allocator", "unix:///a.sock", "--job-id", "j", "--follow", "t.py"],
    ["--allocator", "unix:///a.sock", "--job-id", "j", "t.py"],
    # S9: refused up front, naming the flag, before the (absent) allocator is waited for
    [*SUBMIT[:-1], "-5", "train.py"],  # --batch-size -5
    [*SUBMIT, "--max-gpus", "-1", "train.py"],
    [*SUBMIT, "--measurements", "garbage.csv", "train.py"],
    [*SUBMIT, "--measurements", "zero.csv", "train.py"],
    [*SUBMIT, "--scaling", "[1]", "train.py"],
    [*SUBMIT, "--log-level", "TRACE", "train.py"],
    [*SUBMIT, "--grace", "nan", "train.py"],
    [*SUBMIT, "--last-call", "-1", "train.py"],
    [*SUBMIT, "--max-restarts", "-5", "train.py"],
    [*SUBMIT, "--priority", "nan", "train.py"],
    [*SUBMIT, "--restart-seconds", "inf", "train.py"],
    [*SUBMIT, "--measurements", ".", "train.py"],
]
SIM = [
    ["--workload", "9", "--out", "x.json"],
    ["--workload", "/nonexistent.csv", "--out", "x.json"],
    ["--workload", "1", "--traces", "/nonexistent", "--out", "x.json"],
    ["--workload", "1", "--policy", "bogus", "--out", "x.json"],
    ["--workload", "1", "--nodes", "0", "--out", "x.json"],
]


def run(main: Callable[[list[str]], int], argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse: usage and exit 2
        return int(exc.code or 0)


@pytest.mark.parametrize(
    ("main", "argv"),
    [(sidecar_main, a) for a in SIDECAR]
    + [(allocator_main, a) for a in ALLOCATOR]
    + [(ctl_main, a) for a in CTL]
    + [(launch_main, a) for a in LAUNCH]
    + [(sim_main, a) for a in SIM],
    ids=lambda v: " ".join(v) if isinstance(v, list) else getattr(v, "__module__", "?"),
)
def test_bad_input_is_a_message_not_a_traceback(
    main: Callable[[list[str]], int],
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "garbage.csv").write_bytes(b"\x00\xff not a csv\n1,2\n")
    (tmp_path / "zero.csv").write_text("nodes,replicas,local_bsz,step_time\n1,1,32,0\n")
    shared = tmp_path / "shared.token"
    shared.write_text("t\n")
    shared.chmod(0o660)  # writable by its group: anyone there could set the token
    foreign = tmp_path / "foreign.token"
    foreign.write_text("t\n")
    foreign.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(foreign, 4242, 4242)  # another user's file
    (tmp_path / "gw").mkdir(mode=0o770)
    (tmp_path / "gw").chmod(0o770)
    replace = {
        "GROUP_WRITABLE": str(tmp_path / "gw"),
        "@FOREIGN_TOKEN": f"@{foreign}",
        "@SHARED_TOKEN": f"@{shared}",
    }
    if "@FOREIGN_TOKEN" in argv and os.geteuid() != 0:
        pytest.skip("making another user's file needs root")
    argv = [replace.get(a, a) for a in argv]
    if main in (sidecar_main, allocator_main):
        extra = []
        if "--state-dir" not in argv:
            extra += ["--state-dir", str(tmp_path / "state")]
        if "--socket" not in argv:
            extra += ["--socket", str(tmp_path / "run" / "d.sock")]
        argv = [*extra, *argv]
    code = run(main, argv)
    err = capsys.readouterr().err
    assert code != 0, f"{argv} was accepted"
    assert "Traceback" not in err, err
    assert err.strip(), "no message"
