"""The layout shows the machine: layers in data-flow order, no upward import, no cycle.

Every import of a project module (at any depth of a module, lazy ones and
``TYPE_CHECKING`` ones included) must go to the same layer or a lower one, and
the module import graph must be acyclic. A package's ``__init__`` is its public
face: it may re-export from its own submodules, and is otherwise checked like
any module.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("aec", "backends", "spark_glue")

# Lowest first. A module belongs to the first (longest) prefix that matches it.
LAYERS: list[tuple[str, ...]] = [
    (
        "aec.errors", "aec.config", "aec.elements", "aec.keygroups", "aec.clock", "aec.retry",
        "aec.timeouts", "aec.native",
    ),
    ("aec.state",),
    ("aec.functions", "aec.contexts", "aec.declare"),  # the user function APIs
    ("aec.checkpoint",),
    ("aec.runtime",),
    ("aec.async_io",),
    ("aec.windowing", "aec.joins"),
    ("aec.testing",),
    ("aec",),  # the package's public face only
    ("backends",),
    ("spark_glue",),
]
# A sanity bound, not a design rule: cohesion sizes a module (a class with one job
# and its documentation stays in one file rather than halves sharing private fields).
MAX_LINES = 900


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _layer(module: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Project modules ``module`` imports (resolving ``from pkg import submodule``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {module: _imports(module, path, known) for module, path in modules.items()}


def _is_own_reexport(module: str, target: str) -> bool:
    return target.startswith(module + ".")


def test_every_module_has_a_layer():
    for module in _modules():
        _layer(module)


def test_no_upward_imports():
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            if _is_own_reexport(module, target):
                continue
            if _layer(target) > _layer(module):
                upward.append(f"{module} -> {target}")
    assert not upward, "upward imports (a lower layer importing a higher one):\n" + "\n".join(
        sorted(upward)
    )


def test_no_import_cycles():
    graph = {
        module: {t for t in targets if not _is_own_reexport(module, t) and t not in PACKAGES}
        for module, targets in _graph().items()
    }
    # a package's __init__ is imported by its children implicitly; cycles through the
    # public face are not architecture, so faces are left out of the cycle check
    faces = {m for m, p in _modules().items() if p.name == "__init__.py"}
    graph = {m: t - faces for m, t in graph.items() if m not in faces}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_aec_imports_neither_backends_nor_spark_glue():
    offending = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.split(".")[0] == "aec"
        for target in targets
        if target.split(".")[0] in ("backends", "spark_glue")
    ]
    assert not offending, "\n".join(offending)


def test_no_module_over_max_lines():
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    paths += list((ROOT / "perf").glob("*.py"))
    long = sorted(
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in paths
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    )
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(long)


def test_layer_checker_catches_an_upward_import(tmp_path):
    # the checker itself must be able to fail: a state module importing the runtime
    path = tmp_path / "x.py"
    path.write_text("from aec.runtime.operator import KeyedProcessOperator\n")
    known = set(_modules())
    targets = _imports("aec.state.x", path, known)
    assert "aec.runtime.operator" in targets
    assert _layer("aec.runtime.operator") > _layer("aec.state.x")
