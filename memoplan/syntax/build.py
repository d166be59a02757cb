"""Syntax stage: turns the Lark parse tree into the typed AST, checking every value as it goes.

Problems are collected, not raised, so that one run reports all errors of a file.
Comments are attached to nodes afterwards, by ``memoplan.syntax.parser``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from lark import Token, Transformer, v_args

from memoplan.diagnostics import Diagnostic, Span, did_you_mean
from memoplan.syntax import ast
from memoplan.syntax.blocks import check_block
from memoplan.syntax.policies import POLICIES, Option, policy_names

POLICY_NAMES = policy_names()  # syntax/policies.py: every policy and its options, once
STATEMENT_NAMES = ("model", "example", "module", "budget", "dtr", "sublinear", "memory", "memonger", "step")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
DTYPES = FLOAT_DTYPES + ("int64", "int32", "int16", "int8", "uint8", "bool")

_UNIT_RE = re.compile(r"(.*?)[ \t]*([A-Za-z]+)")  # "6 GiB" -> ("6", "GiB"), "10ms" -> ("10", "ms")


def _unit_parts(text: str) -> tuple[str, str]:
    """A SIZE or DURATION token's amount and unit (the grammar's token always has both)."""
    match = _UNIT_RE.fullmatch(text)
    assert match is not None, text
    return match.group(1), match.group(2)


_INT_RE = re.compile(r"[+-]?\d+")
# One JSON string escape, or a backslash that does not start one.
_ESCAPE_RE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})|(\\)')


#: The largest size, in bytes, the language accepts anywhere (a budget, a block's sizes).
MAX_SIZE_BYTES = 2**63 - 1


def number(text: str) -> int | float:
    """An integer if written without a point or an exponent, else a float."""
    if _INT_RE.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than Python converts; out of range anyway
            pass
    return float(text)


def unquote(text: str) -> str:
    """The value of a STRING token (JSON escapes); assumes ``bad_escape(text)`` is None."""
    return json.loads(text, strict=False)


def bad_escape(text: str) -> int | None:
    """Offset of the first invalid escape in a STRING token, or None."""
    for match in _ESCAPE_RE.finditer(text):
        if match.group(1) is not None:
            return match.start()
    return None


def is_finite(value) -> bool:
    """True if ``value`` is a number that converts to a finite float."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


@dataclass(frozen=True)
class _Option:
    key: str
    value: ast.Value
    span: Span


@dataclass
class _Checker:
    """Reads ``key = value`` options of one policy, reporting unknown, repeated and mistyped ones."""

    builder: Builder
    policy: str
    options: list[_Option]
    allowed: tuple[str, ...]
    seen: dict[str, _Option] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for opt in self.options:
            if opt.key not in self.allowed:
                help_ = did_you_mean(opt.key, self.allowed)
                if not help_:
                    help_ = (
                        f"`{self.policy}` takes: {', '.join(self.allowed)}"
                        if self.allowed
                        else f"`{self.policy}` takes no options"
                    )
                self.builder.error("MP201", f"unknown option `{opt.key}` for `{self.policy}`", opt.span, help_)
            elif opt.key in self.seen:
                self.builder.error(
                    "MP208",
                    f"option `{opt.key}` is given twice",
                    opt.span,
                    "remove one of them",
                    notes=(("first given", self.seen[opt.key].span),),
                )
            else:
                self.seen[opt.key] = opt

    def _bad(self, opt: _Option, expected: str, code: str = "MP202") -> None:
        self.builder.error(code, f"`{opt.key}` expects {expected}", opt.span, f"write `{opt.key} = <{expected}>`")

    def get(self, key: str) -> _Option | None:
        """The option, unless absent or its value was already reported (None)."""
        opt = self.seen.get(key)
        return None if opt is None or opt.value is None else opt

    def integer(self, key: str, minimum: int) -> int | None:
        opt = self.get(key)
        if opt is None:
            return None
        if not isinstance(opt.value, int):
            self._bad(opt, "an integer")
        elif opt.value < minimum:
            self._bad(opt, f"an integer >= {minimum}", "MP203")
        else:
            return opt.value
        return None

    def positive_float(self, key: str) -> float | None:
        opt = self.get(key)
        if opt is None:
            return None
        if not isinstance(opt.value, (int, float)):
            self._bad(opt, "a number")
        elif opt.value <= 0:
            self._bad(opt, "a number > 0", "MP203")
        else:
            return float(opt.value)
        return None

    def boolean(self, key: str) -> bool | None:
        opt = self.get(key)
        if opt is None:
            return None
        if isinstance(opt.value, ast.Word) and opt.value.name in ("true", "false"):
            return opt.value.name == "true"
        self._bad(opt, "`true` or `false`")
        return None

    def choice(self, key: str, enum_cls):
        opt = self.get(key)
        if opt is None:
            return None
        return self.builder.enum_value(enum_cls, opt.value, opt.span, f"`{key}`")

    def read(self, option: Option):
        """The value of one option of the policy's spec, by its kind (``list``: None, read by hand)."""
        if option.kind == "int":
            return self.integer(option.key, option.minimum if option.minimum is not None else 0)
        if option.kind == "float":
            return self.positive_float(option.key)
        if option.kind == "bool":
            return self.boolean(option.key)
        if option.kind == "choice":
            return self.choice(option.key, option.choices)
        return None

    def values(self) -> dict[str, object]:
        """Every option of the spec that is not a list, read in the spec's order."""
        return {o.key: self.read(o) for o in POLICIES[self.policy].options if o.kind != "list"}


class Builder(Transformer):
    """Lark transformer: grammar rules -> AST nodes (without comments).

    The parser runs its methods as each rule is reduced (:mod:`memoplan.syntax.inline`), so no
    parse tree is built; ``Builder(file).transform(tree)`` of a parse tree gives the same nodes.
    """

    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file
        self.diagnostics: list[Diagnostic] = []
        self._empty_segments: list[Span] = []  # `""` segments, legal only alone (the root)

    # ------------------------------------------------------------ helpers

    def span(self, item) -> Span:
        """Span of a token or of a tree's meta."""
        return Span(self.file, item.line, item.column, item.end_line, item.end_column)

    def error(self, code, message, span, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, notes=notes))

    def enum_value(self, enum_cls, value, span: Span, what: str):
        """The member of ``enum_cls`` named by a word (a Word or a str), or None after an error."""
        words = [m.value for m in enum_cls]
        if not isinstance(value, (ast.Word, str)):
            self.error("MP202", f"{what} expects a word", span, "allowed: " + ", ".join(words))
            return None
        name = value.name if isinstance(value, ast.Word) else value
        for member in enum_cls:
            if member.value == name:
                return member
        self.error(
            "MP204",
            f"unknown value `{name}` for {what}",
            span,
            did_you_mean(str(name), words) or "allowed: " + ", ".join(words),
        )
        return None

    # ------------------------------------------------------------ values

    def string(self, token: Token) -> str:
        """The value of a STRING token; a bad escape is reported and the string kept as written."""
        offset = bad_escape(str(token))
        if offset is None:
            return unquote(token)
        assert token.line is not None and token.column is not None, "the parser keeps positions"
        column = token.column + offset
        self.error(
            "MP108",
            f"invalid escape `{token[offset : offset + 2]}` in a string",
            Span(self.file, token.line, column, token.line, column + 2),
            'escapes are those of JSON: \\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX',
        )
        return str(token)[1:-1]

    def finite(self, value, token: Token, scale: int = 1):
        """``value`` if ``value * scale`` is a finite number, else report it and return None.

        A None value is not checked again by whatever holds it: one error per mistake.
        """
        if is_finite(value * scale):
            return value
        self.error("MP203", f"`{token}` is out of range", self.span(token), "numbers must fit a 64-bit float")
        return None

    def number(self, children):
        return self.finite(number(children[0]), children[0])

    def size(self, children):
        """A size; wherever it stands, its byte count must fit in 64 bits (one rule for all)."""
        token = children[0]
        amount, symbol = _unit_parts(str(token))
        unit = ast.Unit[symbol]
        value = number(amount)
        if not (is_finite(value * unit.factor) and abs(value * unit.factor) <= MAX_SIZE_BYTES):
            self.error(
                "MP203", f"`{token}` is out of range", self.span(token), "a size is at most 2**63 - 1 bytes (8 EiB)"
            )
            return None
        return ast.Size(value, unit)

    def percent(self, children):
        value = self.finite(number(str(children[0])[:-1]), children[0])
        return None if value is None else ast.Percent(value)

    def duration(self, children):
        amount, unit = _unit_parts(str(children[0]))
        value = self.finite(number(amount), children[0])
        return None if value is None else ast.Duration(value, unit)

    def word(self, children):
        return ast.Word(str(children[0]))

    def text(self, children):
        return ast.Text(self.string(children[0]))

    def value_list(self, children):
        return ast.ValueList(tuple(c for c in children if c is not None))

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

    # ------------------------------------------------------------ selectors

    def name_segment(self, children):
        token = children[0]
        text = self.string(token) if token.type == "STRING" else str(token)
        if token.type == "STRING" and text == "":
            self._empty_segments.append(self.span(token))  # the root when alone: `path` decides
        elif token.type == "STRING" and "." in text:
            self.error(
                "MP105",
                "a quoted path segment cannot contain `.`",
                self.span(token),
                "PyTorch module names never contain `.`; split the path into segments",
            )
        return ast.Name(text)

    def star_segment(self, children):
        return ast.DoubleStar() if children[0] == "**" else ast.Star()

    def glob_segment(self, children):
        token = children[0]
        if "**" in token:
            self.error(
                "MP211",
                f"`**` inside the segment `{token}`",
                self.span(token),
                "`**` (any number of segments) stands alone between dots, e.g. `layer*.**`; "
                "inside a segment `*` already matches any run of characters",
            )
        return ast.Glob(str(token))

    def first_segment(self, children):
        return children[0]

    def index(self, children):
        token = children[0]
        value = number(token)
        if not isinstance(value, int):
            self.error("MP202", "an index must be an integer", self.span(token), "e.g. `layers[0]` or `layers[-1]`")
            return ast.Index(0)
        return ast.Index(value)

    def slice(self, children):
        bounds: list[int | None] = []
        for token in children:
            value = None if token is None else number(token)
            if value is not None and not isinstance(value, int):
                self.error("MP202", "slice bounds must be integers", self.span(token), "e.g. `layers[0:24:2]`")
                value = None
            bounds.append(value)
        start, stop, step = (bounds + [None, None, None])[:3]
        if step == 0:
            self.error("MP203", "slice step cannot be zero", self.span(children[2]), "leave it out for a step of 1")
            step = None
        return ast.Slice(start, stop, step)

    def path(self, children):
        empty, self._empty_segments = self._empty_segments, []
        if len(children) > 1:  # `""` alone selects the root; inside a longer path it names nothing
            for span in empty:
                self.error(
                    "MP105",
                    "a quoted path segment cannot be empty inside a path",
                    span,
                    'PyTorch module names are never empty; `""` alone selects the model itself (the root)',
                )
        return ast.PathPattern(tuple(children))

    def qualname(self, children):
        return ".".join(str(c) for c in children)

    def path_term(self, children):
        path, class_name = children
        return ast.SelectorTerm(path=path, class_name=class_name)

    def class_term(self, children):
        return ast.SelectorTerm(class_name=children[0])

    @v_args(meta=True)
    def selector(self, meta, children):
        include, *exclude = children
        return ast.Selector(include, tuple(exclude), span=self.span(meta))

    # ------------------------------------------------------------ policies

    @v_args(meta=True)
    def option(self, meta, children):
        key, value = children
        return _Option(str(key), value, self.span(meta))

    @v_args(meta=True)
    def checkpoint(self, meta, options):
        c = _Checker(self, "checkpoint", options, POLICIES["checkpoint"].keys)
        split = None
        if "split" in c.seen:
            opt = c.seen["split"]
            items = opt.value.items if isinstance(opt.value, ast.ValueList) else (opt.value,)
            names = [_child_name(item) for item in items]
            if not names or None in names:
                self.error(
                    "MP202",
                    "`split` expects a list of child names, e.g. `split = [lif]` or `split = [2, 4]`",
                    opt.span,
                )
            else:
                split = tuple(names)
            if "segments" in c.seen:
                self.error(
                    "MP207",
                    "`segments` and `split` both cut the module into regions: use one",
                    opt.span,
                    "`segments = k` cuts evenly; `split = [...]` starts a region at each named child",
                )
        return POLICIES["checkpoint"].node(
            split=split, save=self._saved_ops(c.get("save")), **c.values(), span=self.span(meta)
        )

    def _saved_ops(self, opt: _Option | None) -> tuple[str, ...] | None:
        """``save = [matmul, attention]``: op families from SAVEABLE_OPS, each once (MP212, MP213)."""
        if opt is None:
            return None
        items = opt.value.items if isinstance(opt.value, ast.ValueList) else (opt.value,)
        names: list[str] = []
        for item in items:
            if not isinstance(item, ast.Word):
                self.error("MP202", "`save` expects a list of op names, e.g. `save = [matmul, attention]`", opt.span)
                return None
            if item.name not in ast.SAVEABLE_OPS:
                help_ = did_you_mean(item.name, ast.SAVEABLE_OPS) or f"the ops are: {', '.join(ast.SAVEABLE_OPS)}"
                self.error("MP212", f"`save` names an unknown op `{item.name}`", opt.span, help_)
                return None
            if item.name in names:
                self.error("MP213", f"`save` names `{item.name}` twice", opt.span, "remove the repetition")
                return None
            names.append(item.name)
        if not names:
            self.error(
                "MP213",
                "`save = []` keeps nothing: it is a plain `checkpoint`",
                opt.span,
                "remove `save` or name an op",
            )
            return None
        return tuple(names)

    @v_args(meta=True)
    def compress(self, meta, children):
        codec_token, lossy_token, *options = children
        span = self.span(meta)
        c = _Checker(self, "compress", options, POLICIES["compress"].keys)
        codec = self.enum_value(ast.Codec, str(codec_token), self.span(codec_token), "`compress input`")
        lossy = lossy_token is not None
        values = c.values()
        tolerance = values["tolerance"]
        if codec is not None:
            if codec.lossy and not lossy:
                self.error(
                    "MP205",
                    f"codec `{codec.value}` is lossy and must be marked so",
                    span,
                    f"write `compress input = {codec.value} lossy tolerance = <max abs error>`",
                )
            elif lossy and not codec.lossy:
                self.error(
                    "MP205",
                    f"codec `{codec.value}` is lossless; `lossy` does not apply",
                    self.span(lossy_token),
                    "remove `lossy`",
                )
            elif codec.lossy and tolerance is None and "tolerance" not in c.seen:
                self.error(
                    "MP209",
                    f"lossy codec `{codec.value}` needs a stated `tolerance`",
                    span,
                    "e.g. `tolerance = 0.01` (largest absolute error accepted)",
                )
            elif not codec.lossy and "tolerance" in c.seen:
                self.error(
                    "MP201",
                    "`tolerance` applies only to lossy codecs",
                    c.seen["tolerance"].span,
                    "lossless codecs restore the input exactly; remove `tolerance`",
                )
        if codec is None:
            return None
        return POLICIES["compress"].node(codec, lossy, **values, span=span)

    @v_args(meta=True)
    def temporal_chunk(self, meta, children):
        chunks_token, dim_token, *options = children
        span = self.span(meta)
        c = _Checker(self, "temporal_chunk", options, POLICIES["temporal_chunk"].keys)
        chunks: int | float | None = number(chunks_token)
        dim: int | float | None = number(dim_token)
        if not isinstance(chunks, int) or chunks < 1:
            self.error(
                "MP203",
                "the chunk count must be an integer >= 1",
                self.span(chunks_token),
                "e.g. `temporal_chunk 4 dim 0`",
            )
            chunks = None
        if not isinstance(dim, int):
            self.error("MP202", "`dim` expects an integer", self.span(dim_token), "e.g. `temporal_chunk 4 dim 0`")
            dim = None
        args = None
        if c.get("args"):
            opt = c.seen["args"]
            items = opt.value.items if isinstance(opt.value, ast.ValueList) else (opt.value,)
            converted: list[int | str] = []
            bad = False
            for item in items:
                if isinstance(item, int) and item >= 0:
                    converted.append(item)
                elif isinstance(item, (ast.Word, ast.Text)):
                    converted.append(item.name if isinstance(item, ast.Word) else item.value)
                else:
                    self.error(
                        "MP202",
                        "`args` expects argument positions (integers >= 0) or keyword names",
                        opt.span,
                        'e.g. `args = [0, "state"]`',
                    )
                    bad = True
                    break
            args = tuple(converted) if converted and not bad else None
            if not converted and not bad:
                self.error("MP203", "`args` cannot be empty", opt.span, "leave `args` out to chunk the first argument")
        values = c.values()
        if chunks is None or dim is None:
            return None
        return POLICIES["temporal_chunk"].node(chunks, dim, args, **values, span=span)

    @v_args(meta=True)
    def keep(self, meta, children):
        return ast.Keep(span=self.span(meta))

    @v_args(meta=True)
    def state(self, meta, children):
        mode = self.enum_value(ast.StateMode, str(children[0]), self.span(children[0]), "`state`")
        return None if mode is None else ast.State(mode, span=self.span(meta))

    @v_args(meta=True)
    def buffers(self, meta, children):
        mode = self.enum_value(ast.BuffersMode, str(children[0]), self.span(children[0]), "`buffers`")
        return None if mode is None else ast.Buffers(mode, span=self.span(meta))

    @v_args(meta=True)
    def module_rule(self, meta, children):
        selector, *policies = children
        policies = [p for p in policies if p is not None]
        seen: dict[type, ast.Policy] = {}
        for policy in policies:
            kind = type(policy)
            if kind in seen:
                self.error(
                    "MP206",
                    f"`{_policy_word(policy)}` appears twice in one rule",
                    policy.span,
                    "merge the two lines into one",
                    notes=(("first here", seen[kind].span),),
                )
            else:
                seen[kind] = policy
        keep = seen.get(ast.Keep)
        if keep is not None:
            for kind in (ast.Checkpoint, ast.Compress, ast.TemporalChunk):
                if kind in seen:
                    other = seen[kind]
                    self.error(
                        "MP207",
                        f"`keep` and `{_policy_word(other)}` contradict each other",
                        other.span,
                        "`keep` leaves this module's saved activations as they are; drop one of the two",
                        notes=(("`keep` here", keep.span),),
                    )
        return ast.ModuleRule(selector, tuple(policies), span=self.span(meta))

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


def unit_help(written: str, symbol: str) -> str:
    if written != symbol:
        return f"units are case-sensitive: write `{symbol}`"
    return f"a unit follows a number directly, e.g. `4 {symbol}`"


def _child_name(item) -> str | None:
    """A child's name in `split = [...]`: a bare name, a quoted name or an integer index name."""
    if isinstance(item, ast.Word):
        return item.name
    if isinstance(item, ast.Text):
        return item.value or None
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return str(item)
    return None


def _policy_word(policy) -> str:
    return {
        ast.Checkpoint: "checkpoint",
        ast.Compress: "compress",
        ast.TemporalChunk: "temporal_chunk",
        ast.Keep: "keep",
        ast.State: "state",
        ast.Buffers: "buffers",
    }[type(policy)]
