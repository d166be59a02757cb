"""What is alive at the peak of one training step: every live storage, by where it was made.

    .venv/bin/python benchmarks/peak_anatomy.py [--plan PLAN.memplan] [--no-cache] [--top 25]

Builds the GPT-2 of issue 16 (``transformers.GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128,
n_head=4, vocab_size=512, n_positions=128))``, default configuration otherwise: dropout 0.1,
``use_cache=True``), input ids ``randint(4, 128, high=512)`` after ``torch.manual_seed(0)``,
and runs one training step with memoplan's default loss (the sum of every floating-point
output) under memoplan's live-storage meter (:mod:`memoplan.measure`), with the plan applied
when ``--plan`` is given.  ``--model`` and ``--example`` take memoplan specs for another model.

Each storage is labelled, when it is made, by the module whose forward made it (``fwd``;
``recompute`` when that forward runs again in backward) or ``backward``, and by the ATen op and
shape.  The report prints the peak, when it happened (ops since the start of backward), and the
bytes alive then by label, largest first.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import torch
from torch import nn

import memoplan
from memoplan import specs
from memoplan.measure import LiveStorageMeter, default_loss
from memoplan.syntax import parse_example_spec


class LabelledMeter(LiveStorageMeter):
    """The live-storage meter, plus a label per storage and the labels alive at the peak."""

    def __init__(self, where) -> None:
        super().__init__()
        self.where = where  # () -> str: the label of what runs now
        self.labels: dict[int, str] = {}
        self.at_peak: list[tuple[str, int]] = []
        self.peak_op = ""
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = set(self._live)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        self.ops += 1
        for key in set(self._live) - before:
            shapes = [tuple(t.shape) for t in _tensors(out) if id(t.untyped_storage()) == key]
            self.labels[key] = f"{self.where()} {func.overloadpacket.__name__} {shapes[0] if shapes else ''}"
        if self.current_bytes >= self.peak_bytes and self.current_bytes > 0:
            self.at_peak = [(self.labels.get(k, "?"), n) for k, (n, _) in self._live.items()]
            self.peak_op = f"{self.where()} {func.overloadpacket.__name__} (op {self.ops})"
        return out


def _tensors(tree):
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def run(model: nn.Module, example, plan_text: str | None) -> tuple[int, str, list[tuple[str, int]]]:
    if plan_text is not None:
        memoplan.apply(model, memoplan.parse(plan_text))
    stack: list[str] = []
    phase = {"backward": False}
    names = {id(m): n or "(root)" for n, m in model.named_modules()}

    def pre(module, args):
        stack.append(names[id(module)])

    def post(module, args, output):
        stack.pop()

    hooks = [m.register_forward_pre_hook(pre) for m in model.modules()]
    hooks += [m.register_forward_hook(post) for m in model.modules()]

    def where() -> str:
        leaf = stack[-1] if stack else "(top)"
        if phase["backward"]:
            # A recompute runs forward with grad enabled; backward's own ops run with it disabled.
            return f"recompute {leaf}" if torch.is_grad_enabled() else "backward"
        return f"fwd {leaf}"

    import gc

    model.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        with LabelledMeter(where) as meter:
            output = example.run(model)
            loss = default_loss(output)
            phase["backward"] = True
            loss.backward()
    finally:
        gc.enable()
        for h in hooks:
            h.remove()
    return meter.peak_bytes, meter.peak_op, meter.at_peak


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(Path(__file__).with_name("hf_models.py")) + ":gpt2")
    parser.add_argument("--example", default="randint(4, 128, high=512)")
    parser.add_argument("--plan", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = specs.load_model(args.model)
    example = specs.make_example(parse_example_spec(args.example, "--example"))
    plan_text = args.plan.read_text() if args.plan else None
    peak, op, live = run(model, example, plan_text)
    groups: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for label, nbytes in live:
        # Blocks alike: transformer.h.3.mlp.act -> transformer.h.*.mlp.act
        key = " ".join(_generic(part) for part in label.split(" "))
        groups[key] += nbytes
        counts[key] += 1
    print(f"peak {peak} B ({peak / 2**20:.2f} MiB) at {op}")
    print(f"{'bytes':>12}  {'n':>3}  made by")
    for key, nbytes in groups.most_common(args.top):
        print(f"{nbytes:>12,}  {counts[key]:>3}  {key}")
    rest = sum(groups.values()) - sum(n for _, n in groups.most_common(args.top))
    if rest:
        print(f"{rest:>12,}       (the rest)")


def _generic(part: str) -> str:
    return ".".join("*" if p.isdigit() else p for p in part.split("."))


if __name__ == "__main__":
    main()
