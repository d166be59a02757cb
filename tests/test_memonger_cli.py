"""memonger through the command line: explain prints the arena, compile writes it, verify runs with it."""

from __future__ import annotations

import ast

from memoplan import cli

PLAN = """memplan 1
model "tiny.py:build"
example randn(8, 16)
memonger { algo = dp; ordering = longest_path }
"""

MODEL = """from memoplan.examples.mlp import MLP


def build():
    return MLP(depth=3, width=16)
"""


def test_explain_compile_and_verify_with_a_memonger_block(tmp_path, capsys):
    plan = tmp_path / "mlp.memplan"
    plan.write_text(PLAN)
    (tmp_path / "tiny.py").write_text(MODEL)
    assert cli.main(["explain", str(plan), "--planned-only"]) == 0
    out = capsys.readouterr().out
    assert "memonger: inference of the whole model (MLP) on one arena" in out
    assert "ordering longest_path, algo dp" in out and "lower bound" in out
    assert "slot  offset  bytes" in out and "float32  8x16" in out

    output = tmp_path / "mlp_plan.py"
    assert cli.main(["compile", str(plan), "-o", str(output)]) == 0
    text = output.read_text()
    ast.parse(text)
    assert "def arena_graph(arena, inputs, attributes):" in text and "out=arena[" in text
    assert cli.main(["compile", str(plan), "-o", str(output), "--check"]) == 0  # byte-identical again
    capsys.readouterr()

    assert cli.main(["verify", str(plan)]) == 0  # a training step: the arena steps aside
    assert "verdict: EQUIVALENT" in capsys.readouterr().out
