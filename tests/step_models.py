"""A narrow Llama for the step tests (tests/test_step.py, tests/_step_worker.py): transformers'
``LlamaForCausalLM`` with labels, so its output carries its own loss.

``build(dtype)``: the model, built for real, in ``dtype`` (bfloat16 by default); ``meta()``:
the same model built on the meta device; ``example(rank)``: ``input_ids`` and ``labels`` of
``BATCH`` sequences of ``TOKENS`` tokens.  The issue's size is hidden 1024, 4 layers, batch
2 x 1024 (``STEP_MODELS_SIZE=full``); the tests use a smaller one so they stay fast on 2 cores.
"""

from __future__ import annotations

import os

import torch

SIZES = {
    "small": {
        "hidden": 128,
        "layers": 2,
        "heads": 4,
        "kv": 2,
        "intermediate": 352,
        "vocab": 512,
        "batch": 2,
        "tokens": 128,
    },
    # FSDP2's test (tests/_step_worker.py): activations outweigh the two blocks FSDP2 may hold gathered
    "fsdp": {
        "hidden": 128,
        "layers": 2,
        "heads": 4,
        "kv": 2,
        "intermediate": 352,
        "vocab": 512,
        "batch": 2,
        "tokens": 512,
    },
    "full": {
        "hidden": 1024,
        "layers": 4,
        "heads": 16,
        "kv": 4,
        "intermediate": 2816,
        "vocab": 8192,
        "batch": 2,
        "tokens": 1024,
    },
}


def size() -> dict:
    return SIZES[os.environ.get("STEP_MODELS_SIZE", "small")]


def config():
    from transformers import LlamaConfig

    s = size()
    return LlamaConfig(
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        vocab_size=s["vocab"],
        max_position_embeddings=max(2048, s["tokens"]),
        attn_implementation="sdpa",
    )


def build(dtype: torch.dtype = torch.bfloat16):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(config()).to(dtype)


def build_fp32():
    return build(torch.float32)


def meta(dtype: torch.dtype = torch.bfloat16):
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(config()).to(dtype)


def fake(dtype: torch.dtype = torch.bfloat16):
    """The same model built under ``FakeTensorMode``: nothing of its weights allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LlamaForCausalLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in that dtype: converting fake parameters is refused
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return LlamaForCausalLM(config())
    finally:
        torch.set_default_dtype(default)


def example(rank: int = 0):
    from memoplan.specs import Example

    s = size()
    g = torch.Generator().manual_seed(10 + rank)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["tokens"]), generator=g)
    return Example((), {"input_ids": ids, "labels": ids})
