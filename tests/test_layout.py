"""The package's layout (issue 18): no import cycle, no module over 800 lines, no private name imported across modules.

Read from the source with ``ast``, not by importing: every ``import`` and ``from ... import``
in a module counts, at any depth (lazy imports inside functions, and those under
``if TYPE_CHECKING:``, are dependencies too).  ``from pkg import name`` counts as importing
``pkg.name`` when that is a module, else ``pkg``.  ``memoplan/__init__.py``'s lazy
``importlib.import_module`` of its exports is not a static import and is not counted: the
package's ``__init__`` is the top of the graph, and no module of the package imports it for a
name of its own (the version lives in ``memoplan/version.py`` for that reason).

The allowlists below are today's exceptions; each says why, and they are to shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

from _paths import ROOT

PACKAGE = ROOT / "memoplan"
MAX_LINES = 800

# Modules over MAX_LINES today (none).  Remove an entry once its module is split.
LONG_ALLOWED: set[str] = set()

# Import cycles allowed today, each as the set of modules in it (a strongly connected component
# of the import graph must be one of these, or inside one).  Remove an entry once it is broken.
CYCLES_ALLOWED: list[set[str]] = []

# Functions over MAX_FUNCTION_LINES (def line to last line, docstring and decorators' def
# included), as "module:qualified name", at most 3.  Each says why; remove an entry once split.
MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}

# Private names imported across modules today: (importing module, module imported from, name).
PRIVATE_ALLOWED: set[tuple[str, str, str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(module imported, name taken from it or None, line) for every import statement in ``name``."""
    path, is_package = MODULES[name]
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                source = ".".join(base) + (f".{node.module}" if node.module else "")
            else:
                source = node.module or ""
            found.extend((source, alias.name, node.lineno) for alias in node.names)
    return found


def _graph() -> dict[str, dict[str, int]]:
    """Module -> {module of the package it imports: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for name in MODULES:
        edges: dict[str, int] = {}
        for source, taken, line in _imports(name):
            if taken is not None and f"{source}.{taken}" in MODULES:
                target = f"{source}.{taken}"
            else:
                target = source
                while target and target not in MODULES:  # ``import memoplan.x.y`` of a name, not a module
                    target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _cycle_in(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    """One cycle through the component's first module, as ``a (line n) -> b ... -> a``."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node]):
            if child == start:
                path = [*paths[node], start]
                return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {start}"
            if child in members and child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(component)  # pragma: no cover - a component always has a cycle through each member


def test_the_graph_sees_every_kind_of_import():
    graph = _graph()
    assert "memoplan.runtime.region" in graph["memoplan.runtime"]  # from-import of a name
    assert "memoplan.runtime.gradroot" in graph["memoplan.runtime.region"]  # from pkg import module
    assert "memoplan.syntax.ast" in graph["memoplan.syntax.parser"]  # a module, not the package
    assert "memoplan.specs" in graph["memoplan.cli"]  # lazy, inside a function


def test_no_import_cycle():
    graph = _graph()
    cycles = [
        _cycle_in(graph, component)
        for component in _components(graph)
        if not any(set(component) <= allowed for allowed in CYCLES_ALLOWED)
    ]
    assert not cycles, "import cycles in memoplan/:\n" + "\n".join(cycles)


def test_no_module_over_800_lines():
    long = []
    for path, _ in MODULES.values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if lines > MAX_LINES and relative not in LONG_ALLOWED:
            long.append(f"{relative}: {lines} lines")
    assert not long, f"modules over {MAX_LINES} lines (split by idea, issue 18):\n" + "\n".join(long)


def _long_functions(tree: ast.Module, limit: int) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function longer than ``limit`` lines,
    methods and nested functions included."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_function_check_sees_methods_and_nested_functions():
    source = "class A:\n    def f(self):\n        def g():\n" + "            pass\n" * 3 + "async def h():\n    pass\n"
    assert _long_functions(ast.parse(source), 2) == [("A.f", 2, 5), ("A.f.g", 3, 4)]
    assert _long_functions(ast.parse(source), 1) == [("A.f", 2, 5), ("A.f.g", 3, 4), ("h", 7, 2)]


def test_no_function_over_80_lines():
    assert len(LONG_FUNCTIONS_ALLOWED) <= 3
    long, seen = [], set()
    for name, (path, _) in MODULES.items():
        for function, line, length in _long_functions(ast.parse(path.read_text(encoding="utf-8")), MAX_FUNCTION_LINES):
            key = f"{name}:{function}"
            seen.add(key)
            if key not in LONG_FUNCTIONS_ALLOWED:
                long.append(f"{path.relative_to(PACKAGE.parent).as_posix()}:{line} {function}: {length} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split into named helpers):\n" + "\n".join(long)
    stale = sorted(set(LONG_FUNCTIONS_ALLOWED) - seen)
    assert not stale, f"allowed long functions that are short now (drop them from the list): {stale}"


def test_no_private_name_imported_across_modules():
    offenders = []
    for name in MODULES:
        for source, taken, line in _imports(name):
            if taken is None or not (source == "memoplan" or source.startswith("memoplan.")):
                continue
            private = taken.startswith("_") and not (taken.startswith("__") and taken.endswith("__"))
            if private and f"{source}.{taken}" not in MODULES and (name, source, taken) not in PRIVATE_ALLOWED:
                offenders.append(f"{name} (line {line}) imports {taken} from {source}")
    assert not offenders, (
        "private names imported across modules (give them a public name where they live):\n" + "\n".join(offenders)
    )


def test_test_folders_mirror_the_package():
    """tests/<name>/ holds the tests of memoplan/<name>/ (a subpackage); tests of memoplan's
    top-level modules and of the project as a whole (packaging, docs, layout) stay in tests/.
    Test file names are unique across folders (pytest imports them by base name)."""
    tests = ROOT / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders <= subpackages, f"test folders that are no subpackage of memoplan: {sorted(folders - subpackages)}"
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
