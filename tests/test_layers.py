"""The import graph of ``dfl_node``: no cycles, and the layers of ``shared/design.md`` (dependencies point down).

The graph is read from the source with :mod:`ast`, so nothing is imported: every ``import`` counts,
including those inside functions (they run, just later), except under ``if TYPE_CHECKING:`` (they never
run). Importing ``dfl_node.a.b`` from outside package ``dfl_node.a`` also runs ``dfl_node/a/__init__.py``,
so it is an edge to that package too.

Run as a script to print the graph's cycles and the layering violations:
``python tests/test_layers.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dfl_node"
GENERATED = ("dfl_node.net.proto.",)  # protoc's output: not ours to layer


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    return {name: path for name, path in found.items() if not name.startswith(GENERATED)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs (all but those under ``if TYPE_CHECKING:``)."""
    if isinstance(tree, ast.If) and _is_type_checking(tree.test):
        for node in tree.orelse:
            yield from _imports(node)
        return
    if isinstance(tree, ast.Import | ast.ImportFrom):
        yield tree
    for child in ast.iter_child_nodes(tree):
        yield from _imports(child)


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """The fully qualified names ``module`` imports (modules, or a module's attributes)."""
    is_package = path.name == "__init__.py"
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        if node.level:  # relative: resolve against this module's package
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        yield source
        yield from (f"{source}.{alias.name}" for alias in node.names if alias.name != "*")


def import_graph() -> dict[str, set[str]]:
    """Module → the ``dfl_node`` modules (and packages) its imports run."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module, path in modules.items():
        for name in _imported_names(module, path):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # each package on the way, and the module itself
                target = ".".join(parts[:i])
                if target in modules and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def external_imports(module: str) -> set[str]:
    """The top-level names of what ``module`` imports outside ``dfl_node`` (``grpc``, ``google``, …)."""
    path = _modules()[module]
    return {name.split(".")[0] for name in _imported_names(module, path)} - {PACKAGE, ""}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def violations(graph: dict[str, set[str]], layer: str, forbidden: tuple[str, ...]) -> list[str]:
    """``importer -> imported`` for each module of ``layer`` that imports a module of a ``forbidden`` one."""
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{m} -> {t}" for m, targets in graph.items() if inside(m, layer)
                  for t in targets if any(inside(t, f) for f in forbidden))


# design.md §1: cli → node → net | sim → algorithms → learning; dependencies point down only.
LAYERS = {
    "dfl_node.learning": ("dfl_node.net", "dfl_node.node", "dfl_node.algorithms", "dfl_node.sim", "dfl_node.api"),
    "dfl_node.algorithms": ("dfl_node.net", "dfl_node.node", "dfl_node.sim"),
    "dfl_node.node": ("dfl_node.sim",),
}
PROTOBUF = ("dfl_node.net.proto",)  # the generated messages; google.protobuf is checked as an external import


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_the_known_edges(graph: dict[str, set[str]]) -> None:
    """A guard on the parser itself: edges that certainly exist are found, and none point outside."""
    assert "dfl_node.learning.settings" in graph["dfl_node.algorithms.base"]
    assert "dfl_node.algorithms" in graph["dfl_node.settings.experiment"]  # its lazy lookup counts
    assert all(t in graph for targets in graph.values() for t in targets)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_downwards(graph: dict[str, set[str]], layer: str) -> None:
    assert violations(graph, layer, LAYERS[layer]) == []


def test_node_imports_no_protobuf(graph: dict[str, set[str]]) -> None:
    node = [m for m in graph if m.startswith("dfl_node.node")]
    assert violations(graph, "dfl_node.node", PROTOBUF) == []
    assert [m for m in node if "google" in external_imports(m)] == []


if __name__ == "__main__":
    g = import_graph()
    for component in cycles(g):
        print("cycle:", " ".join(component))
    for layer, forbidden in LAYERS.items():
        for line in violations(g, layer, forbidden):
            print("layer:", line)
    for line in violations(g, "dfl_node.node", PROTOBUF):
        print("protobuf:", line)
