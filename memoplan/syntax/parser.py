"""Syntax stage: ``.memplan`` text -> AST, with every error of a file reported in one run.

Parsing never runs user code.  Syntax errors are mapped to coded diagnostics
(``MP1xx``, :mod:`memoplan.syntax.errors`).  A text with one is cut into its top-level
statements, each parsed on its own; after each error the offending line (or the whole block a
bad line opens) is blanked out and that statement parsed again, so later errors are found too,
without cascades and in time linear in the text (:mod:`memoplan.syntax.recovery`).  Value
errors (``MP2xx``) come from ``build``.  Files are read, and their size limited, by
:mod:`memoplan.syntax.reading`; comments are attached by :mod:`memoplan.syntax.assemble`.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.syntax import ast, reading
from memoplan.syntax.assemble import assemble
from memoplan.syntax.lalr import LOCK
from memoplan.syntax.reading import missing_header, read_plan, too_large
from memoplan.syntax.recovery import errors_by_statement, parse_tree_locked


def parse(text: str, file: str = "<memory>") -> ast.Plan:
    """Parse plan text; raise :class:`PlanError` with every diagnostic if anything is wrong.

    Warnings alone do not raise; they are available from :func:`parse_with_diagnostics`.
    """
    plan, diagnostics = parse_with_diagnostics(text, file)
    if plan is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), text)
    return plan


def load(path: str | Path) -> ast.Plan:
    """Read and parse a ``.memplan`` file (UTF-8, a byte-order mark allowed)."""
    return parse(read_plan(path), str(path))


def parse_with_diagnostics(text: str, file: str = "<memory>") -> tuple[ast.Plan | None, list[Diagnostic]]:
    """Parse plan text and return ``(plan or None, diagnostics)`` without raising.

    Lines may end in ``\\n``, ``\\r\\n`` or ``\\r`` (each is one line break, as Python's
    text files read them); the plan's ``source`` has ``\\n`` only.  Text longer than
    ``reading.MAX_PLAN_BYTES`` characters is ``MP109`` and not parsed.
    """
    with _gc_paused():
        return _parse_with_diagnostics(text, file)


@contextlib.contextmanager
def _gc_paused():
    """The cyclic garbage collector off while a plan is parsed.

    A parse allocates a few objects per character and frees none of them until it ends: the
    collector's passes over them found nothing and took half the time of a large plan
    (``benchmarks/parse_speed.py``).  Reference counting still frees everything; the
    collector runs again as soon as the parse returns.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_with_diagnostics(text: str, file: str) -> tuple[ast.Plan | None, list[Diagnostic]]:
    if len(text) > reading.MAX_PLAN_BYTES:
        return None, [too_large(file, len(text), "characters")]
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    missing = missing_header(text, file)
    if missing:
        return None, [missing]
    items, comments, diagnostics = _parse_tree(text, file, "start")
    if items is None:
        return None, _in_order(diagnostics)
    plan = assemble(items, comments, file, text, diagnostics)
    return plan, _in_order(diagnostics)


def _in_order(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(diagnostics, key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))


def parse_example_spec(text: str, file: str = "<example>") -> ast.ExampleStmt:
    """Parse an inline example such as ``randn(4, 3, 32, 32)`` or an import spec in quotes.

    A bare ``pkg.mod:factory`` or ``path.py:factory`` (no parentheses) is taken as an import spec.
    """
    stripped = text.strip()
    if ":" in stripped and "(" not in stripped and not stripped.startswith('"'):
        return ast.ExampleStmt(spec=stripped)
    source = f"example {stripped}"
    stmt, _, diagnostics = _parse_tree(source, file, "example_stmt", recover=False)
    if stmt is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), source)
    return stmt


def _parse_tree(text: str, file: str, start: str, recover: bool = True):
    """``(built items or None, comments, diagnostics)``: the syntax errors, or the value errors of the build."""
    with LOCK:
        if start != "start" or not recover:
            built, comments, diagnostics, values = parse_tree_locked(text, file, start, recover)
            return built, comments, diagnostics + values
        built, comments, diagnostics, values = parse_tree_locked(text, file, start, False)
        if built is None:  # a syntax error: find every error statement by statement
            return None, [], errors_by_statement(text, file, first=diagnostics)
        return built, comments, diagnostics + values
