"""`--shards` and `--optimizer` without torch.distributed: what one rank's estimate counts, the
default read from `WORLD_SIZE`, and `--method measured` of a sharded step refused (MP603)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from memoplan.cli import main
from memoplan.planner.profiling.estimate import fake_step
from memoplan.planner.profiling.schema import Profile
from memoplan.planner.profiling.shard import (
    SHARDS,
    default_shards,
    gathered_bytes,
    optimizer_state_bytes,
    resident_bytes,
)
from memoplan.specs import Example

MLP = ["--model", "memoplan.examples.mlp:build", "--example", "randn(64, 512)"]


def _blocks(depth: int = 6, width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(depth)))


def test_world_size_is_the_default(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert default_shards() == 1
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert default_shards() == 4
    monkeypatch.setenv("WORLD_SIZE", "zero")
    assert default_shards() == 1


def test_optimizer_state_and_what_a_rank_holds():
    model = _blocks()
    numel = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(model, "none", 2) == optimizer_state_bytes(model, "sgd", 2) == 0
    assert optimizer_state_bytes(model, "momentum", 1) == 4 * numel
    assert optimizer_state_bytes(model, "adam", 2) == 4 * numel  # 2 fp32 states, half on each rank
    assert resident_bytes(model, "adamw", 4) == 3 * numel  # (4 B of parameter + 8 B of state) / 4 ranks
    with pytest.raises(ValueError, match="optimizer must be one of"):
        optimizer_state_bytes(model, "lion")


def test_gradients_count_one_shard_and_two_blocks_are_gathered_whole():
    model, example = _blocks(), Example((torch.randn(8, 256),))
    block = 256 * 256 * 4 + 256 * 4
    assert gathered_bytes(model, 1) == 0 and gathered_bytes(model, 2) == 2 * block  # 2 blocks, all-gathered whole
    whole = fake_step(model, example, torch.device("cpu")).peak_bytes
    token = SHARDS.set(2)
    try:
        sharded = fake_step(model, example, torch.device("cpu")).peak_bytes
    finally:
        SHARDS.reset(token)
    grads = sum(p.numel() * 4 for p in model.parameters())
    # The peak is the step's end, every gradient live: half of each per rank, but the last
    # block's (the first layer's), whole until it is reduce-scattered; plus the gathered blocks.
    assert sharded == whole - grads // 2 + block // 2 + 2 * block


def test_profile_with_shards_writes_one_ranks_estimate(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    assert main(["profile", *MLP, "--shards", "2", "--optimizer", "adam", "--repeats", "1", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["shards"] == 2 and data["method"] == "estimated" and data["optimizer_state_bytes"] > 0
    assert Profile.load(out).shards == 2
    printed = capsys.readouterr()
    assert "one of 2 FSDP2 ranks" in printed.err and "per rank of 2 FSDP2 ranks; optimizer state" in printed.out


def test_old_profiles_read_as_one_unsharded_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMOPLAN_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    assert main(["profile", *MLP, "--repeats", "1", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    del data["shards"], data["optimizer_state_bytes"]
    prof = Profile.from_dict(data)
    assert (prof.shards, prof.optimizer_state_bytes) == (1, 0)


def test_measured_sharded_step_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "p.json"
    assert main(["profile", *MLP, "--method", "measured", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "MP603" in err and "--shards 1" in err and not out.exists()
