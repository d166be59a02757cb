"""Small real models for tests/test_real_models.py: HF GPT-2, BERT and Llama from tiny configs
(no weights, no hub) and a SpikingJelly network.  Plans name them by path,
``tests/real_models.py:gpt2``; every factory takes no arguments.

The transformers models keep their default configuration otherwise (GPT-2 and Llama
return a ``DynamicCache`` in ``past_key_values``: ``use_cache=True``) and the default
attention implementation (``sdpa``).  Dropout is on where the config has it, so the
RNG replay of checkpointing is exercised.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 128
D = 32
LAYERS = 2
HEADS = 4
SEQ = 16
BATCH = 2


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=D, n_layer=LAYERS, n_head=HEADS, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=2 * D,
        max_position_embeddings=SEQ,
    )
    return BertForMaskedLM(config)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=2 * D,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return LlamaForCausalLM(config)


class SpikingNet(nn.Module):
    """Conv -> BN -> LIF twice over [T, B, C, H, W] in SpikingJelly's multi-step mode, then a head."""

    def __init__(self, channels: int = 4, classes: int = 10) -> None:
        super().__init__()
        from spikingjelly.activation_based import functional, layer, neuron, surrogate

        def block(cin: int) -> nn.Sequential:
            return nn.Sequential(
                layer.Conv2d(cin, channels, 3, padding=1, bias=False),
                layer.BatchNorm2d(channels),
                neuron.LIFNode(surrogate_function=surrogate.ATan(), detach_reset=True),
            )

        self.features = nn.Sequential(block(1), block(channels))
        self.head = nn.Sequential(layer.Flatten(), layer.Linear(channels * 8 * 8, classes))
        functional.set_step_mode(self, "m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).mean(0)


def spiking() -> nn.Module:
    return SpikingNet()
