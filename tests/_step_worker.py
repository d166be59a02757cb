"""One rank of the FSDP2 mixed-precision run of tests/test_step.py (gloo): ``python
tests/_step_worker.py RANK WORLD FOLDER``.

Builds tests/step_models.py's Llama in fp32 (the same weights on every rank), shards each
decoder layer and the whole model with ``fully_shard(..., mp_policy=MixedPrecisionPolicy(
param_dtype=torch.bfloat16, reduce_dtype=torch.float32))`` and runs one training step (the
model's own loss) on the rank's own batch under the resize-aware live-storage meter of
tests/_shard_worker.py: the step's peak above what the rank held before it, saved to
``FOLDER/rank{RANK}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from _paths import TESTS

sys.path.insert(0, str(TESTS))
import step_models  # noqa: E402
from _ddp_worker import entry, serve  # noqa: E402
from _shard_worker import ResizeAwareMeter  # noqa: E402

from memoplan.measure import training_step  # noqa: E402


def main() -> int:
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])

    def work(rank: int) -> dict:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model = step_models.build(torch.float32)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        example = step_models.example(rank)
        model.zero_grad(set_to_none=True)
        with ResizeAwareMeter() as meter:
            training_step(model, example.args, example.kwargs)
        return {"peak": meter.peak_bytes}

    return serve(rank, world, folder, folder, work)


if __name__ == "__main__":
    entry(main)
