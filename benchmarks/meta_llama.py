"""Planning a Llama built on the meta device: wall time and peak RSS of ``memoplan plan``
(docs/meta.md).

    PYTHONPATH=. .venv/bin/python benchmarks/meta_llama.py --shape 8b --seq 4096 --shards 8
    PYTHONPATH=. .venv/bin/python benchmarks/meta_llama.py --shape 70b --seq 4096 --shards 64
    PYTHONPATH=. .venv/bin/python benchmarks/meta_llama.py --shape 8b --seq 8192 --shards 8 --budget 60GiB
    PYTHONPATH=. .venv/bin/python benchmarks/meta_llama.py --shape 8b --seq 4096 --kernels

``--kernels``: no plan; the unplanned peak of one step (unsharded) on fake tensors of the meta
device itself (SDPA's math path, which saves every attention matrix) and of the CPU (its flash
kernel, the estimate's), in this process.

Each run is ``memoplan plan --model benchmarks/meta_llama.py:<shape> --example 'randint(1, SEQ, high=128256)'
--shards N --optimizer adamw --budget B`` in a child process (the command as a user types it,
imports included); the figures are its wall time and its peak resident memory (``ru_maxrss`` of
the child), its CPU time (user and system: on a shared machine the wall time is longer by the
share of the cores others take; the load average is printed next to it), and the plan's header.  The shapes are Llama-3's (bfloat16):
8B (32 layers, hidden 4096, 32 heads, 8 KV heads, intermediate 14336, vocabulary 128256) and
70B (80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate 28672).  Built on the meta
device, nothing of their weights is allocated.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

SHAPES = {
    "8b": {"layers": 32, "hidden": 4096, "heads": 32, "kv": 8, "intermediate": 14336},
    "70b": {"layers": 80, "hidden": 8192, "heads": 64, "kv": 8, "intermediate": 28672},
}
VOCAB = 128256


def _meta(shape: str, seq: int = 8192) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    config = LlamaConfig(
        num_hidden_layers=s["layers"],
        hidden_size=s["hidden"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        intermediate_size=s["intermediate"],
        vocab_size=VOCAB,
        max_position_embeddings=seq,
        rope_theta=500000.0,
        attn_implementation="sdpa",
        use_cache=False,
        torch_dtype=torch.bfloat16,
    )
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)


def llama_8b() -> nn.Module:
    """The Llama-3-8B shape on the meta device (bfloat16)."""
    return _meta("8b")


def llama_70b() -> nn.Module:
    """The Llama-3-70B shape on the meta device (bfloat16)."""
    return _meta("70b")


def run(shape: str, seq: int, shards: int, budget: str, device: str | None) -> dict:
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.memplan"
        argv = [
            sys.executable, "-m", "memoplan", "plan",
            "--model", f"{here}:llama_{shape}",
            "--example", f"randint(1, {seq}, high={VOCAB})",
            "--shards", str(shards), "--optimizer", "adamw", "--budget", budget, "-o", str(out),
        ]  # fmt: skip
        if device:
            argv += ["--device", device]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
        seconds = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss = usage.ru_maxrss * 1024  # the largest child's, bytes
        cpu = usage.ru_utime + usage.ru_stime  # the child's CPU time: on a busy machine, less than the wall time
        text = out.read_text() if out.exists() else ""
        header = [line for line in text.split("memplan 1")[0].splitlines() if line.startswith("#")]
        rules = text.count("checkpoint")
    return {
        "shape": shape,
        "seq": seq,
        "shards": shards,
        "budget": budget,
        "device": device or "cpu",
        "exit": done.returncode,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "load_average": round(os.getloadavg()[0], 1),
        "max_rss_bytes": rss,
        "checkpoints": rules,
        "header": header,
        "stderr_tail": done.stderr.strip().splitlines()[-3:],
    }


def kernels(shape: str, seq: int) -> dict:
    """The unplanned peak on fake tensors of the meta device and of the CPU."""
    from memoplan.planner.profiling.estimate import fake_step
    from memoplan.specs import Example

    model = _meta(shape, seq)
    example = Example((torch.zeros(1, seq, dtype=torch.long),))
    return {
        f"peak on {device}": fake_step(model, example, torch.device(device), peak_only=True).peak_bytes
        for device in ("meta", "cpu")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="8b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--budget", default="30%")
    parser.add_argument("--device", default=None)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--kernels", action="store_true", help="the unplanned peak on meta's kernels and the CPU's")
    args = parser.parse_args()
    if args.kernels:
        print(kernels(args.shape, args.seq))
        return
    result = run(args.shape, args.seq, args.shards, args.budget, args.device)
    for key, value in result.items():
        if key == "header":
            print("\n".join(f"  {line}" for line in value))
        else:
            print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
