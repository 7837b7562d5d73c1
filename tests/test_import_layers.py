"""Imports inside reid_engine run one way: no circles, nothing reaches up the layers.

The graph is computed from the files at test time (every ``import`` / ``from ... import``
anywhere in a module, function-level ones included; relative imports resolved), so modules
added or moved later are checked without touching this file.

Nodes are modules; a package is its ``__init__``. An import of module M from module A
adds an edge A -> M, and A -> P for every package P containing M that does not also
contain A: importing ``reid_engine.data.transforms`` from ``reid_engine.inference.contract``
runs ``reid_engine/data/__init__.py`` too. ``from P import name`` is an edge to P, and, when
``name`` is a submodule of P, to P.name as well. The one refinement: a package that contains
A has already started importing before A runs, so reaching it is no new dependency. An
edge to such an enclosing package is therefore added only when A reads a name the package's
``__init__`` defines or re-exports (``from .. import __version__``), never for
``from . import sibling`` or ``import reid_engine.x.y``. That keeps the normal pattern (an
``__init__`` re-exporting its submodules, which import each other) free of false circles,
while a submodule that needs a name from its own package's ``__init__`` while that
``__init__`` imports it is reported, as it is a real circle. Imports under
``if TYPE_CHECKING:`` count like any other; ``importlib.import_module`` calls are not seen.

Layers, lowest first (docs/architecture.md): utils < config, runtime, reliability < data, modeling, solver,
evaluation, clustering < inference, export, engine, integrations < tune, gallery < cli. A module may import its own
package and any lower layer. Within a layer it may import another package only where
SIDEWAYS_ALLOWED says so; layer-2 packages never import each other. Upward imports are
allowed only in ALLOWED_UPWARD, and only lazily (inside a function), which is also why
those edges are left out of the cycle check: they run once both ends are fully imported.
"""
import ast
import os
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Set, Tuple

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT_PACKAGE = "reid_engine"

#: reid_engine.<package> -> layer (lowest first)
LAYERS: Dict[str, int] = {
    ROOT_PACKAGE: -1,  # reid_engine/__init__.py holds only __version__: any layer may read it
    "utils": 0,
    "config": 1,
    "runtime": 1,
    "reliability": 1,
    "data": 2,
    "modeling": 2,
    "solver": 2,
    "evaluation": 2,
    "clustering": 2,
    "inference": 3,
    "export": 3,
    "engine": 3,
    "integrations": 3,
    "tune": 4,
    "gallery": 4,
    "cli": 5,
}

#: (importer package, imported package) within one layer that the architecture allows, with why
SIDEWAYS_ALLOWED: Dict[Tuple[str, str], str] = {
    ("export", "inference"): "export writes and verifies the preprocessing contract and runs the "
                             "feature module that inference defines (docs: export uses the model)",
    ("engine", "inference"): "the training loop's evaluation and rank pictures reuse inference's "
                             "feature extraction and rank lists (inference never imports engine)",
    ("engine", "integrations"): "the engine builds its event writers (MLflow, tensorboard) from "
                                "integrations, which never import the engine",
    ("clustering", "evaluation"): "the pseudo-label graph is evaluation's k-reciprocal Jaccard distance "
                                  "(the re-ranking machinery); evaluation never imports clustering",
}

#: (importer module, imported module prefix) -> why an upward import is allowed (lazily only)
ALLOWED_UPWARD: Dict[Tuple[str, str], str] = {
    ("reid_engine.engine", "reid_engine.cli"): "detectron2-style scripts call "
        "`from reid_engine.engine import default_argument_parser`; argument parsing lives in cli/, "
        "so engine's __init__ re-exports it lazily (module __getattr__)",
}

#: (importer module, imported module prefix) -> why an edge that breaks the layers or closes a
#: circle is tolerated for now. Each entry is a bug to fix, not a rule: such edges are left out
#: of both checks, and an entry that no longer matches an import fails the test (drop it).
KNOWN_EXCEPTIONS: Dict[Tuple[str, str], str] = {}


class Edge(NamedTuple):
    """One import: `source` imports `target`, at `line`; `lazy` when inside a function."""

    source: str
    target: str
    line: int
    lazy: bool


def find_modules(package_dir: str, package: str) -> Dict[str, str]:
    """Map every module name under `package_dir` to its file (a package to its __init__.py)."""
    modules = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        rel = os.path.relpath(folder, package_dir)
        parts = [package] + ([] if rel == "." else rel.split(os.sep))
        if "__init__.py" not in files:
            continue
        for name in files:
            if name.endswith(".py"):
                stem = name[:-3]
                modules[".".join(parts if stem == "__init__" else parts + [stem])] = os.path.join(folder, name)
    return modules


def _is_package(module: str, modules: Mapping[str, str]) -> bool:
    return modules[module].endswith("__init__.py")


def _resolve_relative(module: str, level: int, name: Optional[str], modules: Mapping[str, str]) -> str:
    """The absolute module named by `from <level dots><name> import ...` inside `module`."""
    base = module.split(".")
    if not _is_package(module, modules):
        base = base[:-1]  # a plain module's dots count from its package
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _containing_packages(module: str) -> List[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _encloses(package: str, module: str) -> bool:
    """`package` contains `module` (or is it: a package's __init__ is the package)."""
    return module == package or module.startswith(package + ".")


def _nearest_module(name: str, modules: Mapping[str, str]) -> Optional[str]:
    """The longest prefix of dotted `name` that is a known module (None: not ours)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _targets(source: str, imported: str, names: Iterable[str], modules: Mapping[str, str]) -> Set[str]:
    """The modules an import of `imported` (taking `names` from it, if a from-import) runs or reads."""
    module = _nearest_module(imported, modules)
    if module is None:
        return set()
    names = list(names)
    submodules = {f"{module}.{n}" for n in names if f"{module}.{n}" in modules}
    reads_names = not names or len(submodules) < len(names)  # `import x` or a name that is no submodule
    targets = set(submodules)
    if reads_names or not _encloses(module, source):
        targets.add(module)
    # Packages around the imported module run first, unless they already enclose the importer.
    targets.update(p for p in _containing_packages(module) if not _encloses(p, source))
    targets.discard(source)
    return targets


def module_edges(module: str, path: str, modules: Mapping[str, str]) -> List[Edge]:
    """Every import edge from `module` to another module of the package, function-level ones included."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    edges = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    for target in _targets(module, alias.name, [], modules):
                        edges.append(Edge(module, target, child.lineno, inner))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    imported = _resolve_relative(module, child.level, child.module, modules)
                else:
                    imported = child.module or ""
                names = [a.name for a in child.names if a.name != "*"]
                for target in _targets(module, imported, names, modules):
                    edges.append(Edge(module, target, child.lineno, inner))
            visit(child, inner)

    visit(tree, False)
    return edges


def import_graph(package_dir: str, package: str = ROOT_PACKAGE) -> Tuple[Dict[str, str], List[Edge]]:
    """The package's modules (name -> file) and all import edges among them."""
    modules = find_modules(package_dir, package)
    edges = [e for name, path in sorted(modules.items()) for e in module_edges(name, path, modules)]
    return modules, edges


def find_cycles(nodes: Iterable[str], edges: Iterable[Tuple[str, str]]) -> List[List[str]]:
    """The strongly connected components with a cycle (Tarjan), each as a sorted module list."""
    graph: Dict[str, Set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles = []

    def connect(start: str) -> None:
        # Iterative Tarjan: the recursion depth of a long import chain is no concern.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(cycles)


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _listed(edge: Edge, table: Mapping[Tuple[str, str], str]) -> bool:
    return any(edge.source == source and _encloses(prefix, edge.target) for source, prefix in table)


def layer_violations(edges: Iterable[Edge], layers: Mapping[str, int] = LAYERS,
                     sideways: Mapping[Tuple[str, str], str] = SIDEWAYS_ALLOWED,
                     upward: Mapping[Tuple[str, str], str] = ALLOWED_UPWARD,
                     known: Mapping[Tuple[str, str], str] = KNOWN_EXCEPTIONS) -> List[str]:
    """One line per edge that imports a higher layer, or another package of the same layer unlisted."""
    problems = []
    for edge in edges:
        source, target = _package_of(edge.source), _package_of(edge.target)
        if source == target or _listed(edge, known):
            continue
        if source not in layers or target not in layers:
            problems.append(f"{edge.source}:{edge.line} imports {edge.target}: package without a layer "
                            "(add it to LAYERS and docs/architecture.md)")
        elif layers[target] > layers[source]:
            if not _listed(edge, upward):
                problems.append(f"{edge.source}:{edge.line} imports {edge.target}: up from layer "
                                f"{layers[source]} ({source}) to layer {layers[target]} ({target})")
            elif not edge.lazy:
                problems.append(f"{edge.source}:{edge.line} imports {edge.target} at module level: "
                                "an allowed upward import must be lazy (inside a function)")
        elif layers[target] == layers[source] and (source, target) not in sideways:
            problems.append(f"{edge.source}:{edge.line} imports {edge.target}: sideways within layer "
                            f"{layers[source]} ({source} -> {target}) without an entry in SIDEWAYS_ALLOWED")
    return problems


def cycle_edges(edges: Iterable[Edge], upward: Mapping[Tuple[str, str], str] = ALLOWED_UPWARD,
                known: Mapping[Tuple[str, str], str] = KNOWN_EXCEPTIONS) -> List[Tuple[str, str]]:
    """The edges the cycle check sees: all but the lazy allowed upward ones and the known exceptions."""
    return [(e.source, e.target) for e in edges if not ((e.lazy and _listed(e, upward)) or _listed(e, known))]


@pytest.fixture(scope="module")
def graph():
    return import_graph(os.path.join(REPO_ROOT, ROOT_PACKAGE))


def test_no_import_cycles(graph):
    modules, edges = graph
    cycles = find_cycles(modules, cycle_edges(edges))
    lines = []
    for cycle in cycles:
        members = set(cycle)
        lines.append(" <-> ".join(cycle))
        lines.extend(f"    {e.source}:{e.line} -> {e.target}{' (in a function)' if e.lazy else ''}"
                     for e in edges if e.source in members and e.target in members)
    assert not cycles, "import circles among reid_engine modules:\n" + "\n".join(lines)


def test_imports_follow_the_layers(graph):
    _, edges = graph
    problems = layer_violations(edges)
    assert not problems, "imports against docs/architecture.md's layers:\n" + "\n".join(problems)


def test_every_package_has_a_layer(graph):
    modules, _ = graph
    missing = sorted({_package_of(m) for m in modules} - set(LAYERS))
    assert not missing, f"packages without a layer in LAYERS: {missing} (and say where in docs/architecture.md)"


def test_exception_tables_are_current(graph):
    modules, edges = graph
    for source, prefix in list(ALLOWED_UPWARD) + list(KNOWN_EXCEPTIONS):
        assert source in modules, f"{source} (an exception's importer) is no module any more: drop the entry"
        assert prefix in modules, f"{prefix} (an exception's target) is no module any more: drop the entry"
    for key in KNOWN_EXCEPTIONS:
        assert any(_listed(e, {key: ""}) for e in edges), f"KNOWN_EXCEPTIONS {key} matches no import any more: drop it"


def _write(root, name: str, text: str) -> None:
    path = root.joinpath(*name.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_rejects_a_cycle_and_an_upward_import(tmp_path):
    pkg = "fakepkg"
    _write(tmp_path, f"{pkg}/__init__.py", "")
    _write(tmp_path, f"{pkg}/utils/__init__.py", "")
    _write(tmp_path, f"{pkg}/utils/a.py", "def f():\n    from .b import g  # lazy, still a circle\n")
    _write(tmp_path, f"{pkg}/utils/b.py", "from . import a\n")
    _write(tmp_path, f"{pkg}/utils/c.py", f"import {pkg}.config.top\n")  # up a layer
    _write(tmp_path, f"{pkg}/config/__init__.py", "from .top import X\n")
    _write(tmp_path, f"{pkg}/config/top.py", "from . import other\nX = 1\n")  # a sibling: no circle
    _write(tmp_path, f"{pkg}/config/other.py", "from ..utils import a\n")
    modules, edges = import_graph(str(tmp_path / pkg), pkg)
    assert find_cycles(modules, cycle_edges(edges, upward={})) == [[f"{pkg}.utils.a", f"{pkg}.utils.b"]]
    layers = {pkg: 0, "utils": 0, "config": 1}
    problems = layer_violations(edges, layers, sideways={}, upward={}, known={})
    assert [p.split(":")[0] for p in problems] == [f"{pkg}.utils.c", f"{pkg}.utils.c"]  # config and config.top
    assert all("up from layer 0" in p for p in problems)
    upward = {(f"{pkg}.utils.c", f"{pkg}.config"): "why"}
    problems = layer_violations(edges, layers, sideways={}, upward=upward, known={})
    assert len(problems) == 2 and all("must be lazy" in p for p in problems)
    known = {(f"{pkg}.utils.c", f"{pkg}.config"): "why", (f"{pkg}.utils.b", f"{pkg}.utils.a"): "why"}
    assert layer_violations(edges, layers, sideways={}, upward={}, known=known) == []
    assert find_cycles(modules, cycle_edges(edges, upward={}, known=known)) == []


def test_checker_rejects_a_sideways_import_unless_listed(tmp_path):
    pkg = "fakepkg"
    _write(tmp_path, f"{pkg}/__init__.py", "")
    _write(tmp_path, f"{pkg}/data/__init__.py", "")
    _write(tmp_path, f"{pkg}/modeling/__init__.py", "from ..data import x\n")
    _, edges = import_graph(str(tmp_path / pkg), pkg)
    layers = {pkg: -1, "data": 2, "modeling": 2}
    (problem,) = layer_violations(edges, layers, sideways={}, upward={}, known={})
    assert problem.startswith(f"{pkg}.modeling:1 imports {pkg}.data: sideways within layer 2")
    assert layer_violations(edges, layers, sideways={("modeling", "data"): "why"}, upward={}, known={}) == []


def test_checker_allows_a_lazy_listed_upward_import(tmp_path):
    pkg = "fakepkg"
    _write(tmp_path, f"{pkg}/__init__.py", "")
    _write(tmp_path, f"{pkg}/low/__init__.py", "def __getattr__(name):\n    from ..high import f\n    return f\n")
    _write(tmp_path, f"{pkg}/high/__init__.py", "from ..low import x\n")
    modules, edges = import_graph(str(tmp_path / pkg), pkg)
    layers, upward = {pkg: -1, "low": 0, "high": 1}, {(f"{pkg}.low", f"{pkg}.high"): "why"}
    assert layer_violations(edges, layers, sideways={}, upward=upward, known={}) == []
    assert find_cycles(modules, cycle_edges(edges, upward=upward, known={})) == []
    assert find_cycles(modules, cycle_edges(edges, upward={}, known={})) == [[f"{pkg}.high", f"{pkg}.low"]]


def test_checker_flags_a_module_reading_its_own_package_init(tmp_path):
    pkg = "fakepkg"
    _write(tmp_path, f"{pkg}/__init__.py", "from .a import A\nB = 2\n")
    _write(tmp_path, f"{pkg}/a.py", "from . import B\nA = B\n")  # needs __init__, which imports it
    modules, edges = import_graph(str(tmp_path / pkg), pkg)
    assert find_cycles(modules, cycle_edges(edges, upward={})) == [[pkg, f"{pkg}.a"]]
