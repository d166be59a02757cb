"""Small Llama models built on the meta device, for real, and under a FakeTensorMode
(tests/planner/test_meta.py; a factory file the command line loads by path)."""

from __future__ import annotations

import torch
from torch import nn

TOKENS = 128
VOCAB = 256


def config(layers: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=TOKENS,
        attn_implementation="sdpa",
        use_cache=False,
    )


def _built(context, layers: int = 2) -> nn.Module:
    from transformers import LlamaForCausalLM

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16, as large models are
    try:
        with context:
            return LlamaForCausalLM(config(layers))
    finally:
        torch.set_default_dtype(old)


def meta() -> nn.Module:
    """The model on the meta device: parameters and buffers with shapes and dtypes, no storage."""
    return _built(torch.device("meta"))


def real() -> nn.Module:
    """The same model built for real (seeded)."""
    torch.manual_seed(0)
    return _built(torch.device("cpu"))


def fake() -> nn.Module:
    """The same model built under a FakeTensorMode of its own (one way users build large models)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return _built(FakeTensorMode(allow_non_fake_inputs=True), layers=1)


def example() -> tuple[torch.Tensor, ...]:
    """Token ids on the CPU, with real values."""
    return (torch.randint(0, VOCAB, (2, TOKENS), generator=torch.Generator().manual_seed(0)),)


def meta_example() -> tuple[torch.Tensor, ...]:
    """Token ids on the meta device (no values)."""
    return (torch.zeros(2, TOKENS, dtype=torch.long, device="meta"),)


def too_big() -> nn.Module:
    """A factory that runs out of memory building its model (as the CPU allocator says it)."""
    raise RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 137438953472 bytes. Error code 12 (Cannot allocate memory)"
    )
