"""Every statement of a plan acts, or is refused with a diagnostic saying why it cannot act.

The walk covers every statement keyword, every policy and every config key the
language has (from the parser's own tables), so a statement added to the grammar
without an effect or a refusal fails here.
"""

from __future__ import annotations

import pytest
import torch

import memoplan
from memoplan import cli
from memoplan.diagnostics import PlanError, Severity
from memoplan.examples import spiking
from memoplan.examples.cnn import build
from memoplan.resolver.effects import statement_effects
from memoplan.syntax import ast, parse
from memoplan.syntax.blocks import SCHEMA
from memoplan.syntax.build import POLICY_NAMES, STATEMENT_NAMES

HEAD = 'memplan 1\nmodel "memoplan.examples.cnn:build"\nexample randn(8, 3, 32, 32)\n'

# One valid value per config key, written as in a plan.
VALUES = {
    "eviction_threshold": "2 MiB",
    "evictee_minimum_size": "0",
    "recomp_memory_factor": "1.5",
    "recomp_time_factor": "2",
    "modules": '"features[1:3]"',
    "thresh_nr_try": "3",
    "genetic_nr_iter": "4",
    "genetic_pool_size": "6",
    "lb_memory": "1 MiB",
    "num_worker": "2",
    "static_memory_policy": "3",
    "atomic_clean_policy": "0",
    "algo": "dp",
    "ordering": "longest_path",
    "peak_slack": "0.5",
    # the `step` block: each key changes the step `plan`, `verify` and `report` run (tests/test_step.py)
    "loss": "sum",
    "autocast": "bf16",
    "optimizer": "adamw",
    "master_weights": "fp32",
    "shards": "2",
    "mixed_precision": "bf16",
}

# The code that refuses each block kind while its run-time part is not built.  `memory` acts
# (tests/runtime/test_memory_block.py and the walk below); `sublinear` sets the search of `memoplan plan
# PLAN` (tests/planner/test_plan_complete.py walks its keys), with a note from `check` (below); `dtr`
# gives its candidates a tracker with every key (the walk below, tests/runtime/test_dtr.py).
REFUSED: dict[ast.BlockKind, str] = {}  # every block acts in this version

# Rules over the spiking example whose effect shows in the resolved plan: (rules, path, field).
# Each plan threads the neurons' state, which any region over them needs (MP314).
SPIKING = 'memplan 1\nmodel "memoplan.examples.spiking:build"\nmodule class LIF { state = functional }\n'
POLICIES = {
    "checkpoint": ("module blocks.1 { checkpoint }", "blocks.1", "checkpoint"),
    "compress": ("module blocks.1 { checkpoint; compress input = bit }", "blocks.1", "compress"),
    "temporal_chunk": ("module blocks.1.lif { temporal_chunk 4 dim 0 }", "blocks.1.lif", "temporal_chunk"),
    "keep": ("module blocks.* { checkpoint }\nmodule blocks.1 { keep }", "blocks.1", "keep"),
    "state": ("", "blocks.1.lif", "state"),
    "buffers": ("module blocks.1 { checkpoint; buffers = commit_once }", "blocks.1", "buffers_commit_once"),
}


def test_the_tables_cover_every_statement_and_key():
    assert set(VALUES) == {key for _, keys in SCHEMA.values() for key in keys}
    assert set(REFUSED) == set(ast.BlockKind) - {
        ast.BlockKind.MEMORY,
        ast.BlockKind.SUBLINEAR,
        ast.BlockKind.DTR,
        ast.BlockKind.MEMONGER,
        ast.BlockKind.STEP,
    }
    assert set(POLICIES) == set(POLICY_NAMES)
    assert set(STATEMENT_NAMES) == {"model", "example", "module", "budget"} | {k.value for k in ast.BlockKind}


@pytest.mark.parametrize("key", sorted(SCHEMA[ast.BlockKind.MEMONGER][1]))
def test_every_memonger_key_acts_in_the_arena_module(key, tmp_path):
    # memonger's own tests (tests/test_memonger*.py) prove the arena; here: each key reaches it.
    text = HEAD + f"memonger {{ {key} = {VALUES[key]} }}\n"
    model = build()
    path = memoplan.write_module(model, parse(text, "p.memplan"), tmp_path / "plan_module.py")
    word = {
        "algo": "assigned by `dp`",
        "ordering": "steps in `longest_path` order",
        "peak_slack": "`peak_slack = 0.5`: ",
    }[key]
    assert word in path.read_text()
    memoplan.apply(model, parse(text, "p.memplan"))
    assert "forward" in model.__dict__  # the arena forward of the whole model
    memoplan.remove(model)
    assert "forward" not in model.__dict__


@pytest.mark.parametrize("key", list(SCHEMA[ast.BlockKind.DTR][1]))
def test_every_dtr_key_reaches_the_tracker(key):
    from memoplan.runtime.dtr import DTR_ATTR

    required = "" if key == "eviction_threshold" else "eviction_threshold = 2 MiB; "
    plan = parse(HEAD + f"dtr {{ {required}{key} = {VALUES[key]} }}\n", "p.memplan")
    expected = getattr(memoplan.resolve(plan, build()).dtr, key)
    default = getattr(type(memoplan.resolve(plan, build()).dtr)(eviction_threshold=1), key)
    assert key == "eviction_threshold" or expected != default  # the value written is not the default
    model = memoplan.apply(build(), plan)
    tracker = model.__dict__[DTR_ATTR]
    candidates = {name for name, m in model.named_modules() if m.__dict__.get(DTR_ATTR) is tracker} - {""}
    if key == "modules":  # names the candidates, instead of the blocks
        assert candidates == {"features.1", "features.2"}
    else:
        assert getattr(tracker.settings, key) == expected
        assert candidates == {f"features.{i}" for i in range(5)}


def test_a_dtr_block_with_nothing_to_evict_is_refused():
    plan = parse(
        HEAD + "module features.* : ConvBlock { checkpoint }\ndtr { eviction_threshold = 2 MiB }\n", "p.memplan"
    )
    model = build()
    with pytest.raises(PlanError) as caught:
        memoplan.apply(model, plan)
    (diagnostic,) = caught.value.errors
    assert diagnostic.code == "MP230" and diagnostic.span.line == 5 and diagnostic.help
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing applied


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_changes_the_resolved_plan(policy):
    rules, path, field = POLICIES[policy]
    resolved = memoplan.resolve(parse(SPIKING + rules + "\n"), spiking.build())
    assert getattr(resolved.module(path), field) is not None


@pytest.mark.slow
def test_the_budget_acts_in_verify_and_check_says_so(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text(HEAD + "module features.* : ConvBlock { checkpoint }\nbudget 1 MiB hard\n")
    (note,) = statement_effects(memoplan.load(plan), checking=True)
    assert statement_effects(memoplan.load(plan)) == []  # resolve does not repeat it
    assert note.code == "MP224" and note.severity is Severity.NOTE and note.span.line == 5
    assert cli.main(["check", str(plan)]) == 0
    assert "note[MP224]" in capsys.readouterr().err

    assert cli.main(["verify", str(plan)]) == 1  # equivalent, but the hard budget is missed
    out, err = capsys.readouterr()
    assert "verdict: EQUIVALENT" in out and "MISSED (hard)" in out
    assert f"{plan}:5:1: error[MP225]: hard budget missed" in err and "^^^" in err

    plan.write_text(HEAD + "module features.* : ConvBlock { checkpoint }\nbudget 1 MiB hint\n")
    assert cli.main(["verify", str(plan)]) == 0
    out, err = capsys.readouterr()
    assert "MISSED (hint)" in out and "warning[MP226]: budget hint missed" in err

    plan.write_text(HEAD + "module features.* : ConvBlock { checkpoint }\nbudget 90%\n")
    assert cli.main(["verify", str(plan)]) == 0
    out, err = capsys.readouterr()
    assert ", met" in out and "MP22" not in err


def test_check_refuses_a_memonger_block_without_an_example_and_notes_where_it_acts(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text("memplan 1\nmemonger { algo = dp }\n")
    assert cli.main(["check", str(plan)]) == 1
    err = capsys.readouterr().err
    assert f"{plan}:2:1: error[MP243]" in err and "1 error" in err
    plan.write_text(HEAD + "memonger { algo = dp }\n")
    assert cli.main(["check", str(plan)]) == 0
    assert f"{plan}:4:1: note[MP244]" in capsys.readouterr().err


def _storages(model) -> int:
    return len({p.grad.untyped_storage().data_ptr() for p in model.parameters() if p.grad is not None})


@pytest.mark.parametrize("policy,storages", [("0", 1), ("1", 17)])
def test_atomic_clean_policy_decides_where_gradients_live(policy, storages):
    model = memoplan.apply(build(), HEAD + f"memory {{ atomic_clean_policy = {policy} }}\n")
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert _storages(model) == storages


@pytest.mark.parametrize("policy", [2, 3, 4])
def test_static_memory_policy_acts_on_cuda_and_says_so_elsewhere(policy):
    text = HEAD + f"budget 1 GiB\nmemory {{ static_memory_policy = {policy} }}\n"
    resolved = memoplan.resolve(parse(text, "p.memplan"), build())
    notes = [(d.code, d.span.line) for d in resolved.warnings if d.severity is Severity.NOTE]
    if torch.cuda.is_available():  # acting there is tested by tests/runtime/test_memory_block.py
        assert notes == []
    else:
        assert notes == [("MP228", 5)]


def test_check_says_where_a_sublinear_block_acts(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text(HEAD + "sublinear { genetic_nr_iter = 3 }\n")
    assert cli.main(["check", str(plan)]) == 0
    assert (
        f"{plan}:4:1: note[MP222]: the `sublinear` block sets the search of `memoplan plan`" in capsys.readouterr().err
    )
    memoplan.apply(build(), memoplan.load(plan))  # applying uses the rules; the block needs nothing of it


def test_check_with_a_model_prints_each_note_once(tmp_path, capsys):
    plan = tmp_path / "p.memplan"
    plan.write_text(HEAD + "budget 1 GiB\nmemory { static_memory_policy = 3 }\n")
    assert cli.main(["check", str(plan)]) == 0
    err = capsys.readouterr().err
    assert err.count("note[MP224]") == 1
    assert err.count("note[MP228]") == (0 if torch.cuda.is_available() else 1)
