"""What torch.compile captures of a planned model: graphs, ops (inside checkpoint subgraphs too) and breaks.

    .venv/bin/python benchmarks/compile_capture.py

For HF GPT-2 (``tests/real_models.py:gpt2``, default configuration) and the bundled transformer,
unplanned, with a plain ``checkpoint`` over the blocks and with a ``dtr`` block, one training step
under ``torch.compile(backend=CountingBackend("aot_eager"))`` (:mod:`memoplan.graphs`).
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import real_models  # noqa: E402

import memoplan  # noqa: E402
from memoplan.examples import transformer  # noqa: E402
from memoplan.graphs import CountingBackend  # noqa: E402

PLANS = {
    "checkpoint": "memplan 1\nmodule {blocks} {{ checkpoint }}\n",
    "dtr": "memplan 1\ndtr {{ eviction_threshold = 256 KiB }}\n",
}


def capture(model: torch.nn.Module, x: torch.Tensor) -> str:
    torch._dynamo.reset()
    backend = CountingBackend()
    with backend:
        out = torch.compile(model, backend=backend)(x)
        getattr(out, "logits", out).float().sum().backward()
    return backend.capture.describe()


def main() -> int:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    models = [
        ("HF GPT-2 (tests/real_models.py:gpt2)", real_models.gpt2(), torch.randint(0, 128, (2, 16)), "transformer.h.*"),
        ("bundled transformer", transformer.build(), transformer.example()[0], "blocks.*"),
    ]
    print("| model | plan | what Dynamo captured |\n| --- | --- | --- |")
    for name, model, x, blocks in models:
        print(f"| {name} | none | {capture(copy.deepcopy(model), x)} |")
        for plan, text in PLANS.items():
            planned = memoplan.apply(copy.deepcopy(model), text.format(blocks=blocks))
            print(f"| {name} | {plan} | {capture(planned, x)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
