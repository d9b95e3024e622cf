"""Layers point one way: the imports of ``svcframe`` (the framework), ``providers`` and ``selftest``
(the application), read from the source with ``ast`` (module-level, function-level and ``TYPE_CHECKING``
imports), have no upward edge (svcframe imports neither providers nor selftest, providers does not import
selftest; type-only imports included) and no cycle between modules, even through type annotations. The package ships ``py.typed``
and re-exports its public API."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Lower layers first: a module may import its own layer's modules and those of the layers before it.
LAYERS = ("svcframe", "providers", "selftest")


def _modules() -> dict[str, Path]:
    """Our modules, by their Python sources (a compiled module is built from its .py)."""
    found = {}
    for package in LAYERS:
        paths = [*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.pyi")]
        for path in sorted(p for p in paths if p.suffix == ".py" or not p.with_suffix(".py").exists()):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of ours that ``import name`` loads last (``a.b.c`` -> ``a.b`` when ``c`` is an attribute)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _typing_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never run: type annotations only)."""
    found = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name | ast.Attribute) and (getattr(test, "id", None) or test.attr) == "TYPE_CHECKING":
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Import | ast.ImportFrom)}
    return found


def _imports(module: str, *, typing: bool = True) -> list[tuple[str, int]]:
    """(module of ours imported, line) for every import statement anywhere in ``module``'s source (with
    ``typing=False``, not those under ``if TYPE_CHECKING:``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skip = set() if typing else _typing_only(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # ``from a import b``: the submodule a.b if there is one, else module a
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        out += [(owner, node.lineno) for t in targets if (owner := _owner(t)) not in (None, module)]
    return sorted(set(out), key=lambda edge: edge[1])


EDGES = {module: _imports(module) for module in MODULES}
RUNTIME_EDGES = {module: _imports(module, typing=False) for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_walker_sees_every_kind_of_import() -> None:
    """A check on the check: top-level, function-level and relative imports are all edges."""
    assert len(MODULES) > 40 and {"svcframe.cli", "svcframe.cli.common", "selftest.cli.workloads"} <= set(MODULES)
    edges = {m: {t for t, _ in e} for m, e in EDGES.items()}
    assert "svcframe.config" in edges["svcframe.cli.common"]  # from ..config import ... (top level)
    assert "svcframe.engine" in edges["svcframe.cli.call"]  # from ..engine import Engine (inside a function)
    assert "svcframe.admin" in edges["svcframe.server"]  # from .admin import ... (inside a method)
    assert "svcframe.cli.common" in edges["selftest.cli.workloads"]  # absolute, a package's submodule
    assert "svcframe.progress" in edges["svcframe.settings"]
    # control.py imports config under TYPE_CHECKING only: an edge for the layers, not a runtime one
    assert "svcframe.config" in edges["svcframe.control"]
    assert "svcframe.config" not in {t for t, _ in RUNTIME_EDGES["svcframe.control"]}


def _loop_through(start: str, component: list[str], edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The shortest import path from ``start`` back to itself inside ``component``, as ``a -> b (file:line)``."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        here = queue.pop(0)
        for target, line in edges[here]:
            step = [*paths[here], f"-> {target} ({MODULES[here].relative_to(ROOT)}:{line})"]
            if target == start:
                return step
            if target in component and target not in paths:
                paths[target] = step
                queue.append(target)
    raise AssertionError(f"no loop through {start}")


def _assert_no_cycle(edges: dict[str, list[tuple[str, int]]]) -> None:
    cycles = _cycles({m: {t for t, _ in e} for m, e in edges.items()})
    loops = [" ".join(_loop_through(cycle[0], cycle, edges)) for cycle in cycles]
    assert not cycles, "import cycles (each shown by one loop through it):\n  " + "\n  ".join(loops)


def test_no_import_cycle_between_modules() -> None:
    """Imports that run (at module level or in functions) form no cycle."""
    _assert_no_cycle(RUNTIME_EDGES)


def test_no_import_cycle_even_through_type_annotations() -> None:
    _assert_no_cycle(EDGES)


def test_no_upward_import() -> None:
    upward = [
        f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}"
        for m, edges in EDGES.items()
        for target, line in edges
        if LAYERS.index(target.split(".")[0]) > LAYERS.index(m.split(".")[0])
    ]
    assert not upward, "the framework must not import the application:\n  " + "\n  ".join(upward)


def test_admin_is_written_against_the_server_control_interface() -> None:
    targets = {t for t, _ in EDGES["svcframe.admin"]}
    assert "svcframe.server" not in targets and "svcframe.control" in targets


def test_public_api_and_py_typed() -> None:
    import svcframe

    assert (ROOT / "svcframe" / "py.typed").is_file()
    missing = [name for name in svcframe.__all__ if not hasattr(svcframe, name)]
    assert not missing
    for name in ("Engine", "Provider", "ProviderHandle", "rpc", "register_provider_type", "BulkHandle", "GroupError"):
        assert name in svcframe.__all__


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
