"""The AST builder's policy rules: each policy's options read against its spec
(:mod:`memoplan.syntax.policies`: unknown, repeated and mistyped options), the checks one policy
makes of its own values, and a module rule's policies (twice, or contradicting `keep`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lark import v_args

from memoplan.diagnostics import Span, did_you_mean
from memoplan.syntax import ast
from memoplan.syntax.build_values import ValueRules
from memoplan.syntax.literals import number
from memoplan.syntax.policies import POLICIES, Option


@dataclass(frozen=True)
class _Option:
    key: str
    value: ast.Value
    span: Span


@dataclass
class _Checker:
    """Reads ``key = value`` options of one policy, reporting unknown, repeated and mistyped ones."""

    builder: ValueRules
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


class PolicyRules(ValueRules):
    """Grammar rules of the policies and of a module rule -> AST policy nodes."""

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
        """``save = [matmul, attention]``: op families from SAVEABLE_OPS or single ops of them by their
        place (``matmul_2``), each once (MP212, MP213)."""
        if opt is None:
            return None
        items = opt.value.items if isinstance(opt.value, ast.ValueList) else (opt.value,)
        names: list[str] = []
        for item in items:
            if not isinstance(item, ast.Word):
                self.error("MP202", "`save` expects a list of op names, e.g. `save = [matmul, attention]`", opt.span)
                return None
            family = ast.saved_family(item.name)
            if family is None:
                stem = item.name.rpartition("_")[0]
                help_ = (
                    f"a single op is named by its place, counted from 1: `{stem}_1` is the region's first"
                    if stem in ast.SAVEABLE_OPS
                    else did_you_mean(item.name, ast.SAVEABLE_OPS)
                    or f"the ops are: {', '.join(ast.SAVEABLE_OPS)}, or one of them by its place, e.g. `matmul_2`"
                )
                self.error("MP212", f"`save` names an unknown op `{item.name}`", opt.span, help_)
                return None
            if item.name in names:
                self.error("MP213", f"`save` names `{item.name}` twice", opt.span, "remove the repetition")
                return None
            if family in names or (item.name == family and any(ast.saved_family(n) == family for n in names)):
                self.error(
                    "MP213", f"`save` names `{family}` and one of its ops", opt.span, f"`{family}` keeps them all"
                )
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
