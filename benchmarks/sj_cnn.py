"""A SpikingJelly CNN that is not one of memoplan's examples: 4 blocks of ``layer.Conv2d`` ->
``neuron.LIFNode`` -> ``layer.MaxPool2d``, multi-step, T = 8, binary input (4 x 2 x 64 x 64).

    .venv/bin/python -m memoplan plan --model benchmarks/sj_cnn.py:build \\
        --example benchmarks/sj_cnn.py:example --budget 40% -o sj.memplan

The first block holds half the activations, so checkpointing the blocks cannot lower the peak
(its replay alone reaches it): chunking time does.
"""

import torch
from spikingjelly.activation_based import functional, layer, neuron, surrogate
from torch import nn

T = 8


class SJCNN(nn.Module):
    def __init__(self, channels=(16, 32, 32, 64), classes=10):
        super().__init__()
        blocks, cin = [], 2
        for c in channels:
            blocks.append(
                nn.Sequential(
                    layer.Conv2d(cin, c, 3, padding=1, bias=False),
                    neuron.LIFNode(surrogate_function=surrogate.ATan(), detach_reset=True),
                    layer.MaxPool2d(2),
                )
            )
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(layer.Flatten(), layer.Linear(cin * 4 * 4, classes))
        functional.set_step_mode(self, "m")

    def forward(self, x):
        return self.head(self.blocks(x)).mean(0)


def build():
    torch.manual_seed(0)
    return SJCNN()


def example():
    g = torch.Generator().manual_seed(1)
    return ((torch.rand(T, 4, 2, 64, 64, generator=g) < 0.2).float(),)
