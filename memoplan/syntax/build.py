"""Syntax stage: turns the Lark parse tree into the typed AST, checking every value as it goes.

:class:`Builder` is the rules of one plan's statements (header, model, example tensors,
budget, blocks) over those of policies (:mod:`memoplan.syntax.build_policies`), selectors
(:mod:`memoplan.syntax.build_selectors`) and values (:mod:`memoplan.syntax.build_values`).

Problems are collected, not raised, so that one run reports all errors of a file.
Comments are attached to nodes afterwards, by ``memoplan.syntax.assemble``.
"""

from __future__ import annotations

from typing import Any

from lark import Token, v_args

from memoplan.diagnostics import did_you_mean
from memoplan.syntax import ast
from memoplan.syntax.blocks import check_block
from memoplan.syntax.build_policies import PolicyRules
from memoplan.syntax.build_selectors import SelectorRules
from memoplan.syntax.literals import number, unit_help
from memoplan.syntax.policies import policy_names

POLICY_NAMES = policy_names()  # syntax/policies.py: every policy and its options, once
STATEMENT_NAMES = ("model", "example", "module", "budget", "dtr", "sublinear", "memory", "memonger", "step")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
DTYPES = FLOAT_DTYPES + ("int64", "int32", "int16", "int8", "uint8", "bool")


class Builder(PolicyRules, SelectorRules):
    """Lark transformer: grammar rules -> AST nodes (without comments).

    The parser runs its methods as each rule is reduced (:mod:`memoplan.syntax.inline`), so no
    parse tree is built; ``Builder(file).transform(tree)`` of a parse tree gives the same nodes.
    """

    # ------------------------------------------------------------ header / model / example

    def header(self, children):
        token = children[0]
        version = int(token)
        if version != 1:
            self.error(
                "MP103",
                f"unsupported plan version {version}",
                self.span(token),
                "this memoplan reads `memplan 1`",
            )
        return ("header", version, self.span(token))

    @v_args(meta=True)
    def model_stmt(self, meta, children):
        spec = self.string(children[0])
        if ":" not in spec:
            self.error(
                "MP501",
                f"model spec `{spec}` has no `:`",
                self.span(children[0]),
                "write `package.module:factory` or `path/to/file.py:factory`",
            )
        return ast.ModelStmt(spec, span=self.span(meta))

    @v_args(meta=True)
    def example_import(self, meta, children):
        return ast.ExampleStmt(spec=self.string(children[0]), span=self.span(meta))

    @v_args(meta=True)
    def example_tensors(self, meta, children):
        return ast.ExampleStmt(tensors=tuple(c for c in children if c is not None), span=self.span(meta))

    def positional_arg(self, children):
        return (None, number(children[0]), children[0])

    def keyword_arg(self, children):
        key, value = children
        return (str(key), number(value) if value.type == "NUMBER" else str(value), key)

    @v_args(meta=True)
    def tensor_spec(self, meta, children):
        name_token, *args = children
        args = [a for a in args if a is not None]
        span = self.span(meta)
        fn = self.enum_value(ast.TensorFn, str(name_token), self.span(name_token), "an example tensor")
        shape, options = self._tensor_arguments(args)
        if fn is None:
            return None
        if fn is ast.TensorFn.RANDINT and "high" not in options:
            self.error("MP209", "`randint` needs `high=`", span, "e.g. `randint(4, 16, high=100)`")
        elif fn is not ast.TensorFn.RANDINT and ("low" in options or "high" in options):
            self.error("MP201", f"`{fn.value}` takes no `low`/`high`", span, "only `randint` does")
        elif "low" in options and "high" in options and options["low"] >= options["high"]:
            self.error("MP203", "`low` must be below `high`", span, "`randint` draws from [low, high)")
        elif fn in (ast.TensorFn.RANDN, ast.TensorFn.RAND) and options.get("dtype", "float32") not in FLOAT_DTYPES:
            self.error(
                "MP203",
                f"`{fn.value}` draws floats; `dtype={options['dtype']}` is not a float dtype",
                span,
                "use `randint` for integer or bool tensors",
            )
        return ast.TensorSpec(
            fn, tuple(shape), options.get("low"), options.get("high"), options.get("dtype"), span=span
        )

    def _tensor_arguments(self, args) -> tuple[list[int], dict[str, Any]]:
        """An example tensor's sizes and its keyword arguments (``low``, ``high``: int; ``dtype``: str),
        each checked; a bad one is reported and left out."""
        shape: list[int] = []
        options: dict[str, Any] = {}  # low and high: int; dtype: str
        seen: dict[str, Token] = {}
        for key, value, token in args:
            if key is not None and key in seen:
                self.error(
                    "MP208",
                    f"argument `{key}` is given twice",
                    self.span(token),
                    "remove one of them",
                    notes=(("first given", self.span(seen[key])),),
                )
                continue
            if key is not None:
                seen[key] = token
            if key is None:
                if options:
                    self.error(
                        "MP202",
                        "sizes come before keyword arguments",
                        self.span(token),
                        "e.g. `randint(4, 16, high=100)`",
                    )
                elif not isinstance(value, int) or value < 0:
                    self.error(
                        "MP203",
                        f"a dimension must be an integer >= 0, not `{value}`",
                        self.span(token),
                        "e.g. `randn(4, 3, 32, 32)`",
                    )
                else:
                    shape.append(value)
            elif key in ("low", "high"):
                if not isinstance(value, int):
                    self.error("MP202", f"`{key}` expects an integer", self.span(token), f"e.g. `{key}=10`")
                else:
                    options[key] = value
            elif key == "dtype":
                if value not in DTYPES:
                    self.error(
                        "MP204",
                        f"unknown dtype `{value}`",
                        self.span(token),
                        did_you_mean(str(value), DTYPES) or "allowed: " + ", ".join(DTYPES),
                    )
                else:
                    options[key] = value
            else:
                self.error(
                    "MP201",
                    f"unknown argument `{key}` for an example tensor",
                    self.span(token),
                    did_you_mean(key, ("low", "high", "dtype")) or "arguments: low, high, dtype",
                )
        return shape, options

    # ------------------------------------------------------------ budget / blocks

    @v_args(meta=True)
    def budget_stmt(self, meta, children):
        amount_token, mode_token = children
        convert = {"SIZE": self.size, "PERCENT": self.percent, "NUMBER": self.number}[amount_token.type]
        amount = convert([amount_token])
        if amount is None:
            return None
        span = self.span(amount_token)
        unit = next((u for u in ast.Unit if mode_token and u.symbol.lower() == str(mode_token).lower()), None)
        if unit is not None:
            self.error(
                "MP100",
                f"unknown unit `{mode_token}`",
                self.span(mode_token),
                unit_help(str(mode_token), unit.symbol),
            )
            return None
        if isinstance(amount, ast.Size) and amount.bytes <= 0:
            self.error("MP203", "a budget must be more than 0 bytes", span, "e.g. `budget 4 GiB`")
        elif isinstance(amount, ast.Percent) and not 0 < amount.value <= 100:
            self.error(
                "MP203", "a percentage budget must be in (0%, 100%]", span, "a share of the unplanned peak, e.g. `60%`"
            )
        elif isinstance(amount, (int, float)) and not 0 < amount <= 1:
            self.error(
                "MP203",
                "a fractional budget must be in (0, 1]",
                span,
                "a fraction of the unplanned peak; for bytes write a unit, e.g. `4 GiB`",
            )
        mode = None
        if mode_token is not None:
            mode = self.enum_value(ast.BudgetMode, str(mode_token), self.span(mode_token), "`budget`")
        return ast.Budget(amount, mode, span=self.span(meta))

    @v_args(meta=True)
    def entry(self, meta, children):
        key, value = children
        return ast.ConfigEntry(str(key), value, span=self.span(meta))

    @v_args(meta=True)
    def config_block(self, meta, children):
        kind_token, *entries = children
        block = ast.ConfigBlock(
            ast.BlockKind(str(kind_token)),
            tuple(e for e in entries if e is not None),
            span=self.span(meta),
        )
        self.diagnostics.extend(check_block(block))
        return block

    def start(self, children):
        return children
