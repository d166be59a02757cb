"""In training, a model that returns a transformers cache its planned regions write is told so.

GPT-2 and Llama with their default ``use_cache=True`` pass a ``DynamicCache`` through every
layer and return it: the layers' keys and values stay alive with the output, for nothing in
training.  ``check`` (with an example), ``verify`` and ``plan`` warn MP327 at the first region
rule with the bytes the cache holds; ``apply`` warns MP416 through ``warnings`` at the first
region that writes it.  ``use_cache=False`` (or an encoder such as BERT) gives neither.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch

import memoplan
from memoplan.diagnostics import Severity
from memoplan.resolver import resolve
from memoplan.resolver.caches import returned_cache
from memoplan.runtime import argstate
from memoplan.syntax import parse
from tests import real_models
from tests._cli import run, write

pytest.importorskip("transformers")

EXAMPLE = torch.randint(
    0, real_models.VOCAB, (real_models.BATCH, real_models.SEQ), generator=torch.Generator().manual_seed(0)
)
# batch, key-value heads, tokens, head width, float32; keys and values; two layers
GPT2_CACHE = real_models.BATCH * real_models.HEADS * real_models.SEQ * (real_models.D // real_models.HEADS) * 4 * 2 * 2
LLAMA_CACHE = GPT2_CACHE // 2  # two key-value heads of four


@pytest.mark.parametrize(
    ("name", "selector", "held"),
    [("gpt2", "transformer.h.*", GPT2_CACHE), ("llama", "model.layers.*", LLAMA_CACHE)],
)
def test_a_returned_cache_the_regions_write_is_warned_with_its_bytes(name, selector, held):
    model = getattr(real_models, name)()
    plan = parse(f"memplan 1\n# layers\nmodule {selector} {{ checkpoint }}\n")
    before = copy.deepcopy(model.state_dict())
    (warning,) = returned_cache(resolve(plan, model), model, (EXAMPLE,), {}, plan)
    assert warning.code == "MP327" and warning.severity is Severity.WARNING
    assert warning.span.line == 3  # the region's rule
    assert f"it holds {held} B" in warning.message and "1 more region" in warning.message
    assert "use_cache=False" in warning.help
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # ran on a copy
    model.config.use_cache = False
    assert returned_cache(resolve(plan, model), model, (EXAMPLE,), {}, plan) == []
    model.config.use_cache = True
    model.eval()  # not training: nothing to say
    assert returned_cache(resolve(plan, model), model, (EXAMPLE,), {}, plan) == []


def test_an_encoder_that_returns_no_cache_is_not_warned():
    model = real_models.bert()
    plan = parse("memplan 1\nmodule bert.encoder.layer.* { checkpoint }\n")
    assert returned_cache(resolve(plan, model), model, (EXAMPLE,), {}, plan) == []


def test_apply_warns_once_at_the_first_region_that_writes_the_cache(monkeypatch):
    monkeypatch.setattr(argstate, "_CACHE_WARNED", [False])
    model = memoplan.apply(real_models.gpt2(), "memplan 1\nmodule transformer.h.* { checkpoint }\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model(EXAMPLE).logits.sum().backward()
    (message,) = [str(w.message) for w in caught if "memoplan: MP" in str(w.message)]
    assert message.startswith("memoplan: MP416: transformer.h.0: in training")
    assert f"holds {GPT2_CACHE // 2} B of keys and values after this region" in message  # one layer's
    model.config.use_cache = False
    monkeypatch.setattr(argstate, "_CACHE_WARNED", [False])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(EXAMPLE).logits.sum().backward()
    assert [str(w.message) for w in caught if "memoplan: MP" in str(w.message)] == []


def test_check_and_verify_print_the_warning_at_the_rule(tmp_path, capsys):
    models = Path(real_models.__file__).resolve()
    plan = write(
        tmp_path,
        "gpt2.memplan",
        f'memplan 1\nmodel "{models}:gpt2"\nexample randint(2, 16, high=128)\nmodule transformer.h.* {{ checkpoint }}\n',
    )
    code, _, err = run(capsys, "check", plan)
    assert code == 0
    assert "gpt2.memplan:4:1: warning[MP327]: in training, the model returns a DynamicCache" in err
    code, out, err = run(capsys, "verify", plan)
    assert code == 0 and "verdict: EQUIVALENT" in out
    assert "warning[MP327]" in err


@pytest.mark.slow
def test_plan_warns_for_the_plan_it_writes(tmp_path, capsys):
    models = Path(real_models.__file__).resolve()
    out = tmp_path / "out.memplan"
    code, _, err = run(
        capsys,
        "plan",
        "--model",
        f"{models}:gpt2",
        "--example",
        "randint(2, 16, high=128)",
        "--budget",
        "60% hint",
        "-o",
        out,
    )
    assert code == 0 and "module transformer.h" in out.read_text()
    assert "warning[MP327]: in training, the model returns a DynamicCache" in err
