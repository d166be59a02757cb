"""The sublinear search's settings from the command line: ``--thresh-nr-try`` ... options over a
plan's `sublinear` block, over ``MGB_SUBLINEAR_MEMORY_*`` variables (for users coming from MegEngine)."""

from __future__ import annotations

from memoplan.cli_output import progress as _progress
from memoplan.diagnostics import Diagnostic, PlanError

__all__ = ["sublinear_config", "sublinear_env_config"]


def _block_config(text: str, origin: str):
    """The settings of the one `sublinear` block in ``text`` (a plan written from options or
    variables), checked as the language checks a block: a bad value is the same diagnostic."""
    from memoplan.syntax import ast, parse_with_diagnostics
    from memoplan.syntax.blocks import config_of

    plan, diagnostics = parse_with_diagnostics(text, origin)
    if plan is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), text)
    (block,) = [s for s in plan.statements if isinstance(s, ast.ConfigBlock)]
    return config_of(block)


def sublinear_config(args, block=None):
    """The sublinear search's settings: a plan's `sublinear` block with the ``--thresh-nr-try``
    ... options over it (None when there is neither).

    The options are read as the entries of a `sublinear` block, so the types, ranges and
    defaults are the language's (`grammar/README.md`), and a bad value is the same diagnostic.
    """
    from dataclasses import replace

    from memoplan.planner.knobs import SUBLINEAR_KNOBS
    from memoplan.syntax.blocks import config_of

    base = None if block is None else config_of(block)
    given = {row.name: getattr(args, row.name) for row in SUBLINEAR_KNOBS if getattr(args, row.name) is not None}
    env = sublinear_env_config(args, block)
    if env is not None:  # the environment's keys, under the block's and the options'
        written = () if block is None else tuple(e.key for e in block.entries)
        base = env if base is None else replace(env, **{key: getattr(base, key) for key in written})
    if not given:
        return base
    for key, value in given.items():  # one value each: nothing that would start another entry
        if any(c in value for c in ";{}#=\\\n\r"):
            raise PlanError((Diagnostic("MP202", f"`--{key.replace('_', '-')} {value}` is not one value"),))
    entries = "; ".join(f"{key} = {value}" for key, value in given.items())
    options = _block_config(f"memplan 1\nsublinear {{ {entries} }}\n", "<command line>")
    return options if base is None else replace(base, **{key: getattr(options, key) for key in given})


def sublinear_env_config(args, block):
    """The sublinear search's settings that ``MGB_SUBLINEAR_MEMORY_*`` variables set (None: none set).

    Read only for ``--planner sublinear`` (or a plan's `sublinear` block); otherwise a note says they
    were not used.  Each one read is said on stderr: they are defaults, under the block and the options.
    """
    import os

    from memoplan.planner.search.mgb_env import sublinear_env

    env = sublinear_env(os.environ)
    if not env:
        return None
    if args.planner != "sublinear" and block is None:
        names = ", ".join(name for name, _ in env.values())
        _progress(f"note: {names} not used: the sublinear search reads it (--planner sublinear)")
        return None
    text = "memplan 1\nsublinear { " + "; ".join(f"{key} = {value}" for key, (_, value) in env.items()) + " }\n"
    config = _block_config(text, "<environment>")
    for key, (name, value) in env.items():
        _progress(f"note: {name} read as the sublinear search's default {key} = {value}")
    return config
