"""`plan --profile FILE` plans only over a profile of the step being planned (MP604): the profile
records its step (loss, autocast, optimizer, master weights, shards, mixed precision), the
parameters' dtypes and where it ran; `memoplan.planner.profiling.stamp` compares them with the plan's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import memoplan
from memoplan.cli import main
from memoplan.examples import mlp
from memoplan.planner.profiling.profile import Profile
from memoplan.planner.profiling.stamp import differences, parameter_dtypes, stamped, step_record
from memoplan.syntax.blocks import StepConfig

TRANSFORMER = ["--model", "memoplan.examples.transformer:build", "--example", "randint(4, 32, high=100)"]


@pytest.fixture(scope="module")
def mlp_profile() -> Profile:
    from memoplan.planner.profiling.estimate import take_profile

    torch.manual_seed(0)
    return take_profile(mlp.build(), mlp.example(), method="estimated")


def test_a_profile_records_the_step_it_was_taken_for(mlp_profile):
    assert mlp_profile.step == step_record(None) == step_record(StepConfig())
    assert "loss auto" in mlp_profile.step and "shards 1" in mlp_profile.step
    assert mlp_profile.parameter_dtypes == "float32"
    again = Profile.from_json(mlp_profile.to_json())  # the record survives the file
    assert (again.step, again.parameter_dtypes) == (mlp_profile.step, mlp_profile.parameter_dtypes)


def test_every_difference_of_the_step_is_named(mlp_profile):
    model, dtypes = mlp.build(), {m.name: m.dtype for m in mlp_profile.inputs}
    assert differences(mlp_profile, model, None, dtypes, "cpu") == []
    other = StepConfig(loss="sum", autocast="bf16", optimizer="adamw", shards=2)
    found = differences(mlp_profile, model, other, dtypes, "cpu")
    assert [f.split(":")[0] for f in found] == ["loss", "autocast", "optimizer", "shards"]
    assert "the profile's auto, the plan's sum" in found[0]
    assert differences(mlp_profile, model.to(torch.bfloat16), None, dtypes, "cpu") == [
        "parameter dtypes: the profile's float32, the model's bfloat16"
    ]
    (name,) = dtypes
    assert differences(mlp_profile, mlp.build(), None, {name: "float16"}, "cpu") == [
        f"example {name}: the profile's float32, the example's float16"
    ]
    assert differences(mlp_profile, mlp.build(), None, dtypes, "cuda") == ["device: the profile's cpu, the plan's cuda"]
    # A profile written before the record existed is not checked.
    assert differences(replace(mlp_profile, step="", parameter_dtypes=""), model, other, dtypes, "cuda") == []
    assert stamped(mlp_profile, model, other).step == step_record(other)
    assert parameter_dtypes(model.to(torch.bfloat16)) == "bfloat16"


def test_plan_refuses_a_profile_of_another_step(transformer_profile, tmp_path, capsys):
    out = tmp_path / "plan.memplan"
    code = main(
        ["plan", *TRANSFORMER, "--budget", "80%", "--profile", transformer_profile, "--loss", "sum", "-o", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 1 and "MP604" in err and "loss: the profile's auto, the plan's sum" in err
    assert not out.exists()
    code = main(
        ["plan", *TRANSFORMER, "--budget", "80%", "--profile", transformer_profile, "--shards", "2", "-o", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 1 and "MP604" in err and "shards: the profile's 1, the plan's 2" in err
    assert not out.exists()


def test_a_profile_without_a_record_still_plans(transformer_profile, tmp_path, capsys):
    data = json.loads(open(transformer_profile, encoding="utf-8").read())
    del data["step"], data["parameter_dtypes"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "plan.memplan"
    assert main(["plan", *TRANSFORMER, "--budget", "80%", "--profile", str(old), "-o", str(out)]) == 0
    assert out.exists()


def test_the_api_refuses_a_profile_of_another_step(mlp_profile):
    with pytest.raises(memoplan.PlanError) as caught:
        memoplan.plan(mlp.build(), mlp.example(), "80%", profile=mlp_profile, step=StepConfig(loss="sum"))
    assert caught.value.codes == ["MP604"]
