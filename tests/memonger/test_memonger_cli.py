"""memonger through the command line: explain prints the arena, compile writes it, verify runs with it."""

from __future__ import annotations

import ast

import pytest

from memoplan import cli

PLAN = """memplan 1
model "tiny.py:build"
example randn(8, 16)
memonger { algo = dp; ordering = longest_path; peak_slack = 10 }
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
    assert cli.main(["write-module", str(plan), "-o", str(output)]) == 0
    text = output.read_text()
    ast.parse(text)
    assert "def arena_graph(arena, inputs, attributes):" in text and "out=arena[" in text
    assert cli.main(["write-module", str(plan), "-o", str(output), "--check"]) == 0  # byte-identical again
    capsys.readouterr()

    assert cli.main(["verify", str(plan)]) == 0  # a training step: the arena steps aside
    assert "verdict: EQUIVALENT" in capsys.readouterr().out


def test_explain_says_what_the_default_peak_slack_left_out(tmp_path, capsys):
    # An MLP holds as much at every step as at its peak: any resident arena raises the peak.
    plan = tmp_path / "mlp.memplan"
    plan.write_text(PLAN.replace("; peak_slack = 10", ""))
    (tmp_path / "tiny.py").write_text(MODEL)
    assert cli.main(["explain", str(plan), "--planned-only"]) == 0
    out = capsys.readouterr().out
    assert "peak_slack 0.02: 0 of the 5 buffers an out= form can write are in the arena; 5 left out" in out
    assert "5  left out of the arena to keep the peak (peak_slack)" in out
    assert "no buffer is in the arena" in out


@pytest.mark.slow
def test_compiled_in_two_processes_with_other_hash_seeds_the_bytes_are_the_same(tmp_path, capsys):
    import os
    import subprocess
    import sys

    plan = tmp_path / "mlp.memplan"
    plan.write_text(PLAN)
    (tmp_path / "tiny.py").write_text(MODEL)
    here = tmp_path / "plan_here.py"
    assert cli.main(["write-module", str(plan), "-o", str(here)]) == 0
    out = tmp_path / "plan_there.py"
    env = dict(os.environ, PYTHONHASHSEED="12345")  # this process has another seed (or a random one)
    code = f"from memoplan.cli import main; raise SystemExit(main(['compile', {str(plan)!r}, '-o', {str(out)!r}]))"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path, capture_output=True)
    texts = [here.read_bytes(), out.read_bytes()]
    assert texts[0] == texts[1]


@pytest.mark.slow
def test_a_pickled_arena_model_runs_on_the_arena_in_a_fresh_process(tmp_path):
    import subprocess
    import sys

    import torch

    import memoplan
    from memoplan.examples.mlp import MLP

    model = MLP(depth=3, width=16).eval()
    memoplan.apply(model, "memplan 1\nexample randn(8, 16)\nmemonger { }\n")
    x = torch.randn(8, 16)
    with torch.no_grad():
        expected = model(x)
    torch.save({"model": model, "x": x, "expected": expected}, tmp_path / "saved.pt")
    code = (
        "import torch, memoplan\n"
        "from memoplan.runtime.arena import arena_state\n"
        f"saved = torch.load({str(tmp_path / 'saved.pt')!r}, weights_only=False)\n"
        "model = saved['model']\n"
        "with torch.no_grad():\n"
        "    assert torch.equal(model(saved['x']), saved['expected'])\n"
        "assert arena_state(model).arena_calls == 1\n"
        "memoplan.remove(model)\n"
        "assert 'forward' not in model.__dict__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, capture_output=True)
