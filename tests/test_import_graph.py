"""pactlib's modules import one way: no two modules (directly or through others) import each other.

The graph is read from the source with :mod:`ast`, not from ``sys.modules``, so that every import
counts — at module level and inside functions, methods and ``try`` blocks — whether or not a test
happens to run the code that holds it. How edges are drawn:

- ``import pactlib.a.b`` and ``from pactlib.a import b`` where ``b`` is a submodule: an edge to
  ``pactlib.a.b``. ``from pactlib.a import name`` where ``name`` is not a submodule: an edge to
  the package ``pactlib.a`` (its ``__init__``), which is where the name is looked up.
- Relative imports are resolved against the importing module's package.
- Importing ``pactlib.a.b`` runs ``pactlib.a``'s ``__init__`` first; that implicit step is not an
  edge (else every package whose ``__init__`` imports its own submodules would be a circle).
- Imports under ``if TYPE_CHECKING:`` never run and are not edges.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pactlib

ROOT = Path(pactlib.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of pactlib (packages named by their __init__)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("pactlib",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of ``tree``, at any depth, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """Module -> the pactlib modules it imports (edges as the module docstring draws them)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in modules else source)
            for target in targets:
                # `import pactlib.a.b.c` of a name not in the package: the deepest module it names
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [m0, m1, ..., m0], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        iters = [iter(sorted(graph[start]))]
        state[start] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(graph[nxt])))
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per group of modules that import each other (each strongly connected component of
    more than one module), as [m0, m1, ..., m0]."""
    out, seen = [], set()
    while True:
        rest = {m: {n for n in e if n not in seen} for m, e in graph.items() if m not in seen}
        cycle = find_cycle(rest)
        if cycle is None:
            return out
        out.append(cycle)
        # every module that reaches the cycle and is reached from it belongs to the same group
        back = {m: {n for n, e in rest.items() if m in e} for m in rest}
        seen |= _reach(cycle[0], rest) & _reach(cycle[0], back)


def _reach(start: str, graph: dict[str, set[str]]) -> set[str]:
    found, stack = {start}, [start]
    while stack:
        for n in graph.get(stack.pop(), ()):
            if n not in found:
                found.add(n)
                stack.append(n)
    return found


def test_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    # module level, relative, `from . import submodule`
    assert "pactlib.merges.ties" in graph["pactlib.merges"]
    assert "pactlib.merges.registry" in graph["pactlib.merges"]
    # `from ..native import x` is an edge to the package native; `from . import kernels` to the submodule
    assert "pactlib.native" in graph["pactlib.fastpath"]
    assert "pactlib.fastpath.kernels" in graph["pactlib.fastpath"]
    # function level: cli imports the fast path inside main()
    assert "pactlib.fastpath" in graph["pactlib.cli"]


def test_find_cycle_reports_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}) == [["a", "b", "a"], ["c", "d", "c"]]


def test_no_import_cycle_between_pactlib_modules():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)
