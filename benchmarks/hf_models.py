"""The Hugging Face models of issue 16 as memoplan specs (random weights, nothing downloaded).

``benchmarks/hf_models.py:gpt2`` is ``GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4,
vocab_size=512, n_positions=128))`` in its default configuration (dropout 0.1, ``use_cache=True``);
``:bert`` a ``BertForMaskedLM`` of the same size.  Their example is ``randint(4, 128, high=512)``.
"""

from __future__ import annotations

from torch import nn


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=128)
    return GPT2LMHeadModel(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=128,
    )
    return BertForMaskedLM(config)
