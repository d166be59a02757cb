"""Syntax stage: the public functions, typed configs, units and the rendering of errors."""

from __future__ import annotations

import pytest

from memoplan.diagnostics import PlanError, Severity
from memoplan.syntax import ast, format_plan, load, parse, parse_example_spec, parse_with_diagnostics
from memoplan.syntax.blocks import (
    DtrConfig,
    MemongerConfig,
    MemoryConfig,
    StepConfig,
    SublinearConfig,
    check_block,
    config_of,
)
from memoplan.syntax.formatter import format_policy, format_selector, format_value

# ---------------------------------------------------------------- parse_example_spec


def test_example_spec_inline_tensors() -> None:
    stmt = parse_example_spec("randn(4, 3, 32, 32)")
    assert stmt.spec is None
    assert stmt.tensors == (ast.TensorSpec(ast.TensorFn.RANDN, (4, 3, 32, 32)),)


def test_example_spec_several_tensors_with_options() -> None:
    stmt = parse_example_spec("  randint(4, 16, low=-2, high=100, dtype=int32), zeros(2, dtype=bool), rand() ")
    assert stmt.tensors == (
        ast.TensorSpec(ast.TensorFn.RANDINT, (4, 16), low=-2, high=100, dtype="int32"),
        ast.TensorSpec(ast.TensorFn.ZEROS, (2,), dtype="bool"),
        ast.TensorSpec(ast.TensorFn.RAND, ()),
    )


@pytest.mark.parametrize(
    "text, spec",
    [
        ("memoplan.examples.cnn:make_inputs", "memoplan.examples.cnn:make_inputs"),
        ("models/net.py:inputs", "models/net.py:inputs"),
        ('"pkg.mod:make"', "pkg.mod:make"),
        ('"with space.py:f"', "with space.py:f"),
    ],
)
def test_example_spec_import(text: str, spec: str) -> None:
    assert parse_example_spec(text) == ast.ExampleStmt(spec=spec)


@pytest.mark.parametrize(
    "text, codes",
    [
        ("randn(4", ["MP106"]),
        ("foo(1)", ["MP204"]),
        ("randint(4)", ["MP209"]),
        ("randn(4, low=1)", ["MP201"]),
        ("randn(2.5)", ["MP203"]),
        ("randn(4, dtype=float)", ["MP204"]),
        ("", ["MP106"]),
        ("randn(4) extra", ["MP100"]),
    ],
)
def test_example_spec_errors(text: str, codes: list[str]) -> None:
    with pytest.raises(PlanError) as info:
        parse_example_spec(text, "--example")
    assert info.value.codes == codes  # one error, no cascade
    assert "--example:1:" in str(info.value)


# ---------------------------------------------------------------- load


def test_load_reads_a_file(tmp_path) -> None:
    path = tmp_path / "p.memplan"
    path.write_text("memplan 1\nmodule fc { keep }\n", encoding="utf-8")
    plan = load(path)
    assert plan.file == str(path) and plan.rules[0].span.file == str(path)


def test_load_accepts_a_byte_order_mark_and_crlf(tmp_path) -> None:
    path = tmp_path / "p.memplan"
    path.write_bytes(b"\xef\xbb\xbfmemplan 1\r\nbudget 4 GiB\r\n")
    assert load(path).budget.amount == ast.Size(4, ast.Unit.GiB)


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(PlanError) as info:
        load(tmp_path / "missing.memplan")
    assert info.value.codes == ["MP107"]
    assert "missing.memplan" in str(info.value)


def test_load_directory(tmp_path) -> None:
    with pytest.raises(PlanError) as info:
        load(tmp_path)
    assert info.value.codes == ["MP107"]


def test_load_non_utf8(tmp_path) -> None:
    path = tmp_path / "latin1.memplan"
    path.write_bytes("memplan 1\nmodule caf\u00e9 { keep }\n".encode("latin-1"))
    with pytest.raises(PlanError) as info:
        load(path)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "MP107" and "UTF-8" in diagnostic.message
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 11)


# ---------------------------------------------------------------- rendering


def test_render_shows_location_source_line_and_caret() -> None:
    text = "memplan 1\nmodule a {\n    checkpointing\n}\n"
    with pytest.raises(PlanError) as info:
        parse(text, "plans/x.memplan")
    rendered = str(info.value)
    lines = rendered.splitlines()
    assert lines[0] == "plans/x.memplan:3:5: error[MP102]: unknown policy `checkpointing`"
    assert lines[1] == "  3 |     checkpointing"
    assert lines[2] == "    |     " + "^" * len("checkpointing")
    assert lines[3] == "  help: did you mean `checkpoint`?"


def test_render_every_diagnostic_and_notes() -> None:
    text = "memplan 1\nmodule a { keep; checkpoint }\nbudget 0.5\nbudget 0.7\n"
    with pytest.raises(PlanError) as info:
        parse(text, "x.memplan")
    rendered = str(info.value)
    assert info.value.codes == ["MP207", "MP208"]
    assert "x.memplan:2:18: error[MP207]" in rendered
    assert "x.memplan:4:1: error[MP208]" in rendered
    assert "note: `keep` here at x.memplan:2:12" in rendered
    assert "note: first given at x.memplan:3:1" in rendered
    caret = rendered.splitlines()[2]
    assert caret == "  " + " " * len("2") + " | " + " " * 17 + "^" * len("checkpoint")


def test_render_with_tabs_keeps_the_caret_under_the_span() -> None:
    text = "memplan 1\n\tmodule\ta { kep }\n"
    with pytest.raises(PlanError) as info:
        parse(text)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("<memory>:2:13:")
    assert lines[2].index("^") - lines[1].index("m") == len("module a { ")


def test_warning_does_not_raise() -> None:
    text = "memplan 1\nmemory { static_memory_policy = 1 }\n"
    plan, diagnostics = parse_with_diagnostics(text)
    assert [d.code for d in diagnostics] == ["MP210"]
    assert diagnostics[0].severity is Severity.WARNING
    assert "warning[MP210]" in diagnostics[0].render(text)
    assert config_of(parse(text).block(ast.BlockKind.MEMORY)) == MemoryConfig(static_memory_policy=2)


def test_parse_with_diagnostics_never_raises() -> None:
    plan, diagnostics = parse_with_diagnostics("module a { keep }")
    assert plan is None and [d.code for d in diagnostics] == ["MP104"]


# ---------------------------------------------------------------- typed configs and units


def _block(text: str, kind: ast.BlockKind):
    return parse("memplan 1\n" + text).block(kind)


def test_config_defaults() -> None:
    assert config_of(_block("sublinear { }", ast.BlockKind.SUBLINEAR)) == SublinearConfig()
    assert config_of(_block("memory { }", ast.BlockKind.MEMORY)) == MemoryConfig(0, 0)
    assert config_of(_block("memonger { }", ast.BlockKind.MEMONGER)) == MemongerConfig("greedy", "topological")
    dtr = config_of(_block("dtr { eviction_threshold = 1 GiB }", ast.BlockKind.DTR))
    assert dtr == DtrConfig(1024**3, 1024**2, 1.0, 1.0)
    sub = SublinearConfig()
    assert (sub.thresh_nr_try, sub.genetic_nr_iter, sub.genetic_pool_size, sub.lb_memory) == (10, 0, 20, 0)
    assert sub.num_worker is None and sub.workers >= 1


def test_config_values() -> None:
    text = """
dtr {
    eviction_threshold   = 6 GiB
    evictee_minimum_size = 1.5 KB
    recomp_memory_factor = 2
    recomp_time_factor   = 0.5
}
sublinear {
    thresh_nr_try     = 3
    genetic_nr_iter   = 50
    genetic_pool_size = 2
    lb_memory         = 0
    num_worker        = 4
}
memory { static_memory_policy = 4; atomic_clean_policy = 1 }
memonger { algo = dp; ordering = longest_path }
step { loss = "losses.py:nll"; autocast = bf16; optimizer = adamw; master_weights = fp32; shards = 8; mixed_precision = bf16 }
"""
    plan = parse("memplan 1\n" + text)
    configs = [config_of(plan.block(kind)) for kind in ast.BlockKind]
    assert configs == [
        DtrConfig(6 * 1024**3, 1500, 2.0, 0.5),
        SublinearConfig(3, 50, 2, 0, 4),
        MemoryConfig(4, 1),
        MemongerConfig("dp", "longest_path"),
        StepConfig("losses.py:nll", "bf16", "adamw", "fp32", 8, "bf16"),
    ]
    assert isinstance(configs[0].recomp_memory_factor, float)
    assert configs[1].workers == 4


@pytest.mark.parametrize(
    "written, expected",
    [
        ("7 B", 7),
        ("1 KiB", 1024),
        ("1 MiB", 1024**2),
        ("2 GiB", 2 * 1024**3),
        ("1 TiB", 1024**4),
        ("1 KB", 1000),
        ("1.5 KB", 1500),
        ("2.5 MB", 2_500_000),
        ("3 GB", 3 * 1000**3),
        ("0.5 TB", 500 * 1000**3),
        ("0.5 KiB", 512),
        (".25MiB", 1024**2 // 4),
        ("1e3 B", 1000),
    ],
)
def test_size_units_in_bytes(written: str, expected: int) -> None:
    block = _block(f"sublinear {{ lb_memory = {written} }}", ast.BlockKind.SUBLINEAR)
    assert config_of(block).lb_memory == expected


def test_units_are_binary_and_decimal() -> None:
    assert {u.symbol: u.factor for u in ast.Unit} == {
        "B": 1,
        "KiB": 1024,
        "MiB": 1024**2,
        "GiB": 1024**3,
        "TiB": 1024**4,
        "KB": 1000,
        "MB": 1000**2,
        "GB": 1000**3,
        "TB": 1000**4,
    }


def test_budget_forms() -> None:
    def budget(text):
        return parse(f"memplan 1\nbudget {text}").budget

    assert budget("4 GiB").amount.bytes == 4 * 1024**3 and budget("4 GiB").mode is None
    assert budget("4 GiB hard").mode is ast.BudgetMode.HARD
    assert budget("4 GiB hint").mode is ast.BudgetMode.HINT
    assert budget("50%").amount == ast.Percent(50) and budget("50%").amount.fraction == 0.5
    assert budget("0.6").amount == 0.6
    assert budget("1").amount == 1


def test_durations_and_lists_are_values() -> None:
    # No key takes a duration yet; it is still a value with a type and a canonical form.
    plan, diagnostics = parse_with_diagnostics("memplan 1\nsublinear { thresh_nr_try = 10 ms }")
    assert [d.code for d in diagnostics] == ["MP202"]
    assert format_value(ast.Duration(10, "ms")) == "10 ms" and ast.Duration(10, "ms").seconds == 0.01
    assert format_value(ast.Duration(1.5, "s")) == "1.5 s"
    assert format_value(ast.ValueList((1, ast.Word("x"), ast.Text("a b")))) == '[1, x, "a b"]'


def test_check_block_reports_everything_at_once() -> None:
    block = ast.ConfigBlock(
        ast.BlockKind.SUBLINEAR,
        (
            ast.ConfigEntry("thresh_nr_try", 0),
            ast.ConfigEntry("num_worker", 0),
            ast.ConfigEntry("nope", 1),
            ast.ConfigEntry("num_worker", 2),
        ),
    )
    assert [d.code for d in check_block(block)] == ["MP203", "MP203", "MP201", "MP208"]


# ---------------------------------------------------------------- pieces used by other stages


def test_format_pieces() -> None:
    rule = parse(
        'memplan 1\nmodule **.blocks[1:-1:2]."a b" : nn.Linear not class Dropout { checkpoint segments = 2 rng = off }'
    ).rules[0]
    assert format_selector(rule.selector) == '**.blocks[1:-1:2]."a b" : nn.Linear not class Dropout'
    assert format_policy(rule.policies[0]) == "checkpoint segments = 2 rng = off"
    assert format_policy(ast.Compress(ast.Codec.INT8, True, 0.01)) == "compress input = int8 lossy tolerance = 0.01"
    assert format_policy(ast.TemporalChunk(4, 0, (0, "state", "h c"), True)) == (
        'temporal_chunk 4 dim 0 args = [0, state, "h c"] allow_nonequivalent = true'
    )


def test_floats_keep_every_digit() -> None:
    plan = ast.Plan(1, (ast.Budget(ast.Size(0.1 + 0.2, ast.Unit.GiB)),))
    assert "0.30000000000000004 GiB" in format_plan(plan)
    assert parse(format_plan(plan)) == plan
    tiny = ast.Plan(1, (ast.Budget(ast.Percent(1e-7)),))
    assert "0.0000001%" in format_plan(tiny) and parse(format_plan(tiny)) == tiny


def test_keywords_need_a_word_boundary() -> None:
    # `checkpointsegments` is not `checkpoint segments`; `modulea` is not `module a`.
    for text, code in [
        ("module a { checkpointsegments = 2 }", "MP102"),
        ("modulea { keep }", "MP101"),
        ("module a { keep2 }", "MP102"),
        ("budget4 GiB", "MP101"),
    ]:
        with pytest.raises(PlanError) as info:
            parse("memplan 1\n" + text)
        assert info.value.codes == [code], text
    # Keywords are ordinary names where no keyword can stand.
    rule = parse("memplan 1\nmodule a.module.keep : not { checkpoint }").rules[0]
    assert [s.text for s in rule.selector.include.path.segments] == ["a", "module", "keep"]
    assert rule.selector.include.class_name == "not"


def test_spans_point_at_nodes() -> None:
    plan = parse("memplan 1\n\nmodule a {\n  keep\n}\nbudget 1 GiB  # c\n", "f.memplan")
    rule = plan.rules[0]
    assert (rule.span.line, rule.span.column, rule.span.end_line) == (3, 1, 5)
    assert (rule.selector.span.line, rule.selector.span.column) == (3, 8)
    assert (rule.policies[0].span.line, rule.policies[0].span.column) == (4, 3)
    assert plan.budget.span.line == 6 and plan.budget.comments.trailing == "# c"


def test_ast_equality_ignores_spans_but_not_comments() -> None:
    a = parse("memplan 1\nmodule a { keep }\n")
    b = parse("memplan 1\n\n\n   module a {\n keep }\n")
    c = parse("memplan 1\nmodule a { keep }  # why\n")
    assert a == b and a != c
    assert hash(a.rules[0].selector) == hash(b.rules[0].selector)
