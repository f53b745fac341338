"""The import graph of ``dfl_node``: no cycles, and the layers of ``docs/architecture.md`` (dependencies point down);
and inside the node, state written by its owner only.

The graph is read from the source with :mod:`ast`, so nothing is imported: every ``import`` counts,
including those inside functions (they run, just later) and those under ``if TYPE_CHECKING:`` (they never
run, but a module that names another's type for its checker depends on it as much: ten modules
of ``node/`` were once in one circle that way). Importing ``dfl_node.a.b`` from outside package ``dfl_node.a`` also runs
``dfl_node/a/__init__.py``, so it is an edge to that package too.

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


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, those under ``if TYPE_CHECKING:`` included."""
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


# docs/architecture.md: cli → service (the daemon's composition root) | sim → node → algorithms → learning, the node
# reaching its peers through the port (peering) that net and sim implement and keeping what it records in records,
# which api serves; dependencies point down only.
LEAVES = ("dfl_node.plugins", "dfl_node.registered", "dfl_node.errors", "dfl_node.hashes", "dfl_node.heap",
          "dfl_node.addresses")  # modules anyone may import: they import nothing of the package
ABOVE_NODE = ("dfl_node.net", "dfl_node.sim", "dfl_node.service", "dfl_node.cli", "dfl_node.testbed",
              "dfl_node.sweep")
LAYERS = {
    # learning imports nothing above it: not the settings (which name the algorithms), not the algorithms
    "dfl_node.learning": ("dfl_node.settings", "dfl_node.algorithms", "dfl_node.peering", "dfl_node.api",
                          "dfl_node.node", *ABOVE_NODE),
    "dfl_node.algorithms": ("dfl_node.settings", "dfl_node.peering", "dfl_node.api", "dfl_node.node", *ABOVE_NODE),
    "dfl_node.settings": ("dfl_node.peering", "dfl_node.api", "dfl_node.node", *ABOVE_NODE),
    "dfl_node.peering": ("dfl_node.settings", "dfl_node.node", *ABOVE_NODE),
    # the records a node keeps (history, refusals, fleet events, peer rows, counters, metrics), which the node writes
    # and the REST API, the simulator's results and the checkpoint read: below them all
    "dfl_node.records": ("dfl_node.node", "dfl_node.api", *ABOVE_NODE),
    # the node knows no wire, no simulator and no HTTP: whoever runs it hands it its network and serves its records
    "dfl_node.node": ("dfl_node.api", *ABOVE_NODE),
    "dfl_node.net": ("dfl_node.settings", "dfl_node.node", "dfl_node.sim", "dfl_node.service", "dfl_node.cli"),
    "dfl_node.sim": ("dfl_node.net", "dfl_node.service", "dfl_node.cli"),
    "dfl_node.service": ("dfl_node.sim", "dfl_node.cli"),
}
# Inside the node (docs/architecture.md), one way too: core (clock, logs, progress, counters) under the model and the
# membership, which know nothing of each other; the exchange (roles, transport, collector) over both; the schedulers
# over the exchange; and on top the node itself (node.py composes the parts, requests.py answers peers, views.py
# reports). Every module of the node is in exactly one of these (test_every_node_module_has_a_layer).
NODE_TOP = ("dfl_node.node.node", "dfl_node.node.requests", "dfl_node.node.views")
NODE_PARTS = ("dfl_node.node.core", "dfl_node.node.model", "dfl_node.node.membership", "dfl_node.node.exchange",
              "dfl_node.node.schedule")
NODE_LAYERS = {
    "dfl_node.node.core": (*NODE_PARTS[1:], *NODE_TOP),
    "dfl_node.node.model": ("dfl_node.node.membership", "dfl_node.node.exchange", "dfl_node.node.schedule",
                            *NODE_TOP),
    "dfl_node.node.membership": ("dfl_node.node.model", "dfl_node.node.exchange", "dfl_node.node.schedule",
                                 *NODE_TOP),
    "dfl_node.node.exchange": ("dfl_node.node.schedule", *NODE_TOP),
    "dfl_node.node.schedule": NODE_TOP,
}
NODE_FILES = sorted((ROOT / PACKAGE / "node").rglob("*.py"))  # the node's modules, its subpackages' included
PROTOBUF = ("dfl_node.net.proto",)  # the generated messages; google.protobuf is checked as an external import


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_the_known_edges(graph: dict[str, set[str]]) -> None:
    """A guard on the parser itself: edges that certainly exist are found, and none point outside."""
    assert "dfl_node.learning.algorithm_settings" in graph["dfl_node.algorithms.base"]
    assert "dfl_node.algorithms" in graph["dfl_node.settings.names"]  # its lazy lookup counts
    assert all(t in graph for targets in graph.values() for t in targets)


def test_type_checking_imports_count() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dfl_node.node.node import Node\n")
    modules = [node.module for node in _imports(tree) if isinstance(node, ast.ImportFrom)]
    assert modules == ["typing", "dfl_node.node.node"]


def test_the_leaves_import_nothing_of_the_package(graph: dict[str, set[str]]) -> None:
    assert {leaf: graph[leaf] for leaf in LEAVES if graph[leaf]} == {}


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


@pytest.mark.parametrize("layer", sorted(LAYERS | NODE_LAYERS))
def test_layers_import_only_downwards(graph: dict[str, set[str]], layer: str) -> None:
    assert violations(graph, layer, (LAYERS | NODE_LAYERS)[layer]) == []


def test_every_node_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    """A module added to the node outside its parts would escape the checks above."""
    node = [m for m in graph if m.startswith("dfl_node.node.")]
    placed = [m for m in node if m in NODE_TOP or any(m == p or m.startswith(p + ".") for p in NODE_PARTS)]
    assert sorted(set(node) - set(placed)) == []
    assert "dfl_node.node.membership.swim" in graph  # the walk looks into the subpackages, and so do
    assert ROOT / PACKAGE / "node" / "membership" / "swim.py" in NODE_FILES  # the no-wire and one-owner checks


def test_a_planted_violation_is_found(graph: dict[str, set[str]]) -> None:
    """The check itself: the model's learner made to read the membership, and the clock the schedulers, are
    caught."""
    planted = {**graph, "dfl_node.node.model.learner": graph["dfl_node.node.model.learner"]
               | {"dfl_node.node.membership.peers"},
               "dfl_node.node.core.clock": {"dfl_node.node.schedule.rounds"}}
    assert violations(planted, "dfl_node.node.model", NODE_LAYERS["dfl_node.node.model"]) == [
        "dfl_node.node.model.learner -> dfl_node.node.membership.peers"]
    assert violations(planted, "dfl_node.node.core", NODE_LAYERS["dfl_node.node.core"]) == [
        "dfl_node.node.core.clock -> dfl_node.node.schedule.rounds"]
    assert violations(graph, "dfl_node.node.model", NODE_LAYERS["dfl_node.node.model"]) == []


def test_node_imports_no_protobuf_no_grpc_and_names_no_wire(graph: dict[str, set[str]]) -> None:
    """Not even in a docstring: what the node says of itself must hold for every network it runs on."""
    node = [m for m in graph if m.startswith("dfl_node.node")]
    assert violations(graph, "dfl_node.node", PROTOBUF) == []
    assert [m for m in node if external_imports(m) & {"google", "grpc", "zeroconf"}] == []
    named = [str(p.relative_to(ROOT)) for p in NODE_FILES
             if "dfl_node.net" in p.read_text() or "import grpc" in p.read_text()]
    assert named == []


def foreign_writes(path: Path) -> list[str]:
    """The assignments in ``path`` to an attribute of an object reached through another — ``self.part.attr = …``
    (a collaborator's attribute), ``node.state.attr = …`` — with their line numbers. ``self.attr = …`` and
    ``record.attr = …`` (a local: an entry of the owner's own table, a response being built) are the owner's."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in [t for given in targets for t in (given.elts if isinstance(given, ast.Tuple) else [given])]:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_node_s_state_is_written_by_its_owner_only() -> None:
    """docs/architecture.md: each part of a node owns its state; another part changes it only through the owner's
    methods. (Its attributes are private, and ruff's SLF001 refuses ``other._attr``; this catches a write to a
    public attribute of a collaborator.)"""
    writes = [w for p in NODE_FILES for w in foreign_writes(p)]
    assert writes == []


def test_foreign_writes_are_found(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(self, node, peer):\n    self.x = 1\n    peer.alive = False\n    node.state.round = 3\n"
                      "    self.roles.collector.step = 2\n    node.state.counters['a'] += 1\n")
    assert foreign_writes(sample) == ["sample.py:4: node.state.round", "sample.py:5: self.roles.collector.step",
                                      "sample.py:6: node.state.counters"]


if __name__ == "__main__":
    g = import_graph()
    for component in cycles(g):
        print("cycle:", " ".join(component))
    for layer, forbidden in (LAYERS | NODE_LAYERS).items():
        for line in violations(g, layer, forbidden):
            print("layer:", line)
    for line in violations(g, "dfl_node.node", PROTOBUF):
        print("protobuf:", line)
    for path in NODE_FILES:
        for line in foreign_writes(path):
            print("foreign write:", line)
