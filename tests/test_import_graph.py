"""The import graph of Ferry's packages, read from the sources (no import runs): no module takes
another module's underscored names (``from m import _x``, or ``m._x`` on an imported module), and
no import cycle, package ``__init__`` files included, and no loop between packages either: not
between the top-level packages, nor between the subpackages (and modules) of one package (A imports
B and B imports A, through any of their modules). Imports under ``if TYPE_CHECKING:`` do not count
(they never run); imports inside functions do (they run, later).

``KNOWN_*`` would list accepted exceptions; there are none. The test fails on any new case, and
on a listed one that is gone (so a list only shrinks)."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("cni", "routesync", "controller", "lab", "bench")

# (importer, exporter, name) and cycles that exist and are known; empty since the verbs' shared
# steps moved to cni.commands.steps
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()
KNOWN_CYCLES: set[frozenset[str]] = set()
# package-level loops that exist and are known; empty since ipam became a layer of the plugin (cni.ipam)
KNOWN_PACKAGE_CYCLES: set[frozenset[str]] = set()


@dataclass
class Graph:
    modules: dict[str, str] = field(default_factory=dict)  # name -> path
    edges: dict[str, set[str]] = field(default_factory=dict)
    private: set[tuple[str, str, str]] = field(default_factory=set)


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node outside ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def read_graph() -> Graph:
    g = Graph()
    for pkg in PACKAGES:
        for d, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    g.modules[module_name(os.path.join(d, f))] = os.path.join(d, f)
    for mod, path in g.modules.items():
        with open(path) as fh:
            tree = ast.parse(fh.read(), path)
        package = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
        bound: dict[str, str] = {}  # local name -> module it names
        nodes = list(runtime_nodes(tree))
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                src = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{src}.{alias.name}"
                    target = sub if sub in g.modules else src
                    if target in g.modules and target != mod:
                        g.edges.setdefault(mod, set()).add(target)
                    if sub in g.modules:
                        bound[alias.asname or alias.name] = sub
                    elif alias.name.startswith("_") and not alias.name.startswith("__") and src in g.modules:
                        g.private.add((mod, src, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in g.modules:
                        g.edges.setdefault(mod, set()).add(alias.name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
        for node in nodes:
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                g.private.add((mod, bound[node.value.id], node.attr))
    return g


def cycles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.add(frozenset(comp))
    return found


def package_edges(edges: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """The module graph folded onto packages, one level at a time: at each depth d, a module's node
    is the package of its first d names (``cni.commands.add`` -> ``cni`` at 1, ``cni.commands`` at
    2), and an edge joins two different sibling packages (``cni.commands`` -> ``cni.ipam``;
    ``routesync`` -> ``cni`` at depth 1). Plain modules are no nodes: a subpackage may use its
    parent's modules (``routesync.apply`` its ``routesync.model``) and be used by them; a package's
    own modules and ``__init__`` are the module-level check's business."""
    folded: dict[str, set[str]] = {}
    for a, bs in edges.items():
        pa = a.split(".")
        for b in bs:
            pb = b.split(".")
            for d in range(1, min(len(pa), len(pb)) + 1):
                na, nb = ".".join(pa[:d]), ".".join(pb[:d])
                if na == nb:
                    continue
                if na in packages and nb in packages:
                    folded.setdefault(na, set()).add(nb)
                break  # they part here: deeper names are not siblings
    return folded


def packages(g: Graph) -> set[str]:
    return {m for m, path in g.modules.items() if path.endswith("__init__.py")}


def test_reader_sees_what_it_must() -> None:
    """The reader itself: it finds the packages, relative imports and a known edge."""
    g = read_graph()
    assert {"cni.commands.add", "routesync.sources.kube", "routesync.sources"} <= set(g.modules)
    assert "routesync.sources.base" in g.edges["routesync.sources.kube"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert cycles({"a": {"b"}, "b": set()}) == set()
    # package loops: top-level (x.m -> y.n -> x.k), one package's subpackages (p.a.m -> p.b.n -> p.a.k),
    # and none from a package's own modules or from modules that merely share a parent
    pkgs = {"x", "y", "p", "p.a", "p.b"}
    assert cycles(package_edges({"x.m": {"y.n"}, "y.n": {"x.k"}}, pkgs)) == {frozenset({"x", "y"})}
    assert cycles(package_edges({"p.a.m": {"p.b.n"}, "p.b.n": {"p.a.k"}}, pkgs)) == {frozenset({"p.a", "p.b"})}
    assert cycles(package_edges({"p.a.m": {"p.a", "p.c"}, "p.a": {"p.a.k"}, "p.c": {"p.a.m"}}, pkgs)) == set()
    g = read_graph()
    assert {"cni", "cni.commands", "routesync.apply"} <= packages(g) and "cni.plugin" not in packages(g)


def test_no_module_takes_another_modules_private_names() -> None:
    g = read_graph()
    assert g.private - KNOWN_PRIVATE == set(), "new imports of underscored names"
    assert KNOWN_PRIVATE - g.private == set(), "gone: remove them from KNOWN_PRIVATE"


# What each layer of cni/ (and each consumer of it) may import from cni/: the layers only downwards,
# the verbs from every layer, nobody from the verbs but the plugin executable.
LAYERS = {
    "cni.lean": set(),
    "cni.spec": {"cni.lean"},
    "cni.pipeline": {"cni.lean"},
    "cni.kernel": {"cni.lean", "cni.pipeline"},  # podroutes: a Pod's routes as podnet plans them
    "cni.ovs": {"cni.lean", "cni.pipeline"},
    "cni.node": {"cni.lean", "cni.pipeline", "cni.spec"},
    "cni.ipam": {"cni.lean", "cni.spec", "cni.node"},
    "cni.commands": {"cni.lean", "cni.spec", "cni.pipeline", "cni.kernel", "cni.ovs", "cni.node", "cni.ipam"},
    "cni.plugin": {"cni.lean", "cni.spec", "cni.commands"},
    "cni.launcher": set(),
    "routesync": {"cni.lean", "cni.pipeline", "cni.kernel", "cni.ovs", "cni.node"},
    "controller": set(),  # ferry-controller: route-sync's policy model and relevance, no layer of the plugin
    "lab": {"cni.lean", "cni.pipeline", "cni.node", "cni.launcher", "cni.spec"},
    # bench_netlink measures cni.kernel; bench_policy installs its flows through cni.ovs, as route-sync does
    # bench_ipam and bench_cni call IPAM in-process and read its store
    "bench": {"cni.lean", "cni.pipeline", "cni.node", "cni.launcher", "cni.spec", "cni.kernel", "cni.ovs",
              "cni.ipam"},
}


def layer(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "cni" else parts[0]


def test_layers_import_only_downwards() -> None:
    g = read_graph()
    assert {layer(m) for m in g.modules if m.startswith("cni.") and m != "cni"} <= set(LAYERS)
    wrong = sorted((a, b) for a, bs in g.edges.items() for b in bs
                   if b.startswith("cni.") and layer(a) != layer(b) and layer(b) not in LAYERS[layer(a)])
    assert wrong == []


def test_no_import_cycle() -> None:
    found = cycles(read_graph().edges)
    assert found - KNOWN_CYCLES == set(), "new import cycles"
    assert KNOWN_CYCLES - found == set(), "gone: remove them from KNOWN_CYCLES"


def test_no_package_loop() -> None:
    """No two packages import each other (top-level or subpackages of one package), through any of
    their modules: the folder tree shows the layers, and a loop would join two of them into one."""
    g = read_graph()
    found = cycles(package_edges(g.edges, packages(g)))
    assert found - KNOWN_PACKAGE_CYCLES == set(), "new package loops"
    assert KNOWN_PACKAGE_CYCLES - found == set(), "gone: remove them from KNOWN_PACKAGE_CYCLES"
