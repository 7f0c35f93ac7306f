"""The package's import arrows, read from the source with ``ast`` (no import is executed).

Every module belongs to a component by its path (:data:`COMPONENTS`: the longest prefix wins),
lowest first (docs/architecture.md, "Layout", draws the same picture):

* ``errors``: :mod:`dloader.errors`, the one exception hierarchy;
* ``shared``: what every process shares (``dloader._shared``: the typed messages, the client,
  the environment, the host's limits) and the generated gRPC messages (``dloader.v1``);
* ``pure``: decision code, plain values in and out: the predictor's models, the node policy,
  the cluster optimizer and policies, the loader's worker tuner. No I/O, no clocks, no
  processes;
* ``readers``: trace file readers (``dloader.predictor.pollux``);
* ``engine``: the loader's engine (``dloader._engine``); it never imports the facade;
* ``controllers``: the loader's two controllers, ``num_workers="auto"`` (``dloader._autotune``)
  and the sidecar agent (``dloader._agent``), over the engine's controls;
* ``facade``: the root: ``dloader.DataLoader`` and the public helpers;
* ``daemon``: the daemons' shared foundation (``dloader._daemon``);
* ``sidecar``, ``allocator``: the two daemons; neither imports the other;
* ``integrations``: launchers and framework adapters, over the public API and three documented
  internal APIs of the loader (:data:`INTEGRATION_INTERNALS`);
* ``apps``: ``dloader.apps``, programs built on the rest (testbed, pipelines, experiment
  harness, demo), which may use everything.

Besides the arrows: no import cycle, type-only and function-level imports included; one meaning
per class name (no two classes of the package share a name, and only the typed messages share a
name with a proto message), and every exception is defined in ``dloader.errors``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dloader"

#: Module path prefix -> component; a module belongs to the longest prefix it starts with (on a
#: dotted boundary). Decision code is ``pure`` wherever it sits.
COMPONENTS = {
    "dloader": "facade",
    "dloader.errors": "errors",
    "dloader.v1": "shared",
    "dloader._shared": "shared",
    "dloader.predictor": "pure",
    "dloader.predictor.pollux": "readers",
    "dloader.sidecar.node_policy": "pure",
    "dloader.allocator.optimizer": "pure",
    "dloader.allocator.policies": "pure",
    "dloader._autotune.tuner": "pure",
    "dloader._engine": "engine",
    "dloader._autotune": "controllers",
    "dloader._agent": "controllers",
    "dloader._daemon": "daemon",
    "dloader.sidecar": "sidecar",
    "dloader.allocator": "allocator",
    "dloader.integrations": "integrations",
    "dloader.apps": "apps",
}

#: The typed messages: each class is the Python form of the proto message of its name.
MESSAGES = {"dloader._shared.node_messages", "dloader._shared.allocator_messages"}

ALLOWED = {
    "errors": set(),
    "shared": {"errors"},
    "pure": {"errors"},
    "readers": {"errors", "pure"},
    "engine": {"errors", "shared"},
    "controllers": {"errors", "shared", "pure", "engine"},
    "facade": {"errors", "shared", "pure", "engine", "controllers"},
    "daemon": {"errors", "shared"},
    "sidecar": {"errors", "shared", "pure", "daemon"},
    "allocator": {"errors", "shared", "pure", "readers", "daemon"},
    "integrations": {"errors", "shared", "facade", "engine"},
    "apps": {
        "errors",
        "shared",
        "pure",
        "readers",
        "engine",
        "controllers",
        "facade",
        "daemon",
        "sidecar",
        "allocator",
    },
}

#: The loader's internals integrations may use (documented in ``dloader.integrations``); of the
#: facade, only its public modules.
INTEGRATION_INTERNALS = {
    "dloader._engine.ranks",
    "dloader._engine.index_stream",
    "dloader._elastic_sampler",
}

#: Standard or third-party modules that pure decision code must not import (I/O, clocks,
#: processes, sockets, RPC, hardware).
IMPURE = {
    "asyncio",
    "grpc",
    "os",
    "pathlib",
    "psutil",
    "pynvml",
    "random",
    "shutil",
    "socket",
    "sqlite3",
    "subprocess",
    "sys",
    "threading",
    "time",
    "torch",
}


def component(module: str) -> str:
    """The component a module of the package belongs to (its longest prefix in
    :data:`COMPONENTS`)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = COMPONENTS.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise AssertionError(f"{module} is outside the package")


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith("__init__"):
            name = name.rsplit(".", 1)[0]
        out[name] = path
    return out


def imports(path: Path, module: str) -> set[str]:
    """Modules imported by the file (absolute names), anywhere in it: at the top, in functions,
    and in ``TYPE_CHECKING`` blocks (a type-only import is an arrow too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from x import y``: y may be a module or a name in x (resolve() decides)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child, depth + 1)

    visit(tree, 0)
    return found


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The package module ``name`` refers to (``from x import y`` may name a function)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


MODULES = modules()
PURE = sorted(m for m in MODULES if component(m) == "pure")


def test_the_package_has_its_components() -> None:
    for name in ("dloader._daemon", "dloader.sidecar", "dloader.allocator", "dloader.predictor"):
        assert name in MODULES
    # one namespace: the only package installed is dloader (tests and benchmarks are not)
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= {"dloader", "tests", "benchmarks"}, packages
    assert 'include = ["dloader*"]' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    mine = component(module)
    wrong = []
    for name in imports(MODULES[module], module):
        target = resolve(name, MODULES) if name.startswith("dloader") else None
        if target is None:
            continue
        theirs = component(target)
        if theirs != mine and theirs not in ALLOWED[mine]:
            wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(PURE))
def test_pure_code_does_no_io(module: str) -> None:
    bad = {name for name in imports(MODULES[module], module) if name.split(".")[0] in IMPURE}
    assert not bad, f"{module} is decision code but imports {sorted(bad)}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle in ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (cycle := walk(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := walk(m)):
            return cycle
    return None


def import_graph(known: dict[str, Path], prefix: str) -> dict[str, set[str]]:
    return {
        m: {
            t
            for n in imports(p, m)
            if n.startswith(prefix) and (t := resolve(n, known)) not in (None, m)
        }
        for m, p in known.items()
    }


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph(MODULES, "dloader"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_catches_a_wrong_arrow(tmp_path: Path) -> None:
    """The arrows test can fail: a facade module importing the sidecar is a wrong arrow, and so
    is the engine importing the facade, even for types only."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dloader.sidecar.core import NodeCore\n")
    (found,) = imports(bad, "dloader._bad")
    target = resolve(found, MODULES)
    assert target == "dloader.sidecar.core"
    assert component(target) not in ALLOWED[component("dloader._bad")]
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from dloader._dataloader import DataLoader\n"
    )
    found = {n for n in imports(bad, "dloader._engine.bad") if n.startswith("dloader.")}
    assert found == {"dloader._dataloader.DataLoader"}
    target = resolve(found.pop(), MODULES)
    assert component(target) == "facade" not in ALLOWED["engine"]


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(out.stdout.split())


@pytest.mark.integration
def test_daemons_do_not_import_torch_and_the_loader_not_grpc() -> None:
    daemons = _imported_after("import dloader.sidecar.cli, dloader.allocator.cli")
    assert "torch" not in daemons
    library = _imported_after("from dloader import DataLoader")
    assert "torch" in library
    assert not {"grpc", "sklearn", "scipy", "psutil", "dloader.sidecar"} & library


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class the package defines (generated stubs aside), by name."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for module, path in MODULES.items():
        if module.startswith("dloader.v1"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append((module, node))
    return out


def _proto_messages() -> set[str]:
    names = set()
    for proto in (ROOT / "proto").rglob("*.proto"):
        names.update(
            line.split()[1]
            for line in proto.read_text().splitlines()
            if line.startswith("message ")
        )
    return names


def test_one_meaning_per_class_name() -> None:
    """No two classes share a name; a class named like a proto message is that message's typed
    form (in the message modules), or the model the message carries (``ScalingParams``) or the
    policy's own record the message reports (``Candidate``)."""
    classes = _classes()
    twice = {name: [m for m, _ in where] for name, where in classes.items() if len(where) > 1}
    assert not twice, twice
    carried = {
        "ScalingParams": "dloader.predictor._scaling",
        "Candidate": "dloader.sidecar.node_policy.views",
    }
    clash = {
        name: module
        for name in _proto_messages() & set(classes)
        for module, _ in classes[name]
        if module not in MESSAGES and carried.get(name) != module
    }
    assert not clash, f"classes named like a proto message outside the message modules: {clash}"


def test_every_exception_is_in_the_one_hierarchy() -> None:
    def bases(node: ast.ClassDef) -> set[str]:
        return {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}

    stray = [
        f"{module}.{name}"
        for name, where in _classes().items()
        for module, node in where
        if module != "dloader.errors"
        and bases(node) & {"Exception", "ValueError", "RuntimeError", "DLoaderError"}
    ]
    assert not stray, f"exceptions outside dloader.errors: {stray}"


def test_every_environment_variable_is_documented() -> None:
    """Every ``DLOADER_*`` variable the repository reads or exports is in the documentation's
    tables (README.md and docs/; the package's own also in ``dloader/_shared/env.py``, the one
    module that reads them)."""
    import re

    readme = "".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    found: dict[str, set[str]] = {}
    for folder in ("dloader", "tests", "benchmarks", "scripts", "deploy", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix not in (".pyc", ".gz", ".csv", ".png"):
                for name in re.findall(
                    r"\bDLOADER_[A-Z][A-Z_]*\b", path.read_text(errors="ignore")
                ):
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    missing = {n: sorted(w) for n, w in found.items() if f"`{n}`" not in readme}
    assert not missing, f"not in the documentation's environment tables: {missing}"
    package = {n for n, w in found.items() if any(p.startswith("dloader/") for p in w)}
    env = (PACKAGE / "_shared" / "env.py").read_text()
    assert not {n for n in package if n not in env}, package


# ---------------------------------------------------------------------- benchmarks/

BENCHMARKS = ROOT / "benchmarks"


def bench_modules() -> dict[str, Path]:
    out = {}
    for path in BENCHMARKS.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


BENCH = bench_modules()


def bench_topic(module: str) -> str:
    """``benchmarks.<topic>.x`` -> ``<topic>``; ``benchmarks._common`` and the package itself
    are ``common``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] != "_common") else "common"


def test_the_benchmarks_have_their_topics() -> None:
    topics = {bench_topic(m) for m in BENCH}
    assert {"loader", "sidecar", "allocator", "predictor", "daemons", "gpu", "common"} <= topics
    for topic in topics - {"common"}:
        assert f"benchmarks.{topic}.plots" in BENCH, f"benchmarks/{topic}/ draws in no plots.py"


@pytest.mark.parametrize("module", sorted(BENCH))
def test_benchmarks_import_their_own_topic_and_the_common_helpers(module: str) -> None:
    """A benchmark imports ``benchmarks._common``, its own topic's modules and the package,
    never another topic's benchmark; ``_common`` imports no benchmark; a topic's ``plots``
    draws and imports no benchmark of its topic; the package never imports a benchmark."""
    mine = bench_topic(module)
    wrong = []
    for name in imports(BENCH[module], module):
        if not name.startswith("benchmarks"):
            continue
        target = resolve(name, BENCH)
        if target is None or target == module:
            continue
        theirs = bench_topic(target)
        if mine == "common" and target != "benchmarks":
            wrong.append(f"{module} (common) imports {target}")
        elif theirs not in ("common", mine):
            wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
        elif module.endswith(".plots") and target.rsplit(".", 1)[-1].startswith("bench_"):
            wrong.append(f"{module} draws, and imports the benchmark {target}")
    assert not wrong, "\n".join(wrong)


def test_the_package_never_imports_a_benchmark() -> None:
    found = [
        f"{m} imports {n}"
        for m, p in MODULES.items()
        for n in imports(p, m)
        if n.split(".")[0] == "benchmarks"
    ]
    assert not found, found


def test_no_import_cycles_among_the_benchmarks() -> None:
    """``bench_sidecar`` and its generated mixes once imported each other."""
    cycle = find_cycle(import_graph(BENCH, "benchmarks"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
