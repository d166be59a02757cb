"""Resolver rules for the spiking-network path: chunking, state, split, impl."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import memoplan
from memoplan.neurons import LIF


class Block(nn.Module):
    def __init__(self, norm: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.norm = nn.BatchNorm2d(2) if norm else nn.Identity()
        self.lif = LIF()

    def forward(self, x):
        steps, batch = x.shape[:2]
        return self.lif(self.norm(self.conv(x.flatten(0, 1))).unflatten(0, (steps, batch)))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = nn.MultiheadAttention(4, 1)

    def forward(self, x):
        return self.mix(x, x, x)[0]


class WholeSequence(nn.Module):
    memoplan_mixes_time = True

    def forward(self, x):
        return x.cumsum(0)


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Module()
    net.plain = Block()
    net.normed = Block(norm=True)
    net.attn = Attention()
    net.whole = WholeSequence()
    net.seq = nn.Sequential(nn.Conv2d(2, 2, 1), nn.Tanh(), LIF())
    net.synced = nn.Sequential(nn.Conv2d(2, 2, 1), nn.SyncBatchNorm(2))
    return net


def errors(body: str) -> list[tuple[str, int]]:
    with pytest.raises(memoplan.PlanError) as caught:
        memoplan.resolve(memoplan.parse("memplan 1\n" + body), model())
    return [(d.code, d.span.line if d.span else 0) for d in caught.value.errors]


def resolved(body: str):
    return memoplan.resolve(memoplan.parse("memplan 1\n" + body), model())


STATE = "module class LIF { state = functional }\n"


def test_chunking_a_block_without_batchnorm_is_accepted_and_threads_its_neuron():
    plan = resolved(STATE + "module plain { temporal_chunk 4 dim 0 }\n")
    module = plan.module("plain")
    assert module.temporal_chunk.chunks == 4 and module.region_state == ("lif",)


@pytest.mark.parametrize(
    "path, why",
    [("synced", "SyncBatchNorm `synced.1`"), ("attn", "mixes time steps"), ("whole", "whole sequence")],
)
def test_chunking_over_time_mixing_modules_is_refused(path, why):
    with pytest.raises(memoplan.PlanError) as caught:
        resolved(STATE + f"module {path} {{ temporal_chunk 2 dim 0 }}\n")
    assert caught.value.codes == ["MP304"]
    assert why in str(caught.value)


def test_chunking_over_batchnorm_is_accepted():
    """BatchNorm inside chunks normalises with the whole batch's statistics (runtime/batchnorm.py)."""
    plan = resolved(STATE + "module normed { temporal_chunk 2 dim 0 }\n")
    assert plan.module("normed").temporal_chunk.chunks == 2


def test_allow_nonequivalent_opts_in():
    plan = resolved(STATE + "module attn { temporal_chunk 2 dim 0 allow_nonequivalent = true }\n")
    assert plan.module("attn").temporal_chunk.allow_nonequivalent


def test_a_stateful_module_inside_a_region_must_be_marked():
    assert errors("module plain { checkpoint }\n") == [("MP314", 2)]
    assert errors("module seq { temporal_chunk 2 dim 0 }\n") == [("MP314", 2)]
    assert resolved(STATE + "module plain { checkpoint }\n").module("plain").region_state == ("lif",)


def test_state_on_a_module_without_the_protocol_is_refused():
    assert errors("module plain.conv { state = functional }\n") == [("MP315", 2)]


def test_chunks_with_segments_or_split_are_refused():
    assert ("MP316", 3) in errors(STATE + "module seq { checkpoint segments = 2; temporal_chunk 2 dim 0 }\n")


def test_impl_torch_cannot_carry_state_or_compress():
    assert errors(STATE + "module plain { checkpoint impl = torch }\n") == [("MP317", 3)]
    assert errors("module seq.0 { checkpoint impl = torch; compress input = bit }\n") == [("MP317", 2)]


def test_keep_and_temporal_chunk_from_different_rules_contradict():
    body = "module plain { keep }\nmodule * : Block not normed { temporal_chunk 2 dim 0 }\n"
    assert errors(STATE + body) == [("MP207", 4)]


def test_split_starts_a_region_at_each_named_child():
    plan = resolved(STATE + "module seq { checkpoint split = [2] }\n")
    assert plan.module("seq").checkpoint.groups == (("0", "1"), ("2",))
    assert plan.module("seq").region_state == ("2",)


@pytest.mark.parametrize(
    "split, code",
    [("[lfi]", "MP319"), ("[0]", "MP319"), ("[2, 1]", "MP319")],
)
def test_split_names_must_be_children_in_order(split, code):
    assert errors(STATE + f"module seq {{ checkpoint split = {split} }}\n") == [(code, 3)]


def test_split_needs_a_sequential():
    assert errors(STATE + "module plain { checkpoint split = [lif] }\n") == [("MP306", 3)]


def test_compress_with_temporal_chunk_alone_is_accepted():
    plan = resolved(STATE + "module plain { temporal_chunk 2 dim 0; compress input = bit }\n")
    assert plan.module("plain").compress is not None


def test_explain_says_batchnorm_in_chunks_takes_whole_batch_statistics():
    rows = {
        r.path: r
        for r in memoplan.explain(
            memoplan.parse("memplan 1\n" + STATE + "module normed { temporal_chunk 2 dim 0 }\n"), model()
        )
    }
    ((what, why),) = rows["normed.norm"].decisions
    assert what == "whole-batch statistics" and "time chunks of `normed` (line 3)" in why
    assert rows["normed.conv"].decisions == ()  # other layers simply run chunk by chunk
    assert rows["plain.conv"].decisions == ()


# ---------------------------------------------------------------- regions inside time chunks


def test_a_region_inside_time_chunks_needs_nested():
    # Each chunk is a checkpointed region already: another region inside recomputes twice.
    for inner in ("module normed.conv { checkpoint }\n", "module normed.lif { temporal_chunk 2 dim 0 }\n"):
        body = STATE + "module normed { temporal_chunk 4 dim 0 }\n" + inner
        assert errors(body) == [("MP305", 4)], inner
        with pytest.raises(memoplan.PlanError) as caught:
            resolved(body)
        assert "inside the time chunks of `normed`" in str(caught.value)
        # `nested = true` is offered only where the inner rule is a checkpoint, which can take it.
        assert ("nested = true" in str(caught.value)) == ("checkpoint" in inner)


def test_a_nested_region_without_batchnorm_inside_time_chunks_is_accepted():
    plan = resolved(
        STATE + "module normed { temporal_chunk 4 dim 0 }\nmodule normed.conv { checkpoint nested = true }\n"
    )
    assert plan.module("normed.conv") is not None


def test_a_nested_region_holding_batchnorm_inside_time_chunks_is_refused():
    # The chunks normalise with every time step's statistics; the inner region's own recompute
    # in backward would not see them (its gradients came out about 1e-3 off, its running
    # statistics 0.18 of their size, before this was refused).
    outer = net_with_normed_pair()
    plan = memoplan.parse(
        "memplan 1\n" + STATE + "module pair { temporal_chunk 2 dim 0 }\nmodule pair.1 { checkpoint nested = true }\n"
    )
    with pytest.raises(memoplan.PlanError) as caught:
        memoplan.resolve(plan, outer)
    assert caught.value.codes == ["MP320"]
    assert "holds BatchNorm `pair.1.norm`" in str(caught.value)
    # The same inner rule on the block without BatchNorm is accepted.
    plan = memoplan.parse(
        "memplan 1\n" + STATE + "module pair { temporal_chunk 2 dim 0 }\nmodule pair.0 { checkpoint nested = true }\n"
    )
    assert memoplan.resolve(plan, outer).module("pair.0") is not None


def net_with_normed_pair() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Module()
    net.pair = nn.Sequential(Block(), Block(norm=True))
    return net
