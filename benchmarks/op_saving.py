"""Op-level saving on a 12-layer GPT-2: memoplan's `checkpoint save = [...]` against whole-block
checkpointing and PyTorch's selective activation checkpointing with a matmul-saving policy.

    .venv/bin/python benchmarks/op_saving.py [--layers 12] [--width 384] [--batch 4] [--seq 256] [--steps 3]
    .venv/bin/python benchmarks/op_saving.py --quick     # 4 layers x 128 wide, batch 2 x 64, 1 step

``GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=384, n_head=6, vocab_size=512, n_positions=256))``
(random weights, dropout 0.1) on ``randint(4, 256, high=512)``.  Every variant is one deep copy of
the same model; each is measured on memoplan's meter (the peak of one training step, gradients
included) and timed over ``--steps`` steps (median), all in one run so the ratios compare.  The
gradients of every variant are compared with the unplanned step's, bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import memoplan  # noqa: E402
from memoplan.measure import measure_step, training_step  # noqa: E402

MATMUL = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm, torch.ops.aten.baddbmm}


def gpt2(layers: int, width: int, seq: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=width // 64, vocab_size=512, n_positions=seq)
    # No KV cache: PyTorch's selective checkpointing as the docs write it fails on a cache that
    # grows between forward and recompute ("aten.slice.Tensor encountered during backward but not
    # found in storage"); memoplan's regions restore the cache and run with it on.
    config.use_cache = False
    return GPT2LMHeadModel(config)


def _matmul_policy(ctx, op, *args, **kwargs):
    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in MATMUL else CheckpointPolicy.PREFER_RECOMPUTE


def torch_sac(model):
    """PyTorch's selective checkpointing on every block, saving the matmuls (the docs' recipe)."""
    for block in model.transformer.h:
        forward = block.forward

        def wrapped(*args, _forward=forward, **kwargs):
            context = partial(create_selective_checkpoint_contexts, _matmul_policy)
            return checkpoint(_forward, *args, use_reentrant=False, context_fn=context, **kwargs)

        block.forward = wrapped
    return model


def memoplan_plan(body: str):
    return lambda model: memoplan.apply(model, f"memplan 1\nmodule transformer.h.* {{ {body} }}\n")


VARIANTS = {
    "unplanned": lambda model: model,
    "memoplan checkpoint (whole blocks)": memoplan_plan("checkpoint"),
    "memoplan checkpoint save = [matmul]": memoplan_plan("checkpoint save = [matmul]"),
    "memoplan checkpoint save = [matmul, attention]": memoplan_plan("checkpoint save = [matmul, attention]"),
    "PyTorch SAC, matmul-saving policy": torch_sac,
}


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="a small size for a first look: 4 layers x 128 wide, batch 2 x 64, 1 step"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.batch, args.seq, args.steps = 4, 128, 2, 64, 1
    base = gpt2(args.layers, args.width, args.seq)
    ids = torch.randint(0, 512, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    rows, reference = [], None
    for name, make in VARIANTS.items():
        model = make(copy.deepcopy(base))
        torch.manual_seed(1)
        try:
            peak = measure_step(model, (ids,)).peak_bytes
        except RuntimeError as exc:  # a variant that cannot run this model: said so in the table
            print(f"| {name} | fails: {str(exc).splitlines()[0][:120]} |", flush=True)
            continue
        torch.manual_seed(1)
        training_step(model, (ids,))
        grads = _grads(model)
        if reference is None:
            reference = grads
        equal = grads.keys() == reference.keys() and all(torch.equal(grads[k], reference[k]) for k in grads)
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            training_step(model, (ids,))
            times.append(time.perf_counter() - start)
        rows.append((name, peak, statistics.median(times), equal))
        print(f"measured {name}", file=sys.stderr, flush=True)
    peak0, time0 = rows[0][1], rows[0][2]
    print(f"GPT-2 {args.layers} layers x {args.width} wide, batch {args.batch} x {args.seq}, torch {torch.__version__}")
    print(
        f"| variant | peak (MiB) | peak / unplanned | step (ms, median of {args.steps}) | step / unplanned | gradients |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, peak, seconds, equal in rows:
        print(
            f"| {name} | {peak / 2**20:.2f} | {peak / peak0:.3f} | {seconds * 1e3:.0f} | {seconds / time0:.2f} | "
            f"{'bit-equal' if equal else 'DIFFERENT'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
