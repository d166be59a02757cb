"""Hostile and careless input: every mistake is a diagnostic, never a traceback, and the CLI
and the API read, print and refuse the same way.

The CLI runs in-process (``memoplan.cli.main``); a few cases run it as a subprocess where
the terminal's encoding or the process's umask is the point.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import TRACEBACK, run, write
from _paths import ROOT
from torch import nn

import memoplan
from memoplan import diagnostics
from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.resolver import explain
from memoplan.resolver.selectors import ModelIndex, Specificity, select, specificity
from memoplan.syntax import format_plan, parse, parse_example_spec


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))


MODELS_PY = """
import sys
import torch
from torch import nn


def build():
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def exits():
    sys.exit(3)


def exits_quietly():
    raise SystemExit


class Fails(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        raise RuntimeError("forward failed")


class Exits(Fails):
    def forward(self, x):
        raise SystemExit("forward exited")


def fails():
    return Fails()


def exits_in_forward():
    return Exits()


def escapes():
    model = nn.Sequential()
    model.add_module("\\x1b[31mred", nn.Linear(4, 4))
    model.add_module("lone\\udc80", nn.Linear(4, 4))
    return model


def escapes_deep():
    model = nn.Sequential()
    for i in range(3):
        block = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        model.add_module(f"\\x1b[3{i}mblock" + chr(0xDC80 + i), block)
    return model


def example_exits():
    raise SystemExit(0)


def keywords():
    from memoplan.specs import Example

    return Example((), {"x": torch.randn(2, 4)})
"""


@pytest.fixture()
def models(tmp_path: Path) -> Path:
    return write(tmp_path, "models.py", MODELS_PY)


@pytest.fixture()
def all_plan(tmp_path: Path) -> Path:
    return write(tmp_path, "all.memplan", "memplan 1\nmodule ** { checkpoint }\n")


# ---------------------------------------------------------------- 10: absurd examples


@pytest.mark.parametrize(
    "example",
    [
        "randn(99999999999999999999999)",
        "randn(9223372036854775807)",
        "randn(1000000, 1000000, 1000000)",
        "zeros(4611686018427387904, 4, dtype=int8)",
    ],
)
def test_absurd_example_is_refused_before_allocating(capsys, all_plan, example) -> None:
    code, out, err = run(capsys, "check", all_plan, "--example", example)
    assert code == 1
    assert "error[MP507]" in err
    assert "--example:1:9" in err  # the example's span
    assert "^" in err


def test_absurd_example_in_a_plan_points_at_it(capsys, tmp_path: Path) -> None:
    path = write(tmp_path, "big.memplan", "memplan 1\nexample randn(4), randn(100000, 100000, 100000)\n")
    code, out, err = run(capsys, "check", path)
    assert code == 1
    assert f"{path}:2:" in err and "error[MP507]" in err and "example tensor 2" in err
    assert "  2 | example randn(4)" in err


def test_absurd_example_through_the_api() -> None:
    from memoplan import specs

    with pytest.raises(PlanError) as info:
        specs.make_example(parse_example_spec("randn(2, 9223372036854775807)"))
    assert info.value.codes == ["MP507"]
    assert "overflow" in str(info.value)


def test_large_but_possible_example_is_built() -> None:
    from memoplan import specs

    example = specs.make_example(parse_example_spec("zeros(1024, 1024, dtype=int8)"))
    assert example.args[0].shape == (1024, 1024)


# ---------------------------------------------------------------- 10: compile onto a directory


def test_compile_onto_a_directory_is_a_diagnostic(capsys, tmp_path, models, all_plan) -> None:
    target = tmp_path / "out"
    target.mkdir()
    code, out, err = run(capsys, "write-module", all_plan, "--model", f"{models}:build", "-o", target)
    assert code == 1
    assert "error[MP508]" in err and "is a directory" in err
    assert list(target.iterdir()) == []


def test_plan_onto_a_directory_is_refused_before_measuring(capsys, tmp_path, models) -> None:
    target = tmp_path / "out"
    target.mkdir()
    args = ["plan", "--model", f"{models}:fails", "--example", "randn(2, 4)", "--budget", "50%", "-o", target]
    code, out, err = run(capsys, *args)
    assert code == 1
    assert "error[MP508]" in err and "MP504" not in err


# ---------------------------------------------------------------- 10, 11: user code that raises or exits


@pytest.mark.parametrize("command", ["plan", "profile"])
def test_forward_that_raises_is_a_diagnostic(capsys, tmp_path, models, command) -> None:
    args = [command, "--model", f"{models}:fails", "--example", "randn(2, 4)", "-o", tmp_path / "x"]
    if command == "plan":
        args += ["--budget", "50%"]
    code, out, err = run(capsys, *args)
    assert code == 1
    assert "error[MP504]" in err and "RuntimeError: forward failed" in err


@pytest.mark.parametrize("command", ["check", "explain", "verify"])
@pytest.mark.parametrize("factory", ["exits", "exits_quietly"])
def test_factory_raising_system_exit_is_a_diagnostic(capsys, models, all_plan, command, factory) -> None:
    args = [command, all_plan, "--model", f"{models}:{factory}"]
    if command == "verify":
        args += ["--example", "randn(2, 4)"]
    code, out, err = run(capsys, *args)
    assert code == 1
    assert "error[MP504]" in err and f"models.py:{factory}" in err and "SystemExit" in err


def test_builtins_exit_as_a_factory_fails(capsys, all_plan) -> None:
    code, out, err = run(capsys, "check", all_plan, "--model", "builtins:exit")
    assert code == 1
    assert "error[MP504]" in err and "builtins:exit" in err


def test_example_factory_raising_system_exit(capsys, models, all_plan) -> None:
    code, out, err = run(capsys, "check", all_plan, "--example", f"{models}:example_exits")
    assert code == 1
    assert "error[MP504]" in err and "example_exits" in err


def test_module_file_that_exits_on_import(capsys, tmp_path, all_plan) -> None:
    path = write(tmp_path, "exiting.py", "raise SystemExit(1)\n")
    code, out, err = run(capsys, "check", all_plan, "--model", f"{path}:build")
    assert code == 1 and "error[MP504]" in err


def test_forward_raising_system_exit_in_verify(capsys, models, all_plan) -> None:
    args = ["verify", all_plan, "--model", f"{models}:exits_in_forward", "--example", "randn(2, 4)"]
    code, out, err = run(capsys, *args)
    assert code == 1 and "error[MP504]" in err and "forward exited" in err


def test_keyboard_interrupt_is_not_swallowed(tmp_path) -> None:
    from memoplan import specs

    path = write(tmp_path, "ki.py", "def build():\n    raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        specs.load_model(f"{path}:build")


# ---------------------------------------------------------------- 12: one reading path


def test_cr_only_line_endings_are_read_alike(capsys, tmp_path) -> None:
    path = tmp_path / "cr.memplan"
    path.write_bytes(b"memplan 1\rmodule a.* { checkpoint }\rbudget 4 GiB\r")
    plan = memoplan.load(path)
    assert len(plan.rules) == 1
    code, out, err = run(capsys, "check", path)
    assert code == 0, err
    assert out.strip() == f"{path}: ok, 1 rule"


def test_cr_only_line_numbers_in_diagnostics(tmp_path) -> None:
    path = tmp_path / "cr.memplan"
    path.write_bytes(b"memplan 1\rmodule a { chekpoint }\r")
    with pytest.raises(PlanError) as info:
        memoplan.load(path)
    assert f"{path}:2:12: error[MP102]" in str(info.value)


def test_non_utf8_gets_line_column_and_caret_from_the_cli(capsys, tmp_path) -> None:
    path = tmp_path / "latin1.memplan"
    path.write_bytes(b"memplan 1\nmodule caf\xe9 { keep }\n")
    with pytest.raises(PlanError) as info:
        memoplan.load(path)
    api_text = str(info.value)
    code, out, err = run(capsys, "check", path)
    assert code == 1
    assert f"{path}:2:11: error[MP107]" in err
    assert "byte 0xe9" in err and "can't decode" not in err
    assert api_text in err


# ---------------------------------------------------------------- 14: names printed to a terminal


def test_printable_escapes_controls_and_lone_surrogates() -> None:
    assert diagnostics.printable("layer1.0") == "layer1.0"
    assert diagnostics.printable("ünï 名字") == "ünï 名字"
    assert diagnostics.printable("\x1b[31mred") == "\\x1b[31mred"
    assert diagnostics.printable("a\nb\tc\x7f") == "a\\nb\\tc\\x7f"
    assert diagnostics.printable("lone\udc80") == "lone\\udc80"
    assert diagnostics.printable("\u202eevil") == "\\u202eevil"  # a bidi override reorders what follows
    assert diagnostics.printable("ls\u2028x\u2029") == "ls\\u2028x\\u2029"  # line and paragraph separators


def test_explain_escapes_model_provided_names(capsys, models, all_plan) -> None:
    code, out, err = run(capsys, "explain", all_plan, "--model", f"{models}:escapes")
    assert code == 0, err
    assert "\x1b" not in out and "\udc80" not in out
    assert "\\x1b[31mred" in out and "lone\\udc80" in out


def test_verify_escapes_model_provided_names(capsys, models, all_plan) -> None:
    args = ["verify", all_plan, "--model", f"{models}:escapes", "--example", "randn(2, 4)"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "\x1b" not in out + err and "\udc80" not in out + err
    assert "\\x1b[31mred" in out
    header, first, second = out.splitlines()[1:4]  # the plan table's columns line up
    assert header.index("class") == first.index("Linear") == second.index("Linear")


def test_diagnostics_escape_model_provided_names(capsys, models, tmp_path) -> None:
    path = write(tmp_path, "typo.memplan", "memplan 1\nmodule lone { keep }\n")
    code, out, err = run(capsys, "check", path, "--model", f"{models}:escapes")
    assert code == 1 and "MP301" in err
    assert "\x1b" not in err and "\udc80" not in err
    rendered = Diagnostic("MP301", "no `\x1b[2J`", help="did you mean `lone\udc80`?").render()
    assert rendered == "error[MP301]: no `\\x1b[2J`\n  help: did you mean `lone\\udc80`?"


@pytest.mark.parametrize("command", ["explain", "verify"])
@pytest.mark.slow
def test_strict_utf8_terminal_gets_no_encoding_error(tmp_path, models, all_plan, command) -> None:
    args = [command, str(all_plan), "--model", f"{models}:escapes"]
    if command == "verify":
        args += ["--example", "randn(2, 4)"]
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict", MEMOPLAN_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-m", "memoplan.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert TRACEBACK not in result.stderr
    assert "lone\\udc80" in result.stdout


# ---------------------------------------------------------------- 15: compile respects the umask


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
@pytest.mark.slow
def test_compile_respects_the_umask(tmp_path, models, all_plan, umask) -> None:
    target = tmp_path / "generated_plan.py"
    code = f"import os, sys\nos.umask({umask})\nfrom memoplan import cli\nsys.exit(cli.main(sys.argv[1:]))\n"
    env = dict(os.environ, MEMOPLAN_CACHE_DIR=str(tmp_path / "cache"))
    args = ["write-module", str(all_plan), "--model", f"{models}:build", "-o", str(target)]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_compile_keeps_the_mode_of_the_file_it_replaces(capsys, tmp_path, models, all_plan) -> None:
    target = tmp_path / "generated_plan.py"
    target.write_text("# old\n")
    target.chmod(0o640)
    code, out, err = run(capsys, "write-module", all_plan, "--model", f"{models}:build", "-o", target)
    assert code == 0, err
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_text().startswith('"""') or "memoplan" in target.read_text()


# ---------------------------------------------------------------- 16: one range rule for sizes


@pytest.mark.parametrize(
    "text",
    [
        "budget 99999999999999999999999999999999999999999 TiB",
        "budget 1e400 GiB",
        "budget 8 EiB".replace("EiB", "TiB").replace("8", "8388608"),  # 2**63 bytes exactly
        "dtr { eviction_threshold = 99999999999999999999999 GiB }",
    ],
)
def test_sizes_beyond_int64_bytes_are_out_of_range(text: str) -> None:
    with pytest.raises(PlanError) as info:
        parse(f"memplan 1\n{text}\n")
    assert info.value.codes == ["MP203"]
    assert "2**63 - 1 bytes" in str(info.value)


def test_largest_size_is_accepted() -> None:
    plan = parse("memplan 1\nbudget 8388607 TiB\n")
    assert plan.budget.amount.bytes == 8388607 * 2**40


# ---------------------------------------------------------------- explain: model order, full reasons


class Unsorted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.zeta = nn.Linear(1, 1)
        self.alpha = nn.Sequential(*(nn.ReLU() for _ in range(11)))
        self.mid = nn.Linear(1, 1)


def test_explain_lists_modules_in_model_order() -> None:
    model = Unsorted()
    rows = explain(parse("memplan 1\nmodule mid { checkpoint }\n"), model)
    assert [r.path for r in rows] == [p for p, _ in model.named_modules() if p]


def test_explain_says_what_the_only_rule_is_for() -> None:
    rows = {r.path: r for r in explain(parse("memplan 1\nmodule mid { checkpoint }\n"), Unsorted())}
    ((what, why),) = rows["mid"].decisions
    assert what == "checkpoint"
    assert why == "line 2 `module mid`, the only rule that sets recompute for this module"


# ---------------------------------------------------------------- globs inside a name segment


class Stages(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        for name in ("layer1", "layer2", "layer10", "layers", "stem", "h"):
            self.add_module(name, nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1)))
        self.h.add_module("12", nn.ReLU())


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("layer*", ["layer1", "layer2", "layer10", "layers"]),
        ("layer?", ["layer1", "layer2", "layers"]),
        ("layer*.*", [f"{s}.{i}" for s in ("layer1", "layer2", "layer10", "layers") for i in (0, 1)]),
        ("layer?.1", ["layer1.1", "layer2.1", "layers.1"]),
        ("h.1?", ["h.12"]),
        ("h.?", ["h.0", "h.1"]),
        ("*1*", ["layer1", "layer10"]),
        ("**.1?", ["h.12"]),
        ("lay*r1", ["layer1"]),
        ("layer*[0]", ["layer1.0", "layer2.0", "layer10.0", "layers.0"]),
        ("layer* not layer1?", ["layer1", "layer2", "layers"]),
        ('"layer*"', []),  # quoted: a literal name with a star in it
    ],
)
def test_glob_inside_a_segment(selector: str, expected: list[str]) -> None:
    index = ModelIndex(Stages())
    plan = parse(f"memplan 1\nmodule {selector} {{ keep }}\n")
    assert sorted(select(index, plan.rules[0].selector)) == sorted(expected)


def test_glob_quoted_name_with_a_star_matches_literally() -> None:
    model = nn.Sequential()
    model.add_module("a*b", nn.ReLU())
    model.add_module("axb", nn.ReLU())
    index = ModelIndex(model)
    assert select(index, parse('memplan 1\nmodule "a*b" { keep }\n').rules[0].selector) == ["a*b"]
    assert select(index, parse("memplan 1\nmodule a*b { keep }\n").rules[0].selector) == ["a*b", "axb"]


def test_glob_is_formatted_back_as_written() -> None:
    text = "memplan 1\n\nmodule layer*.h.1? not layer?? : Block { keep }\n"
    plan = parse(text)
    assert format_plan(plan) == text
    assert format_plan(parse(format_plan(plan))) == text


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("layer*", (0, 0, 1, 0, 0)),
        ("layer*.0", (1, 0, 1, 0, 0)),
        ("*.0", (1, 0, 0, 1, 0)),
        ("layer*.*", (0, 0, 1, 1, 0)),
    ],
)
def test_glob_specificity(selector: str, expected: tuple) -> None:
    plan = parse(f"memplan 1\nmodule {selector} {{ keep }}\n")
    assert specificity(plan.rules[0].selector) == Specificity(*expected)


def test_glob_is_more_specific_than_star_and_less_than_a_name() -> None:
    body = (
        "memplan 1\n"
        "module * { checkpoint }\n"  # 2
        "module layer* { keep }\n"  # 3
        "module layer1 { checkpoint }\n"  # 4
    )
    rows = {r.path: r for r in explain(parse(body), Stages())}
    assert rows["layer2"].decisions[0][0] == "keep"
    assert rows["layer1"].decisions[0][0] == "checkpoint"
    assert rows["stem"].decisions[0][0] == "checkpoint"


@pytest.mark.parametrize("selector", ["layer**", "a.**b"])
def test_double_star_inside_a_segment_is_refused(selector: str) -> None:
    with pytest.raises(PlanError) as info:
        parse(f"memplan 1\nmodule {selector} {{ keep }}\n")
    assert info.value.codes == ["MP211"]


# ---------------------------------------------------------------- fmt --check shows the change


def test_fmt_check_shows_a_unified_diff(capsys, tmp_path) -> None:
    path = write(tmp_path, "messy.memplan", "memplan 1\nmodule   a{keep}\n")
    code, out, err = run(capsys, "fmt", "--check", path)
    assert code == 1
    assert f"would reformat {path}" in out
    assert f"--- {path}\n" in out and f"+++ {path} (formatted)\n" in out
    assert "-module   a{keep}\n" in out and "+module a { keep }\n" in out


# ---------------------------------------------------------------- check names a keyword example


def test_check_names_keyword_inputs(capsys, models, all_plan) -> None:
    code, out, err = run(capsys, "check", all_plan, "--example", f"{models}:keywords")
    assert code == 0, err
    assert "example of keyword `x`" in out


def test_check_names_keyword_inputs_next_to_positional_ones(capsys) -> None:
    code, out, err = run(capsys, "check", ROOT / "plans" / "transformer.memplan")
    assert code == 0, err
    assert out.rstrip().endswith("example of 1 input and keyword `attention_mask`")


# ---------------------------------------------------------------- verify prints step times


def test_verify_prints_both_step_times(capsys, models, all_plan) -> None:
    code, out, err = run(capsys, "verify", all_plan, "--model", f"{models}:build", "--example", "randn(2, 4)")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("step time")]
    assert "unplanned" in line and "planned" in line and " ms" in line


def test_compile_check_against_a_directory_is_a_diagnostic(capsys, tmp_path, models, all_plan) -> None:
    target = tmp_path / "out"
    target.mkdir()
    code, out, err = run(capsys, "write-module", all_plan, "--model", f"{models}:build", "-o", target, "--check")
    assert code == 1
    assert "error[MP508]" in err and "is a directory" in err


@pytest.mark.slow
def test_plan_progress_and_tables_escape_model_provided_names(capsys, tmp_path, models) -> None:
    args = ["plan", "--model", f"{models}:escapes_deep", "--example", "randn(64, 64)", "--preset", "balanced"]
    # -v: the progress's details name the modules the search tried
    code, out, err = run(capsys, *args, "-v", "-o", tmp_path / "p.memplan")
    assert code == 0, err
    assert "\x1b" not in out + err and "\udc80" not in out + err
    assert "\\x1b[30mblock" in out + err
    memoplan.load(tmp_path / "p.memplan")  # the written plan quotes the names and parses back


def test_factory_raising_its_own_base_exception(capsys, tmp_path, all_plan) -> None:
    path = write(tmp_path, "own.py", "class Stop(BaseException):\n    pass\n\ndef build():\n    raise Stop('no')\n")
    code, out, err = run(capsys, "check", all_plan, "--model", f"{path}:build")
    assert code == 1 and "error[MP504]" in err and "Stop: no" in err
