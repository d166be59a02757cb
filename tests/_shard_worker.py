"""One rank of the FSDP2 runs of tests/planner/test_shards.py (gloo): ``python tests/_shard_worker.py
RANK WORLD FOLDER [PLAN]``.

Builds tests/shard_models.py's model (the same weights on every rank), applies the plan (if
given) before FSDP2's ``fully_shard`` shards each block and the whole model, and runs one
training step on the rank's own batch under memoplan's live-storage meter: the step's peak
above what the rank holds before it (its parameter shards), and the whole gradients, saved to
``FOLDER/rank{RANK}.pt``.  With ``MEMOPLAN_TEST_LIMIT_MIB`` set, the address space is limited
after a first warm-up step to what it uses plus that many MiB (``RLIMIT_AS``).
"""

from __future__ import annotations

import os
import resource
import sys
import weakref
from pathlib import Path

import torch  # noqa: F401 - torch loads before the address-space limit is set
from _paths import TESTS

sys.path.insert(0, str(TESTS))
import shard_models  # noqa: E402
from _ddp_worker import entry, serve  # noqa: E402

import memoplan  # noqa: E402
from memoplan.measure import LiveStorageMeter, training_step  # noqa: E402


def address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


class ResizeAwareMeter(LiveStorageMeter):
    """memoplan's live-storage meter, re-reading every live storage's size after each op.

    FSDP2 frees an all-gathered block by resizing its storage to 0 bytes and gathers it again
    into the same storage (``UntypedStorage.resize_``, which no dispatch mode sees): the plain
    meter counts such a storage at its last size seen by an op.  Here a storage counts what it
    holds now, so the peak is what the rank really holds (slow: for these tests only).
    """

    def __init__(self) -> None:
        super().__init__()
        self._storages: dict[int, weakref.ref] = {}

    def _see(self, storage, *, known: bool) -> None:
        super()._see(storage, known=known)
        if id(storage) in self._live:
            self._storages[id(storage)] = weakref.ref(storage)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        peak = self.peak_bytes
        out = super().__torch_dispatch__(func, types, args, kwargs)
        total = 0
        for key, (nbytes, finalizer) in list(self._live.items()):
            ref = self._storages.get(key)
            storage = ref() if ref is not None else None
            if storage is not None and storage.nbytes() != nbytes:
                nbytes = storage.nbytes()
                self._live[key] = (nbytes, finalizer)
            total += nbytes
        self.current_bytes = total
        self.peak_bytes = max(peak, total)
        return out


def step(model, x) -> int:
    model.zero_grad(set_to_none=True)
    with ResizeAwareMeter() as meter:
        training_step(model, (x,), {})
    return meter.peak_bytes


def main() -> int:
    rank, world, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    plan = Path(sys.argv[4]) if len(sys.argv) > 4 else None

    def work(rank: int) -> dict:
        from torch.distributed.fsdp import fully_shard

        model = shard_models.build()
        if plan is not None:
            memoplan.apply(model, plan)  # before FSDP2, as the README says
        if world > 1:  # one rank: the unsharded model, as a single process trains it
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        (x,) = shard_models.example(rank)
        limit = os.environ.get("MEMOPLAN_TEST_LIMIT_MIB")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if limit is not None:
            step(model, x[:2])  # warm-up: gloo's and autograd's first-use costs before the limit
            model.zero_grad(set_to_none=True)
            room = address_space() + int(float(limit) * 2**20)
            resource.setrlimit(resource.RLIMIT_AS, (room, hard))
        try:
            peak = step(model, x)
        except RuntimeError as exc:
            return {"oom": str(exc).splitlines()[0]}
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))  # the step alone ran under the limit
        grads = {n: (p.grad.full_tensor() if world > 1 else p.grad).clone() for n, p in model.named_parameters()}
        return {"peak": peak, "grads": grads}

    return serve(rank, world, folder, folder, work)


if __name__ == "__main__":
    entry(main)
