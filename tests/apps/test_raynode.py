"""``dloader-ray-node``: the Ray node of a GPU node that lends its cores, advertising the resource
the borrowing jobs' remote workers are placed by, under the sidecar's node id."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dloader._engine.remote import node_resource
from dloader.apps import raynode

BIN = Path(sys.executable).parent


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert raynode.main(["--dry-run", *args]) == 0  # (before a "--")
    niceness, *cmd = shlex.split(capsys.readouterr().out)
    return [niceness, *cmd]


def test_it_starts_ray_advertising_the_sidecars_node_id_one_unit_a_core(capsys, monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    niceness, ray, *args = dry_run(capsys, "--address", "head:6379", "--cpus", "12")
    assert niceness == "RAY_worker_niceness=15" and Path(ray).name == "ray"
    resources = json.loads(args[args.index("--resources") + 1])
    # the sidecar's default node id is the host name too (SidecarDaemonConfig.resolve)
    assert resources == {node_resource(socket.gethostname()): 12}
    assert args[:2] == ["start", "--block"] and "--num-gpus" in args
    assert args[args.index("--num-cpus") + 1] == "12"

    monkeypatch.setenv("RAY_ADDRESS", "other:6379")
    monkeypatch.setenv("RAY_worker_niceness", "19")
    niceness, _, *args = dry_run(capsys, "--cpus", "2", "--node-id", "gpu-7", "--", "--verbose")
    assert niceness == "RAY_worker_niceness=19"
    assert args[args.index("--address") + 1] == "other:6379" and args[-1] == "--verbose"
    assert json.loads(args[args.index("--resources") + 1]) == {"dloader_node:gpu-7": 2}


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--cpus", "0"], {}, "--cpus: '0': expected a finite number within [1, 65536]"),
        (["--cpus", "two"], {}, "--cpus: 'two' is not an integer"),
        ([], {}, "--cpus"),
        (["--cpus", "2", "--address", ""], {}, "--address: the Ray head's host:port is needed"),
        (["--cpus", "2", "--node-id", " gpu"], {}, "--node-id: ' gpu' must be 1-"),
        (
            ["--cpus", "2", "--niceness", "5"],
            {},
            "$RAY_worker_niceness) '5': expected a finite number within [10, 19]",
        ),
        (["--cpus", "2"], {"RAY_worker_niceness": "x"}, "$RAY_worker_niceness) 'x'"),
    ],
)
def test_bad_arguments_are_named_with_what_was_expected(capsys, monkeypatch, args, env, said):
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exit_:
        raynode.main([*args, "--dry-run"])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.integration
def test_a_lending_node_joins_the_cluster_with_its_resource(tmp_path: Path) -> None:
    """For real: a Ray head (``LocalRayCluster``), and ``dloader-ray-node`` joining it as the
    GPU node ``gpu-7`` lending 1 core; the cluster then has ``dloader_node:gpu-7`` (what a
    borrowing job's remote worker is placed by), and the node leaves on SIGTERM."""
    from dloader.apps.raycluster import LocalRayCluster

    with LocalRayCluster(log=tmp_path / "cluster.log") as cluster:
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        log = (tmp_path / "node.log").open("wb")
        node = subprocess.Popen(
            [str(BIN / "dloader-ray-node"), "--cpus", "1", "--node-id", "gpu-7"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        probe = (
            "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(json.dumps(ray.cluster_resources()))"
        )

        def resources() -> dict[str, float]:
            out = subprocess.run(
                [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
            )
            assert out.returncode == 0, out.stderr[-2000:]
            return json.loads(out.stdout.strip().splitlines()[-1])

        try:
            deadline = time.monotonic() + 120
            while node_resource("gpu-7") not in (got := resources()):
                assert node.poll() is None, (tmp_path / "node.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"the node did not join: {got}"
                time.sleep(1)
            assert got[node_resource("gpu-7")] == 1.0
        finally:
            os.killpg(node.pid, signal.SIGTERM)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
            log.close()
        deadline = time.monotonic() + 60
        while node_resource("gpu-7") in resources():
            assert time.monotonic() < deadline, "the node's resource outlived it"
            time.sleep(2)
