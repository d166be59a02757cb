"""The codec registry: one definition per codec (memoplan/enums.py for the language,
memoplan/runtime/codecs.py for the runtime), and everything else derived from it."""

from __future__ import annotations

import pytest
import torch
from _paths import ROOT
from torch import nn

import memoplan
from memoplan import enums
from memoplan.codegen import emit
from memoplan.diagnostics import PlanError
from memoplan.enums import Codec, CodecSpec
from memoplan.lsp import language
from memoplan.lsp.completion import completions
from memoplan.runtime import codec_impls, codecs
from memoplan.syntax import ast, format_plan, parse


def test_the_language_names_exactly_the_registered_codecs():
    assert [c.value for c in ast.Codec] == [s.name for s in enums.codec_specs()]
    assert ast.Codec is Codec and Codec("int8") is Codec.INT8 and Codec.INT8.lossy
    assert language.CODECS == tuple(s.name for s in enums.codec_specs())
    assert language.LOSSY_CODECS == ("int8",)


def test_every_codec_of_the_language_has_a_runtime_implementation():
    for codec in Codec:
        assert codecs.runs(codec), codec
    assert codecs.registered() == tuple(s.name for s in enums.codec_specs() if not s.chooses)
    assert codecs.CODECS == codecs.registered()
    assert codecs.LOSSLESS == ("none", "bool", "uint8", "bit", "sparse")


def test_autos_order_comes_from_the_specs():
    assert enums.widening_order() == ("bit", "bool", "uint8", "sparse", "none")
    assert codecs.widen("bit", "uint8") == "uint8" and codecs.widen("none", "bool") == "none"
    # ties go to the cheapest to encode: an all-zero bool tensor fits none, bit, bool, uint8
    # in sizes 8, 1, 8, 8 and sparse in 0 bytes
    assert codecs.choose(torch.zeros(8, dtype=torch.bool)) == "sparse"
    assert codecs.choose(torch.zeros(0)) == "none"  # every size 0: the cheapest


@pytest.mark.parametrize("path", sorted(enums.CODEC_TABLES))
def test_the_codec_tables_are_generated_from_the_registry(path):
    text = (ROOT / path).read_text(encoding="utf-8")
    begin, end = text.index(enums.BEGIN), text.index(enums.END) + len(enums.END) + 1
    assert text[begin:end] == enums.codec_block(path), "regenerate them: python -m memoplan.enums"


def test_a_codec_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        enums.register_codec(Codec.BIT.spec)
    with pytest.raises(ValueError, match="already has an implementation"):
        codecs.register(codecs.RuntimeCodec(Codec.BIT.spec, codec_impls.encode_bit, codec_impls.decode_bit, len))
    with pytest.raises(ValueError, match="lower-case word"):
        enums.register_codec(CodecSpec("Bad Name", True, "", ""))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        return self.block(x)


def _plan(codec: str) -> str:
    return f"memplan 1\n\nmodule block {{\n    checkpoint\n    compress input = {codec}\n}}\n"


def test_a_codec_the_runtime_lacks_cannot_be_named_in_a_plan():
    enums.register_codec(CodecSpec("ghost", True, "anything", "a codec with no encoder"))
    try:
        plan = parse(_plan("ghost"))  # the language knows it ...
        with pytest.raises(PlanError) as caught:  # ... the runtime does not: refused when resolving
            memoplan.resolve(plan, _Net())
        assert [d.code for d in caught.value.diagnostics] == ["MP214"]
        assert "ghost" in str(caught.value) and "`bit`" in caught.value.diagnostics[0].help
    finally:
        enums.unregister_codec("ghost")
    with pytest.raises(PlanError) as caught:
        parse(_plan("ghost"))
    assert caught.value.diagnostics[0].code == "MP204"


def _copy_encode(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (flat.clone(),)


def _copy_decode(data, numel, dtype, device) -> torch.Tensor:
    return data[0].clone()


def _copy_bytes(numel, dtype, nnz, binary) -> int:
    return numel * torch.empty((), dtype=dtype).element_size()


@pytest.fixture
def copy_codec():
    """A throwaway codec, added through the runtime's registry only."""
    spec = CodecSpec("copy", True, "anything", "anything, as a copy", "`dtype[numel]`", "`numel * itemsize`")
    codecs.register(codecs.RuntimeCodec(spec, _copy_encode, _copy_decode, _copy_bytes))
    yield Codec("copy")
    codecs.unregister("copy")


def test_a_codec_added_through_the_registry_works_at_every_stage(copy_codec):
    text = _plan("copy")
    plan = parse(text)  # parse
    assert plan.rules[0].policies[1].codec is copy_codec
    assert format_plan(plan) == text  # format
    model = _Net()
    resolved = memoplan.resolve(plan, model)  # resolve
    assert resolved.module("block").compress.codec is copy_codec
    assert "codec='copy'" in emit(resolved).main.text  # emit
    labels = [item.label for item in completions(text, text.index("= copy") + 2, None)]
    assert labels[-1] == "copy"  # LSP completion
    assert "`copy`" in enums.codec_table(("lossless", "about"))  # the reference's table
    assert codecs.estimate_nbytes("copy", 10, torch.float32) == 40
    x = torch.randn(3, 4)
    assert torch.equal(codecs.decode(codecs.encode(x, "copy")), x)
    # and it runs: gradients as without a plan
    inputs = torch.randn(2, 4, requires_grad=True)
    reference = _Net()
    reference.load_state_dict(model.state_dict())
    memoplan.apply(model, plan)
    model(inputs).sum().backward()
    expected = inputs.grad.clone()
    inputs.grad = None
    reference(inputs).sum().backward()
    assert torch.allclose(inputs.grad, expected)
