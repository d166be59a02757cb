"""One rank of the two-process CPU DDP and FSDP2 runs of tests/runtime/test_distributed.py (gloo backend).

Run as ``python tests/_ddp_worker.py RANK WORLD RENDEZVOUS_DIR OUT_DIR``.  Rank 0 opens a
TCPStore on a port the OS picks (port 0, so no two runs race for a port) and writes the
port to ``RENDEZVOUS_DIR/port``; the other ranks wait for that file.  Every collective has
a bounded timeout, so a rank that dies makes the others fail instead of hang.

Each rank builds the same spiking model, applies a plan (or not) BEFORE wrapping it in
DDP or sharding it with FSDP2, and trains two steps on rank-specific inputs; everything the test compares is saved
to ``OUT_DIR/rank{RANK}.pt``.  The test (not this script) does the comparing.
"""

from __future__ import annotations

import copy
import datetime
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import memoplan
from memoplan.neurons import LIF, reset
from memoplan.runtime import codecs

TIMEOUT = datetime.timedelta(seconds=60)
T, B, F, H, C = 6, 4, 5, 8, 3  # time steps, batch per rank, input features, hidden, classes
STEPS = 2


class Stem(nn.Module):
    """Per time step: Linear -> BatchNorm1d -> Dropout (input currents for the first LIF)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(F, H)
        self.bn = nn.BatchNorm1d(H)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        steps, batch = x.shape[:2]
        return self.drop(self.bn(self.fc(x.flatten(0, 1)))).unflatten(0, (steps, batch))


class Spiking(nn.Module):
    """Spikes in, spikes out: Linear -> BatchNorm1d over all steps, then a stateful LIF over time."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.bn = nn.BatchNorm1d(H)
        self.lif = LIF(threshold=0.3)

    def forward(self, x):
        steps, batch = x.shape[:2]
        return self.lif(self.bn(self.fc(x.flatten(0, 1))).unflatten(0, (steps, batch)))


class Recurrent(nn.Module):
    """Time-local layers and a LIF whose potential crosses chunk boundaries.

    No BatchNorm or Dropout: chunking them would change the result (the resolver refuses, MP304).
    """

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(H, H)
        self.lif = LIF(threshold=0.4)

    def forward(self, x):
        return self.lif(self.fc(x))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(H, H)
        self.bn = nn.BatchNorm1d(H)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(H, C)

    def forward(self, rates):
        return self.fc2(self.drop(torch.tanh(self.bn(self.fc1(rates)))))


class Net(nn.Module):
    """x: (T, B, F) event frames -> (B, C) logits."""

    def __init__(self):
        super().__init__()
        self.stem = Stem()
        self.lif0 = LIF(threshold=0.2)
        self.spiking = Spiking()
        self.recur = Recurrent()
        self.head = Head()

    def forward(self, x):
        s = self.recur(self.spiking(self.lif0(self.stem(x))))
        return self.head(s.mean(0))


_COMMON = """memplan 1
module stem {
    checkpoint
    compress input = auto
}
module spiking {
    checkpoint
    compress input = bit
}
module head { checkpoint }
module class LIF { state = functional }
"""

PLANS = {
    # Checkpoint and compression only: every number must be bit-identical to the unplanned run.
    "planned": _COMMON + "module recur { checkpoint }\n",
    # `recur` in 4 chunks over T = 6 steps (2, 2, 1, 1): its weight gradients are summed
    # chunk by chunk, so they are equal up to float reassociation.
    "chunked": _COMMON + "module recur {\n    temporal_chunk 4 dim 0\n    compress input = bit\n}\n",
    # The same, the potentials the chunks start from recomputed in backward: bit for bit "chunked".
    "chunked_recompute": _COMMON
    + "module recur {\n    temporal_chunk 4 dim 0 boundaries = recompute\n    compress input = bit\n}\n",
    # Dynamic eviction of every child (Net has no container): the threshold evicts all it can,
    # so each child's saved activations are recomputed in backward.
    "dtr": "memplan 1\ndtr {\n    eviction_threshold = 1 B\n    evictee_minimum_size = 0 B\n}\n",
}

# name -> (plan or None, wrapper, its keyword arguments).  "fsdp" is FSDP2's `fully_shard`
# on each child of Net and then on Net itself (parameters sharded across the ranks,
# gathered before each child's forward and again before its backward).
SCENARIOS = {
    "unplanned": (None, "ddp", {}),
    "planned": ("planned", "ddp", {}),
    "chunked": ("chunked", "ddp", {}),
    "chunked_recompute": ("chunked_recompute", "ddp", {}),
    "unplanned_find_unused": (None, "ddp", {"find_unused_parameters": True}),
    "planned_find_unused": ("planned", "ddp", {"find_unused_parameters": True}),
    "planned_static_graph": ("planned", "ddp", {"static_graph": True}),
    "fsdp_unplanned": (None, "fsdp", {}),
    "fsdp_planned": ("planned", "fsdp", {}),
    "fsdp_chunked": ("chunked", "fsdp", {}),
    "fsdp_planned_keep_gathered": ("planned", "fsdp", {"reshard_after_forward": False}),
    "dtr": ("dtr", "ddp", {}),
    "fsdp_dtr": ("dtr", "fsdp", {}),
}


def inputs(rank: int, step: int) -> torch.Tensor:
    """Rank 0: binary events.  Rank 1: small integer event counts (0..5), as float32."""
    g = torch.Generator().manual_seed(100 * rank + step)
    if rank == 0:
        return (torch.rand(T, B, F, generator=g) < 0.5).float()
    return torch.randint(0, 6, (T, B, F), generator=g).float()


def wrap(model: Net, wrapper: str, kwargs: dict) -> nn.Module:
    if wrapper == "ddp":
        return DDP(model, **kwargs)
    from torch.distributed.fsdp import fully_shard

    for child in (model.stem, model.spiking, model.recur, model.head):
        fully_shard(child, **kwargs)
    return fully_shard(model, **kwargs)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (FSDP2 keeps parameters and gradients as DTensor shards)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run(rank: int, base: Net, plan: str | None, wrapper: str, kwargs: dict) -> dict:
    model = copy.deepcopy(base)
    if plan is not None:
        memoplan.apply(model, PLANS[plan])  # before DDP or FSDP, as the README says
    ddp = wrap(model, wrapper, kwargs)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
    encoded: list[tuple[str, str]] = []
    original = codecs.encode

    def spy(x, codec, **kwargs):
        encoded.append((kwargs.get("where", ""), str(codec)))
        return original(x, codec, **kwargs)

    codecs.encode = spy
    record: dict = {"loss": [], "out": [], "grads": [], "v": [], "choose": [], "codecs": []}
    try:
        for step in range(STEPS):
            reset(model)
            optimizer.zero_grad(set_to_none=True)
            torch.manual_seed(1000 + 10 * rank + step)  # dropout masks differ by rank and step
            x = inputs(rank, step)
            record["choose"].append(codecs.choose(x))
            out = ddp(x)
            loss = nn.functional.cross_entropy(out, torch.arange(B) % C)
            loss.backward()
            record["loss"].append(loss.detach())
            record["out"].append(out.detach())
            grads = {n: (None if p.grad is None else full(p.grad).clone()) for n, p in model.named_parameters()}
            record["grads"].append(grads)
            record["v"].append({n: m.v.detach().clone() for n, m in model.named_modules() if isinstance(m, LIF)})
            record["codecs"].append(list(encoded))
            encoded.clear()
            optimizer.step()
    finally:
        codecs.encode = original
    record["params"] = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    record["buffers"] = {n: b.clone() for n, b in model.named_buffers()}
    record["rng"] = torch.get_rng_state()
    record["keys"] = list(model.state_dict())
    record["sharded"] = all(hasattr(p, "full_tensor") for p in model.parameters())
    if plan == "dtr":
        record["dtr"] = memoplan.dtr_stats(model)
    if plan is not None:
        memoplan.remove(model)
    return record


def rendezvous(rank: int, world: int, folder: Path) -> dist.Store:
    portfile = folder / "port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=TIMEOUT, wait_for_workers=False)
        tmp = folder / "port.tmp"
        tmp.write_text(str(store.port))
        os.replace(tmp, portfile)  # atomic: the others never read half a number
        return store
    deadline = time.monotonic() + TIMEOUT.total_seconds()
    while not portfile.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("rank 0 never published its port")
        time.sleep(0.05)
    return dist.TCPStore("127.0.0.1", int(portfile.read_text()), world, is_master=False, timeout=TIMEOUT)


def serve(rank: int, world: int, folder: Path, out: Path, work) -> int:
    """Join the gloo group of ``world`` ranks, save ``work(rank)`` as ``out/rank{rank}.pt``, leave."""
    torch.set_num_threads(1)
    store = rendezvous(rank, world, folder)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        torch.save(work(rank), out / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def entry(main) -> None:
    """Run a worker's ``main``; on any error print it and exit at once, not waiting on a peer."""
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait on a peer that may never answer
    sys.exit(code)


def main() -> int:
    rank, world, folder, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])

    def work(rank: int) -> dict:
        torch.manual_seed(0)
        base = Net()  # same seed on every rank: the same initial weights
        return {name: run(rank, base, *scenario) for name, scenario in SCENARIOS.items()}

    return serve(rank, world, folder, out, work)


if __name__ == "__main__":
    entry(main)
