"""The package's layout (issue 18): no import cycle, no module over 800 lines, no private name imported across modules.

Read from the source with ``ast``, not by importing: every ``import`` and ``from ... import``
in a module counts, at any depth (lazy imports inside functions, and those under
``if TYPE_CHECKING:``, are dependencies too).  ``from pkg import name`` counts as importing
``pkg.name`` when that is a module, else ``pkg``.  ``memoplan/__init__.py``'s lazy
``importlib.import_module`` of its exports is not a static import and is not counted: the
package's ``__init__`` is the top of the graph, and no module of the package imports it for a
name of its own (the version lives in ``memoplan/version.py`` for that reason).

The map of the package (``docs/design.md``, "Map of the package") is read by this file too:
every module is in one of its rows, every import across rows is one the importing row's "may
import" column allows (issue 41).  The table's notation is explained above it in the doc.

The allowlists below are today's exceptions; each says why, and they are to shrink.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
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
    assert "memoplan.specs" in graph["memoplan.cli_load"]  # lazy, inside a function


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


# --- the map in docs/design.md ------------------------------------------------------------

DESIGN = ROOT / "docs" / "design.md"
MAP_HEADING = "## Map of the package"


@dataclass(frozen=True)
class MapRow:
    """One row of the map: where it is, its members and what it may import (as written)."""

    line: int  # in docs/design.md
    members: tuple[str, ...]  # backticked names ending in .py or / (``syntax/``, ``ir.py``)
    label: str | None  # the stage column's **bold** word, if any
    allowed: tuple[str, ...]  # every backticked name of the "may import" column
    text: str  # the whole row, for the paragraph check


def _map_section(text: str) -> tuple[str, int]:
    """The map section of the design page and the line number of its heading."""
    start = text.index(MAP_HEADING)
    end = text.find("\n## ", start + len(MAP_HEADING))
    return text[start : end if end >= 0 else len(text)], text[:start].count("\n") + 1


def _backticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _is_member(token: str) -> bool:
    return token.endswith((".py", "/"))


def parse_map(section: str, first_line: int) -> list[MapRow]:
    """The table's rows (header and rule skipped)."""
    rows = []
    table = [(n, line) for n, line in enumerate(section.splitlines(), first_line) if line.startswith("|")]
    for number, line in table[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3, f"docs/design.md:{number}: a map row has 3 columns (modules | stage | may import)"
        label = re.match(r"\*\*([^*]+)\*\*", cells[1])
        members = tuple(t for t in _backticked(cells[0]) if _is_member(t))
        rows.append(MapRow(number, members, label.group(1) if label else None, tuple(_backticked(cells[2])), line))
    return rows


def _dotted(token: str) -> tuple[str, bool]:
    """A member name as (dotted module, covers its submodules too): ``syntax/`` -> (memoplan.syntax, True)."""
    if token == "__init__.py":
        return "memoplan", False
    if token.endswith("/"):
        return "memoplan." + token[:-1].replace("/", "."), True
    return "memoplan." + token.removesuffix(".py").replace("/", "."), False


def _covers(token: str, module: str) -> bool:
    dotted, package = _dotted(token)
    return module == dotted or (package and module.startswith(dotted + "."))


def row_of(rows: list[MapRow], module: str) -> MapRow | None:
    """The most specific row that holds ``module`` (``report/data.py`` before ``report/``)."""
    best, key = None, (-1, False)
    for row in rows:
        for token in row.members:
            if _covers(token, module):
                dotted, package = _dotted(token)
                if (len(dotted), not package) > key:
                    best, key = row, (len(dotted), not package)
    return best


def map_problems(rows: list[MapRow], modules: set[str]) -> list[str]:
    """Names in the table that mean nothing: a member or an allowed name that is no module, no row's label."""
    labels = {row.label for row in rows if row.label}
    problems = []
    for row in rows:
        if not row.members:
            problems.append(
                f"docs/design.md:{row.line}: a map row names no module (`x.py` or `x/`) in its first column"
            )
        for token in row.members:
            if not any(_covers(token, m) for m in modules):
                problems.append(
                    f"docs/design.md:{row.line}: `{token}` is no module of memoplan/ (drop it from the row)"
                )
        for token in row.allowed:
            known = token == "*" or token in labels or (_is_member(token) and any(_covers(token, m) for m in modules))
            if not known:
                problems.append(
                    f"docs/design.md:{row.line}: may import `{token}`, which is no module (`x.py`, `x/`), "
                    "no row's **label** and not `*` (write commentary without backticks)"
                )
    return problems


def _member_hint(module: str) -> str:
    parts = module.split(".")[1:]
    return f"`{parts[0]}/`" if len(parts) > 1 else f"`{parts[0]}.py`"


def unmapped(rows: list[MapRow], modules: set[str], section: str) -> list[str]:
    """Modules in no row; submodules of a package row named neither in that row nor in the section."""
    problems = []
    for module in sorted(modules):
        row = row_of(rows, module)
        if row is None:
            problems.append(
                f"{module} is in no row of docs/design.md's map: add {_member_hint(module)} to the first "
                "column of the row of its stage (or add a row)"
            )
            continue
        package = next((t for t in row.members if t.endswith("/") and _covers(t, module)), None)
        if package is None or module == _dotted(package)[0]:
            continue
        name = module.removeprefix(_dotted(package)[0] + ".").split(".")[0]
        path = f"{package}{name}"
        paragraphs = [p for p in section.split("\n\n") if p.startswith(f"Inside `{package}`")]
        near = [_backticked(text) for text in [row.text, *paragraphs]]
        named = any(t in (name, f"{name}.py", f"{name}/") for tokens in near for t in tokens)
        if not named and not any(t in (f"{path}.py", f"{path}/") for t in _backticked(section)):
            problems.append(
                f"{module} is not named in docs/design.md's map: name `{name}` in the row of `{package}` "
                f"(docs/design.md:{row.line}) or in a paragraph starting 'Inside `{package}`', or write `{path}.py` there"
            )
    return problems


def import_problems(rows: list[MapRow], graph: dict[str, dict[str, int]], files: dict[str, str]) -> list[str]:
    """Imports across rows that the importing module's row does not allow."""
    by_label = {row.label: row for row in rows if row.label}
    problems = []
    for module, edges in sorted(graph.items()):
        row = row_of(rows, module)
        if row is None:
            continue  # unmapped() says so
        allowed = [*row.members]
        for token in row.allowed:
            allowed.extend(by_label[token].members if token in by_label else [token])
        for target, line in sorted(edges.items()):
            if "*" in allowed or any(_covers(token, target) for token in allowed):
                continue
            home = row_of(rows, target)
            hint = next((t for t in home.members if _covers(t, target)), "?") if home else _member_hint(target)[1:-1]
            may = ", ".join(f"`{t}`" for t in row.allowed) or "nothing outside its row"
            problems.append(
                f"{files.get(module, module)}:{line} imports {target}, which its row of docs/design.md's map "
                f"(docs/design.md:{row.line}, `{'`, `'.join(row.members)}`) does not allow; it may import: {may}. "
                f'Add `{hint}` to that row\'s "may import" column if the stage order allows it, or move the import'
            )
    return problems


def _the_map() -> tuple[list[MapRow], str]:
    section, first = _map_section(DESIGN.read_text(encoding="utf-8"))
    return parse_map(section, first), section


def test_the_map_names_only_modules():
    rows, _ = _the_map()
    assert rows, "docs/design.md has no map table"
    problems = map_problems(rows, set(MODULES))
    assert not problems, "docs/design.md's map:\n" + "\n".join(problems)


def test_every_module_is_in_the_map():
    rows, section = _the_map()
    problems = unmapped(rows, set(MODULES), section)
    assert not problems, "modules missing from docs/design.md's map:\n" + "\n".join(problems)


def test_imports_follow_the_map():
    rows, _ = _the_map()
    files = {name: path.relative_to(PACKAGE.parent).as_posix() for name, (path, _) in MODULES.items()}
    problems = import_problems(rows, _graph(), files)
    assert not problems, "imports the map does not allow:\n" + "\n".join(problems)


_TOY_MAP = """## Map of the package

| modules | stage | may import |
| --- | --- | --- |
| `leaf.py`, `other.py` | **leaves**: shared | nothing |
| `low/` (`a`, `b`) | low stage | `leaves` |
| `low/b.py` | pure | nothing |
| `high.py` | top | `low/`, `leaf.py` (commentary without backticks) |
| `cli.py` | the command | `*` |

Inside `low/`, `c` is named here.
"""


def test_the_map_checks_fail_where_they_should():
    modules = {"memoplan.leaf", "memoplan.other", "memoplan.low", "memoplan.low.a", "memoplan.low.b"}
    modules |= {"memoplan.low.c", "memoplan.high", "memoplan.cli"}
    rows = parse_map(_TOY_MAP, 1)
    assert [r.line for r in rows] == [5, 6, 7, 8, 9] and rows[0].label == "leaves"
    assert row_of(rows, "memoplan.low.b").line == 7 and row_of(rows, "memoplan.low.a").line == 6
    assert map_problems(rows, modules) == [] and unmapped(rows, modules, _TOY_MAP) == []
    # a module in no row, a package's submodule named nowhere, a member that is no module
    missing = unmapped(rows, modules | {"memoplan.step", "memoplan.low.d"}, _TOY_MAP)
    assert len(missing) == 2 and "add `step.py`" in missing[1] and "name `d` in the row of `low/`" in missing[0]
    assert "`high.py` is no module" in map_problems(rows, modules - {"memoplan.high"})[0]
    # allowed: own row, a label, a listed package, anything for `*`
    good = {
        "memoplan.low.a": {"memoplan.leaf": 1, "memoplan.low.b": 2},
        "memoplan.high": {"memoplan.low.b": 1, "memoplan.leaf": 2},
        "memoplan.cli": {"memoplan.high": 1},
    }
    assert import_problems(rows, good, {}) == []
    # not allowed: a row importing what its row does not name, a specific row's stricter rule
    bad = {
        "memoplan.leaf": {"memoplan.low.a": 3},
        "memoplan.low.b": {"memoplan.leaf": 4},
        "memoplan.high": {"memoplan.other": 5},
    }
    problems = import_problems(rows, bad, {"memoplan.leaf": "memoplan/leaf.py"})
    assert len(problems) == 3
    assert problems[0].startswith("memoplan.high:5 imports memoplan.other") and "Add `other.py`" in problems[0]
    assert problems[1].startswith("memoplan/leaf.py:3 imports memoplan.low.a") and "(docs/design.md:5," in problems[1]
    assert "memoplan.low.b:4" in problems[2] and "nothing outside its row" in problems[2]


# --- inside planner/: the layers ---------------------------------------------------------------

# docs/design.md's "Inside `planner/`" paragraph, in order; the pipeline (the rest of planner/) is last
PLANNER_LAYERS = (
    ("memoplan.planner.budgets", "memoplan.planner.config", "memoplan.planner.tell"),  # the planner's data
    ("memoplan.planner.profiling",),  # the estimate and the measurement
    ("memoplan.planner.search",),  # what to checkpoint
    ("memoplan.planner.dtr",),  # the dtr block
)


def planner_layer(module: str) -> int:
    """The layer of a planner module: its index in PLANNER_LAYERS, else the pipeline's (last)."""
    for index, members in enumerate(PLANNER_LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return index
    return len(PLANNER_LAYERS)


def planner_layer_problems(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports inside planner/ that run down the layers (a layer imports its own and those above)."""
    problems = []
    for module, edges in sorted(graph.items()):
        if not module.startswith("memoplan.planner."):
            continue
        for target, line in sorted(edges.items()):
            if target.startswith("memoplan.planner.") and planner_layer(target) > planner_layer(module):
                problems.append(
                    f"{module} (line {line}) imports {target}, a later layer of planner/ "
                    f"({planner_layer(module) + 1} imports {planner_layer(target) + 1}; docs/design.md, 'Inside `planner/`')"
                )
    return problems


def test_the_planner_is_layered():
    problems = planner_layer_problems(_graph())
    assert not problems, "\n".join(problems)


def test_the_planner_layer_check_fails_where_it_should():
    graph = {
        "memoplan.planner.search.chain": {"memoplan.planner.profiling.schema": 3, "memoplan.planner.budgets": 4},
        "memoplan.planner.profiling.profile": {"memoplan.planner.search": 7},
        "memoplan.planner.budgets": {"memoplan.planner.plan": 9},
        "memoplan.planner.dtr.plan": {"memoplan.planner.search.write": 2},
    }
    problems = planner_layer_problems(graph)
    assert len(problems) == 2, problems
    assert problems[0].startswith("memoplan.planner.budgets (line 9) imports memoplan.planner.plan")
    assert problems[1].startswith("memoplan.planner.profiling.profile (line 7) imports memoplan.planner.search")
