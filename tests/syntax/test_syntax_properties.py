"""Syntax stage, property tests: random trees round-trip, random text never crashes."""

from __future__ import annotations

import string
from dataclasses import replace

from _paths import TESTS
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memoplan.diagnostics import PlanError
from memoplan.syntax import ast, format_plan, parse, parse_example_spec
from memoplan.syntax.blocks import SCHEMA, check_block
from memoplan.syntax.build import DTYPES, FLOAT_DTYPES

SETTINGS = settings(max_examples=n_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- strategies for trees

# Any text but ".", surrogates (from "\udXXX" escapes) included.
segment_text = st.text(st.characters(exclude_characters=".", exclude_categories=()), min_size=1, max_size=8)
# Glob segments: word characters with `*` or `?` among them, never `**` (MP211).
globs = st.from_regex(r"[a-z0-9_]{0,3}(\?|[a-z0-9_]\*|\*[a-z0-9_])[a-z0-9_*?]{0,3}", fullmatch=True).filter(
    lambda text: "**" not in text
)
identifier = st.from_regex(r"[A-Za-z_\u00e9\u540d][A-Za-z0-9_\u00e9\u540d]{0,7}", fullmatch=True)
comment = st.text(st.characters(exclude_characters="\n\r", exclude_categories=("Cs",)), max_size=15).map(
    lambda s: ("#" + s).rstrip()
)
small_int = st.integers(-(10**6), 10**6)
positive_float = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)


@st.composite
def comments(draw, trailing: bool = True) -> ast.Comments:
    leading = tuple(draw(st.lists(comment, max_size=2)))
    return ast.Comments(leading, draw(st.none() | comment) if trailing else None)


def segments():
    options = [
        segment_text.map(ast.Name),
        st.just(ast.Star()),
        st.just(ast.DoubleStar()),
        globs.map(ast.Glob),
        small_int.map(ast.Index),
        st.builds(ast.Slice, st.none() | small_int, st.none() | small_int, st.none() | small_int.filter(bool)),
    ]
    return st.one_of(options)


@st.composite
def paths(draw) -> ast.PathPattern:
    return ast.PathPattern(tuple(draw(st.lists(segments(), min_size=1, max_size=4))))


class_names = st.lists(identifier, min_size=1, max_size=3).map(".".join)


@st.composite
def terms(draw) -> ast.SelectorTerm:
    path = draw(st.none() | paths())
    class_name = draw(class_names) if path is None else draw(st.none() | class_names)
    return ast.SelectorTerm(path, class_name)


selectors = st.builds(ast.Selector, terms(), st.lists(terms(), max_size=2).map(tuple))


def enums(cls):
    return st.none() | st.sampled_from(list(cls))


checkpoints = st.builds(
    ast.Checkpoint,
    segments=st.none() | st.integers(1, 64),
    rng=enums(ast.RngMode),
    impl=enums(ast.CheckpointImpl),
    nested=st.none() | st.booleans(),
)


@st.composite
def compresses(draw) -> ast.Compress:
    codec = draw(st.sampled_from(list(ast.Codec)))
    tolerance = draw(positive_float) if codec.lossy else None
    return ast.Compress(codec, codec.lossy, tolerance, draw(enums(ast.Validate)))


arg = st.integers(0, 100) | st.text(max_size=6) | identifier
temporal_chunks = st.builds(
    ast.TemporalChunk,
    chunks=st.integers(1, 1000),
    dim=small_int,
    args=st.none() | st.lists(arg, min_size=1, max_size=3).map(tuple),
    allow_nonequivalent=st.none() | st.booleans(),
)
policy_kinds = {
    ast.Checkpoint: checkpoints,
    ast.Compress: compresses(),
    ast.TemporalChunk: temporal_chunks,
    ast.Keep: st.just(ast.Keep()),
    ast.State: st.just(ast.State(ast.StateMode.FUNCTIONAL)),
    ast.Buffers: st.just(ast.Buffers(ast.BuffersMode.COMMIT_ONCE)),
}


@st.composite
def module_rules(draw) -> ast.ModuleRule:
    kinds = draw(st.lists(st.sampled_from(list(policy_kinds)), unique=True, max_size=4))
    if ast.Keep in kinds:  # keep contradicts the policies that change saved activations
        kinds = [k for k in kinds if k not in (ast.Checkpoint, ast.Compress, ast.TemporalChunk)]
    policies = [_with_comments(draw(policy_kinds[kind]), draw(comments())) for kind in kinds]
    return ast.ModuleRule(
        draw(selectors), tuple(policies), draw(comments()), tuple(draw(st.lists(comment, max_size=2)))
    )


def _with_comments(node, c: ast.Comments):
    return replace(node, comments=c)


units = st.sampled_from(list(ast.Unit))


@st.composite
def sizes(draw) -> ast.Size:
    unit = draw(units)
    most = min(10**15, (2**63 - 1) // unit.factor)  # a size is at most 2**63 - 1 bytes
    amount = draw(st.integers(1, most) | st.floats(min_value=1.0, max_value=min(1e12, float(most))))
    return ast.Size(amount, unit)


budgets = st.builds(
    ast.Budget,
    amount=sizes()
    | st.builds(ast.Percent, st.integers(1, 100) | st.floats(min_value=0, max_value=100, exclude_min=True))
    | st.integers(1, 1)
    | st.floats(min_value=0, max_value=1, exclude_min=True),
    mode=enums(ast.BudgetMode),
)


def _entry_value(kind: ast.BlockKind, key: str):
    spec = SCHEMA[kind][1][key]
    if spec.kind == "size":
        return sizes() | st.just(0) if key != "eviction_threshold" else sizes()
    if spec.kind == "int":
        # `shards` from 2: a drawn `mixed_precision` needs a sharded step (MP250)
        low = {"thresh_nr_try": 1, "genetic_pool_size": 2, "num_worker": 1, "shards": 2}.get(key, 0)
        return st.integers(low, 10**9)
    if spec.kind == "float":
        return st.integers(0, 10**6) | st.floats(min_value=0, max_value=1e300)
    if spec.kind == "selector":  # any text: the resolver checks it against the selector grammar
        return st.builds(ast.Text, st.text(max_size=20))
    choices = spec.choices + tuple(a for a, _ in spec.aliases)
    words = st.sampled_from([ast.Word(c) if isinstance(c, str) else c for c in choices])
    if spec.text:  # a spec in quotes too: `"file.py:name"`
        return words | st.builds(
            lambda a, b: ast.Text(f"{a}.py:{b}"),
            st.from_regex(r"[a-z]{1,6}", fullmatch=True),
            st.from_regex(r"[a-z_]{1,6}", fullmatch=True),
        )
    return words


@st.composite
def config_blocks(draw, kind: ast.BlockKind) -> ast.ConfigBlock:
    keys = list(SCHEMA[kind][1])
    chosen = draw(st.lists(st.sampled_from(keys), unique=True))
    if kind is ast.BlockKind.DTR and "eviction_threshold" not in chosen:
        chosen.append("eviction_threshold")
    if kind is ast.BlockKind.STEP and "mixed_precision" in chosen and "shards" not in chosen:
        chosen.append("shards")
    chosen = draw(st.permutations(chosen))
    entries = tuple(ast.ConfigEntry(k, draw(_entry_value(kind, k)), draw(comments())) for k in chosen)
    return ast.ConfigBlock(kind, entries, draw(comments()), tuple(draw(st.lists(comment, max_size=2))))


@st.composite
def tensor_specs(draw) -> ast.TensorSpec:
    fn = draw(st.sampled_from(list(ast.TensorFn)))
    shape = tuple(draw(st.lists(st.integers(0, 10**6), max_size=4)))
    low = high = None
    if fn is ast.TensorFn.RANDINT:
        high = draw(small_int)
        low = draw(st.none() | st.integers(high - 10**6, high - 1))
    dtypes = FLOAT_DTYPES if fn in (ast.TensorFn.RANDN, ast.TensorFn.RAND) else DTYPES
    return ast.TensorSpec(fn, shape, low, high, draw(st.none() | st.sampled_from(dtypes)))


examples = st.builds(ast.ExampleStmt, spec=st.text(max_size=10)) | st.builds(
    ast.ExampleStmt, tensors=st.lists(tensor_specs(), min_size=1, max_size=3).map(tuple)
)
models = st.builds(ast.ModelStmt, st.tuples(st.text(max_size=6), st.text(max_size=6)).map(":".join))


@st.composite
def plans(draw) -> ast.Plan:
    statements = list(draw(st.lists(module_rules(), max_size=4)))
    for optional in (models, examples, budgets):
        if draw(st.booleans()):
            statements.append(draw(optional))
    for kind in ast.BlockKind:
        if draw(st.booleans()):
            statements.append(draw(config_blocks(kind)))
    statements = [_with_comments(s, draw(comments())) for s in statements]
    statements = draw(st.permutations(statements))
    return ast.Plan(1, tuple(statements), draw(comments()), tuple(draw(st.lists(comment, max_size=2))))


# ---------------------------------------------------------------- round trips


@SETTINGS
@given(plans())
def test_random_tree_round_trips(plan: ast.Plan) -> None:
    text = format_plan(plan)
    parsed = parse(text)
    assert parsed == plan  # comments included: they survive formatting
    assert format_plan(parsed) == text  # a fixed point
    text.encode("utf-8")  # always writable as UTF-8


@settings(max_examples=n_examples(50), deadline=None)
@given(plans())
def test_round_trip_keeps_every_comment(plan: ast.Plan) -> None:
    text = format_plan(plan)
    written = [line.strip(" ") for line in text.split("\n")]
    for c in _all_comments(plan):
        assert any(line.endswith(c) or line == c for line in written), c


def _all_comments(plan: ast.Plan) -> list[str]:
    found = list(plan.header_comments.leading) + list(plan.trailing)
    nodes = list(plan.statements)
    for stmt in plan.statements:
        nodes.extend(getattr(stmt, "policies", ()) or getattr(stmt, "entries", ()))
        found.extend(getattr(stmt, "closing", ()))
    for node in nodes:
        found.extend(node.comments.leading)
        if node.comments.trailing:
            found.append(node.comments.trailing)
    return found


@SETTINGS
@given(config_blocks(ast.BlockKind.DTR) | config_blocks(ast.BlockKind.SUBLINEAR))
def test_generated_blocks_are_valid(block: ast.ConfigBlock) -> None:
    assert [d for d in check_block(block) if d.is_error] == []


# ---------------------------------------------------------------- no input crashes the parser

FIXTURES = TESTS / "fixtures" / "syntax"
SEEDS = [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "valid").glob("*.memplan"))] + [
    p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "invalid").glob("*.memplan"))
]
PIECES = [
    "memplan", "model", "example", "module", "budget", "dtr", "sublinear", "memory", "memonger",
    "checkpoint", "compress", "input", "lossy", "temporal_chunk", "dim", "keep", "state", "buffers",
    "class", "not", "{", "}", "[", "]", "(", ")", ":", ";", "=", ".", ",", "*", "**", '"', "\\", "#",
    "\n", " ", "\t", "0", "-1", "1.5", "1e999", "4 GiB", "50%", "10 ms", "\"a\\q\"", "é", "\r\n", "\ufeff",
]  # fmt: skip


def _check_no_crash(text: str) -> None:
    try:
        plan = parse(text, "fuzz.memplan")
    except PlanError as error:
        assert error.diagnostics and all(d.code.startswith("MP") for d in error.diagnostics)
        str(error)  # renders
        return
    formatted = format_plan(plan)
    assert parse(formatted) == plan
    assert format_plan(parse(formatted)) == formatted


@settings(max_examples=n_examples(300), deadline=None)
@given(st.lists(st.sampled_from(string.printable + "é名\u2028") | st.sampled_from(PIECES), max_size=60).map("".join))
def test_random_text_raises_only_plan_error(text: str) -> None:
    _check_no_crash(text)
    _check_no_crash("memplan 1\n" + text)


@st.composite
def mutations(draw) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        action = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        piece = draw(st.sampled_from(PIECES) | st.text(max_size=3))
        if action == "delete":
            text = text[:i] + text[j:]
        elif action == "insert":
            text = text[:i] + piece + text[i:]
        elif action == "replace":
            text = text[:i] + piece + text[j:]
        else:
            text = text[:j] + text[i:j] + text[j:]
    return text


@settings(max_examples=n_examples(400), deadline=None)
@given(mutations())
def test_mutated_plans_raise_only_plan_error(text: str) -> None:
    _check_no_crash(text)


@settings(max_examples=n_examples(150), deadline=None)
@given(st.lists(st.sampled_from(string.printable) | st.sampled_from(PIECES), max_size=30).map("".join))
def test_example_spec_raises_only_plan_error(text: str) -> None:
    try:
        parse_example_spec(text)
    except PlanError as error:
        assert error.diagnostics
        str(error)


@SETTINGS
@given(st.lists(tensor_specs(), min_size=1, max_size=3))
def test_example_spec_round_trip(tensors) -> None:
    from memoplan.syntax.formatter import format_example

    stmt = ast.ExampleStmt(tensors=tuple(tensors))
    assert parse_example_spec(format_example(stmt)) == stmt
