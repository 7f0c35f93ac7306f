"""The Kubernetes manifests: valid against the Kubernetes schemas (offline, strict), and
consistent with each other and with the daemons' real command lines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dloader.allocator.cli import parser as allocator_parser
from dloader.sidecar.cli import parser as sidecar_parser

kubernetes_validate = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
VERSION = "1.33"  # a maintained Kubernetes release; the schemas ship with kubernetes-validate


def documents(*folders: str) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for folder in folders:
        for path in sorted((K8S / folder).glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            out += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


MANIFESTS = documents("base", "examples")


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in MANIFESTS if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize(
    "doc", [d for _, d in MANIFESTS], ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_every_manifest_validates_strictly(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_kustomizations_list_files_that_exist() -> None:
    for kfile in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        for entry in [*k.get("resources", []), *(p["path"] for p in k.get("patches", []))]:
            assert (kfile.parent / entry).exists(), f"{kfile}: {entry} does not exist"


def test_the_overlay_patches_name_objects_of_the_base() -> None:
    base = {(d["kind"], d["metadata"]["name"]) for _, d in MANIFESTS}
    for path in (K8S / "overlays").rglob("*.yaml"):
        if path.name == "kustomization.yaml":
            continue
        for d in yaml.safe_load_all(path.read_text()):
            assert (d["kind"], d["metadata"]["name"]) in base, path


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]["containers"][0]


def _arg(args: list[str], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(flag + "="))


def test_the_job_reaches_the_socket_the_daemonset_serves() -> None:
    ds, job = find("DaemonSet", "dloader-sidecar"), find("Job", "resnet-train")
    sidecar, train = _container(ds), _container(job)
    socket = _arg(sidecar["args"], "--socket")
    env = {e["name"]: e.get("value") for e in train["env"]}
    assert env["DLOADER_SIDECAR"] == f"unix://{socket}"
    folder = str(Path(socket).parent)

    def host_folder(doc: dict[str, Any], container: dict[str, Any]) -> str:
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == folder)
        volumes = doc["spec"]["template"]["spec"]["volumes"]
        return str(next(v for v in volumes if v["name"] == mount["name"])["hostPath"]["path"])

    assert host_folder(ds, sidecar) == host_folder(job, train)
    # the job's user can open the socket: it joins the group that owns it
    group = sidecar["securityContext"]["runAsGroup"]
    assert group in job["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"]


def test_the_commands_are_the_daemons_real_command_lines() -> None:
    ds, alloc = find("DaemonSet", "dloader-sidecar"), find("Deployment", "dloader-allocator")
    sidecar_parser().parse_args(_container(ds)["args"])  # an unknown flag exits here
    allocator_parser().parse_args(_container(alloc)["args"])
    probe = _container(ds)["livenessProbe"]["exec"]["command"]
    assert probe[0] == "dloaderctl" and probe[-1] == "health"
    assert _arg(probe, "--socket") == _arg(_container(ds)["args"], "--socket")


def test_the_image_is_the_one_scripts_build_image_builds() -> None:
    k = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    (image,) = k["images"]
    script = (ROOT / "scripts" / "build_image").read_text()
    assert f'IMAGE="${{IMAGE:-{image["newName"]}}}"' in script
    assert f'TAG="${{TAG:-{image["newTag"]}}}"' in script


def test_no_example_runs_a_torch_older_than_the_floor() -> None:
    """An image that names its torch (``pytorch/pytorch:X.Y...``) is at least the torch floor of
    ``pyproject.toml``; the training example names the user's own image and what it needs."""
    import re

    floor = re.search(r'"torch>=(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text())
    assert floor is not None
    lowest = (int(floor[1]), int(floor[2]))
    for path in K8S.rglob("*.yaml"):
        for m in re.finditer(r"pytorch/pytorch:(\d+)\.(\d+)", path.read_text()):
            assert (int(m[1]), int(m[2])) >= lowest, f"{path}: {m[0]} is older than torch {lowest}"
    assert (
        f"torch >= {lowest[0]}.{lowest[1]}" in (K8S / "examples" / "training-job.yaml").read_text()
    )


def _rendered(overlay: str) -> list[dict[str, Any]]:
    """``overlay`` as kustomize renders it (``kubectl kustomize``, offline)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (its kustomize) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.mark.parametrize("overlay", ["tls", "lend"])
def test_every_overlay_renders_to_valid_manifests(overlay: str) -> None:
    for doc in _rendered(overlay):
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_lending_nodes_ray_node_advertises_the_id_its_sidecar_registers(capsys) -> None:
    """overlays/lend: the sidecar may lend (``--lend-cores``); beside it ``dloader-ray-node``
    advertises ``dloader_node:<node id>`` under the sidecar's own ``--node-id``, at a nice value
    below the node's loader workers."""
    from dloader.apps import raynode

    ds = next(d for d in _rendered("lend") if d["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    sidecar, ray = containers["sidecar"], containers["ray-node"]
    args = sidecar_parser().parse_args(sidecar["args"])
    assert args.lend_cores
    env = {e["name"]: e.get("value") for e in ray["env"]}
    node = next(e for e in ray["env"] if e["name"] == "NODE_NAME")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

    def expand(a: str) -> str:  # what the kubelet does with $(VAR) from the container's env
        return a.replace("$(NODE_NAME)", "gpu-7").replace(
            "$(DLOADER_LEND_CPUS)", env["DLOADER_LEND_CPUS"]
        )

    assert ray["command"] == ["dloader-ray-node"]
    assert _arg(ray["args"], "--node-id") == _arg(sidecar["args"], "--node-id")
    assert int(env["RAY_worker_niceness"]) >= raynode.MIN_NICENESS
    assert raynode.main(["--dry-run", f"--address={env['RAY_ADDRESS']}"] + [
        expand(a) for a in ray["args"]
    ]) == 0  # fmt: skip
    assert '"dloader_node:gpu-7": 16' in capsys.readouterr().out
