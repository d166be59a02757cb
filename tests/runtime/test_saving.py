"""Op-level saving: ``checkpoint save = [matmul, attention]`` keeps the named ops' outputs and
recomputes the rest, bit for bit like every checkpoint; its names are checked and formatted."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import memoplan
from memoplan.codegen.emit import emit
from memoplan.diagnostics import PlanError
from memoplan.runtime.saving import OP_FAMILIES, saved_ops
from memoplan.specs import Example
from memoplan.syntax import ast, format_plan, parse
from memoplan.verification import verify


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm, self.drop = (
            nn.Linear(64, 256),
            nn.Linear(256, 64),
            nn.LayerNorm(64),
            nn.Dropout(0.1),
        )
        self.conv = nn.Conv1d(64, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.norm(x)
        a = F.scaled_dot_product_attention(q[None], q[None], q[None])[0]
        a = a + self.conv(a.t()[None])[0].t()
        return x + self.drop(self.down(F.gelu(self.up(a))))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList([_Block() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return x


def _plan(body: str) -> ast.Plan:
    return parse(f"memplan 1\nmodule h.* {{ {body} }}\n", "saving.memplan")


def test_save_parses_formats_and_round_trips():
    plan = _plan("checkpoint save = [matmul, attention]")
    assert plan.rules[0].policies[0].save == ("matmul", "attention")
    text = format_plan(plan)
    assert "checkpoint save = [matmul, attention]" in text
    assert parse(text, "again.memplan") == plan


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("checkpoint save = [matmull]", "MP212"),
        ("checkpoint save = [relu]", "MP212"),
        ("checkpoint save = [matmul, matmul]", "MP213"),
        ("checkpoint save = []", "MP213"),
        ("checkpoint save = 3", "MP202"),
    ],
)
def test_bad_save_lists_are_refused(body, code):
    with pytest.raises(PlanError) as caught:
        _plan(body)
    assert caught.value.codes == [code]
    assert "saving.memplan:2:" in str(caught.value)


def test_save_with_memoplans_own_region_is_refused():
    model = _Net()
    text = "memplan 1\nmodule h.* {\n  checkpoint save = [matmul]\n  compress input = auto\n}\n"
    with pytest.raises(PlanError) as caught:
        memoplan.resolve(parse(text, "x.memplan"), model)
    assert "MP325" in caught.value.codes


def test_every_family_names_real_aten_ops():
    for family in OP_FAMILIES:
        assert saved_ops((family,)), family
    assert set(OP_FAMILIES) == set(ast.SAVEABLE_OPS)
    with pytest.raises(ValueError):
        saved_ops(("relu",))


@pytest.fixture(scope="module")
def plain_checkpoint():
    """The model, its example and the verification of a plain checkpoint of its blocks, which every
    ``save`` list below is compared with (verified once: the tests only read it)."""
    torch.manual_seed(0)
    model, example = _Net(), Example((torch.randn(512, 64),))
    return model, example, verify(model, _plan("checkpoint"), example)


@pytest.mark.parametrize("ops", ["matmul", "matmul, attention", "conv", "attention, conv, matmul"])
@pytest.mark.slow
def test_saving_is_bit_equal_and_keeps_more_than_a_plain_checkpoint(ops, plain_checkpoint):
    model, example, plain = plain_checkpoint
    saving = verify(model, _plan(f"checkpoint save = [{ops}]"), example)
    assert saving.equivalent and saving.exact, saving.checks
    # It keeps the saved ops' outputs: between a plain checkpoint and no plan at all.
    assert plain.planned.peak_bytes <= saving.planned.peak_bytes <= saving.unplanned.peak_bytes
    if "matmul" in ops:
        assert saving.planned.peak_bytes > plain.planned.peak_bytes


def test_saving_on_segments_is_bit_equal():
    torch.manual_seed(0)
    wrapped = nn.Sequential(nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.GELU())]))
    text = "memplan 1\nmodule 0 { checkpoint segments = 3 save = [matmul] }\n"
    report = verify(wrapped, parse(text, "x.memplan"), Example((torch.randn(256, 64),)))
    assert report.equivalent and report.exact, report.checks
    code = emit(memoplan.resolve(parse(text, "x.memplan"), wrapped)).files[0].text
    assert "save=('matmul',)" in code and "run_segmented" in code


class _PeakInTheStem(nn.Module):
    """A wide stem whose backward sets the peak, after the blocks' backward freed what they kept:
    saving the blocks' matmuls then costs nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(32, 4096), nn.Tanh(), nn.Linear(4096, 32))
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32)) for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


@pytest.mark.slow
def test_the_save_level_keeps_op_saving_where_the_peak_does_not_rise():
    from memoplan.planner.config import Level, RefineOptions
    from memoplan.planner.search.refine import measure_plan, refine

    torch.manual_seed(0)
    model, example = _PeakInTheStem(), Example((torch.randn(64, 32),))
    plan = parse(
        "memplan 1\nmodule blocks.0 { checkpoint }\nmodule blocks.1 { checkpoint }\nmodule blocks.2 { checkpoint }\n",
        "p",
    )
    result = refine(model, example, plan, RefineOptions(levels=(Level.SAVE,)), progress=False)
    assert result.kept and result.after <= result.before == measure_plan(model, example, plan)
    text = format_plan(result.plan)
    assert text.count("checkpoint save = [matmul, attention]") == 3 and "# refine: save = [matmul, attention]" in text
    report = verify(model, result.plan, example)
    assert report.equivalent and report.exact, report.checks
