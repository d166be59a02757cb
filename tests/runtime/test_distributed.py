"""Two-process CPU DistributedDataParallel and FSDP2 (gloo) with and without a plan.

The model (tests/_ddp_worker.py) has BatchNorm, Dropout and memoplan `LIF` neurons with
`state = functional` over a time axis.  The plan is applied before DDP wraps the model,
or before FSDP2's `fully_shard` shards each child and the whole model:

    stem      checkpoint + compress input = auto   (rank 0 feeds binary events, rank 1 counts)
    spiking   checkpoint + compress input = bit    (spikes in)
    recur     checkpoint, or temporal_chunk 4 dim 0 + compress input = bit
              (also with boundaries = recompute)
    head      checkpoint                            (torch's checkpoint path, BatchNorm inside)

Every rank trains two SGD steps on its own inputs.  The averaged gradients, losses, final
parameters, BatchNorm buffers, LIF potentials and RNG state must equal those of the same
DDP (or FSDP2) setup without the plan: bit for bit without chunking; with chunking, the
chunked module's potentials and the gradients of it and of every module before it within
memoplan verify's tolerance (its layer runs on fewer rows at a time, and its weight
gradients are summed chunk by chunk; those also within max|diff| <= 1e-5 * max|g|
per tensor), the rest bit for bit.
The planned and chunked comparisons are made twice: with the native kernels, and with both
ranks under MKL's generic code path (``MKL_CBWR=COMPATIBLE``), where a chunk's smaller
matrix product rounds otherwise than the whole one, as it does on some AVX-512 CPUs (issue 16).
A DDP "marked ready twice" or unused-parameter error would make a worker exit non-zero.
Under FSDP2 the parameters are freed after each child's forward and gathered again before
its backward, where memoplan's regions recompute with them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _paths import ROOT, TESTS
from _tolerance import assert_within_chunk_tolerance  # tests/_tolerance.py

WORLD = 2
TIMEOUT_S = 120  # whole run; each collective inside is bounded at 60 s by the worker
WORKER = TESTS / "_ddp_worker.py"
CHUNK_RTOL = 1e-5  # max |difference| <= CHUNK_RTOL * max |gradient|, per tensor

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is needed"
    ),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    """Run both ranks once (about 10 s) and load what each saved."""
    return _run_ranks(tmp_path_factory.mktemp("ddp"), {})


@pytest.fixture(scope="module")
def results_generic_blas(tmp_path_factory) -> list[dict]:
    """The same under MKL's generic code path (``MKL_CBWR=COMPATIBLE``, as on a CPU MKL has no
    tuned kernels for): another matrix kernel for another shape, as on some AVX-512 CPUs, so
    chunked layers round otherwise than whole ones (issue 16).  Other BLAS libraries ignore it."""
    return _run_ranks(tmp_path_factory.mktemp("ddp_generic_blas"), {"MKL_CBWR": "COMPATIBLE"})


@pytest.fixture(params=["native", "generic"])
def any_blas(request) -> list[dict]:
    """``results``, then ``results_generic_blas``: for what must hold whatever kernels run."""
    return request.getfixturevalue("results" if request.param == "native" else "results_generic_blas")


def _run_ranks(folder: Path, extra_env: dict[str, str]) -> list[dict]:
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("MEMOPLAN_CACHE_DIR", str(folder / "cache"))
    env["OMP_NUM_THREADS"] = "1"
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback: no hostname lookup, no network needed
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(WORLD), str(folder), str(folder)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"DDP workers did not finish in {TIMEOUT_S} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed (exit {proc.returncode}):\n{log}"
    return [torch.load(folder / f"rank{rank}.pt", weights_only=False) for rank in range(WORLD)]


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def _differences(a: dict, b: dict) -> list[str]:
    return [name for name in a if not _equal(a[name], b[name])]


def test_the_ranks_saw_different_data_and_ddp_averaged_their_gradients(results):
    r0, r1 = results[0]["unplanned"], results[1]["unplanned"]
    assert not torch.equal(r0["loss"][0], r1["loss"][0])  # rank-specific inputs
    for step in range(2):
        assert _equal(r0["grads"][step], r1["grads"][step])  # all-reduced
        assert all(g is not None for g in r0["grads"][step].values())
    assert _equal(r0["params"], r1["params"])


@pytest.mark.parametrize("scenario", ["planned", "planned_find_unused", "planned_static_graph", "dtr"])
def test_planned_ddp_step_is_bit_identical_to_unplanned(any_blas, scenario):
    results = any_blas
    for rank in range(WORLD):
        ref, got = results[rank]["unplanned"], results[rank][scenario]
        for step in range(2):
            assert _differences(ref["grads"][step], got["grads"][step]) == [], f"rank {rank} step {step}"
            assert _equal(ref["loss"][step], got["loss"][step])
            assert _equal(ref["out"][step], got["out"][step])
            assert _equal(ref["v"][step], got["v"][step])  # LIF state advanced once, not twice
        assert _differences(ref["params"], got["params"]) == []
        assert _differences(ref["buffers"], got["buffers"]) == []  # BatchNorm committed once
        assert torch.equal(ref["rng"], got["rng"])  # dropout replayed in recompute, not redrawn


@pytest.mark.parametrize("scenario", ["dtr", "fsdp_dtr"])
def test_dtr_evicted_and_recomputed_on_every_rank(results, scenario):
    for rank in range(WORLD):
        stats = results[rank][scenario]["dtr"]
        assert stats.evictions > 0 and stats.recomputes > 0, (rank, stats)


def test_find_unused_parameters_changes_nothing_unplanned(results):
    for rank in range(WORLD):
        ref, got = results[rank]["unplanned"], results[rank]["unplanned_find_unused"]
        assert _equal(ref["grads"], got["grads"])


@pytest.mark.parametrize("scenario", ["fsdp_planned", "fsdp_planned_keep_gathered", "fsdp_dtr"])
def test_planned_fsdp_step_is_bit_identical_to_unplanned_fsdp(any_blas, scenario):
    results = any_blas
    for rank in range(WORLD):
        ref, got = results[rank]["fsdp_unplanned"], results[rank][scenario]
        assert all(g is not None for g in ref["grads"][0].values())
        for step in range(2):
            assert _differences(ref["grads"][step], got["grads"][step]) == [], f"rank {rank} step {step}"
            assert _equal(ref["loss"][step], got["loss"][step])
            assert _equal(ref["out"][step], got["out"][step])
            assert _equal(ref["v"][step], got["v"][step])
        assert _differences(ref["params"], got["params"]) == []
        assert _differences(ref["buffers"], got["buffers"]) == []
        assert torch.equal(ref["rng"], got["rng"])


def test_fsdp_ranks_hold_the_same_whole_parameters(results):
    for scenario in ("fsdp_unplanned", "fsdp_planned", "fsdp_chunked"):
        r0, r1 = results[0][scenario], results[1][scenario]
        assert r0["sharded"] and r1["sharded"] and not results[0]["planned"]["sharded"]
        assert not torch.equal(r0["loss"][0], r1["loss"][0])
        assert _equal(r0["grads"], r1["grads"])  # reduced across the ranks
        assert _equal(r0["params"], r1["params"])


def test_state_dict_keys_are_the_unplanned_ones_under_ddp_and_fsdp(results):
    for rank in range(WORLD):
        for scenario in ("planned", "chunked", "fsdp_planned", "fsdp_chunked"):
            ref = "fsdp_unplanned" if scenario.startswith("fsdp") else "unplanned"
            assert results[rank][scenario]["keys"] == results[rank][ref]["keys"], scenario


@pytest.mark.parametrize("scenario", ["chunked", "fsdp_chunked"])
def test_temporal_chunks_equal_the_unplanned_step(any_blas, scenario):
    results = any_blas
    for rank in range(WORLD):
        ref = results[rank]["fsdp_unplanned" if scenario.startswith("fsdp") else "unplanned"]
        got = results[rank][scenario]
        # First step, same weights.  `recur.fc` runs on 8 or 4 rows per chunk instead of 24
        # at once, and BLAS may take another kernel for another shape (it does on some
        # AVX-512 CPUs), so `recur.lif`'s final potential and the gradients of `recur` and
        # of everything before it (they flow through recur's input gradient) agree within
        # memoplan verify's tolerance.  The modules before `recur` run the same
        # forward: bit for bit.  recur's spikes are thresholded and equal, so `head` after
        # them computes the same arithmetic on the same values: its gradients and the
        # output bit for bit.  recur's weight gradients, summed chunk by chunk, also
        # within CHUNK_RTOL of their own largest magnitude.
        assert _equal(ref["out"][0], got["out"][0]), f"rank {rank}"
        v, w = ref["v"][0], got["v"][0]
        assert v.keys() == w.keys()
        assert _differences({n: v[n] for n in v if not n.startswith("recur.")}, w) == [], f"rank {rank}"
        assert_within_chunk_tolerance(v, w, [n for n in v if n.startswith("recur.")])
        g, h = ref["grads"][0], got["grads"][0]
        assert _differences({n: g[n] for n in g if n.startswith("head.")}, h) == [], f"rank {rank}"
        assert_within_chunk_tolerance(g, h, [n for n in g if not n.startswith("head.")])
        for name in g:
            if name.startswith("recur."):
                assert (g[name] - h[name]).abs().max() <= CHUNK_RTOL * g[name].abs().max(), name
        # Second step: the weights already differ by that rounding (about 1e-7), so
        # everything may differ by as much; the second iteration must still run cleanly.
        for name, g in ref["grads"][1].items():
            assert torch.allclose(g, got["grads"][1][name], rtol=1e-4, atol=1e-6), name
        for name, p in ref["params"].items():
            assert torch.allclose(p, got["params"][name], rtol=0, atol=1e-6), name
        assert torch.allclose(ref["loss"][1], got["loss"][1], rtol=1e-5, atol=0)
        for name, b in ref["buffers"].items():  # BatchNorm statistics, committed once per step
            assert torch.allclose(b.float(), got["buffers"][name].float(), rtol=1e-5, atol=1e-6), name
        assert int(got["buffers"]["stem.bn.num_batches_tracked"]) == 2
        assert torch.equal(ref["rng"], got["rng"])


def test_recomputed_chunk_boundaries_under_ddp_equal_kept_ones_bit_for_bit(results):
    for rank in range(WORLD):
        ref, got = results[rank]["chunked"], results[rank]["chunked_recompute"]
        for key in ("loss", "out", "grads", "v", "params", "buffers", "rng"):
            assert _equal(ref[key], got[key]), (rank, key)


def test_chunked_regions_encode_every_chunk(results):
    for rank in range(WORLD):
        used = results[rank]["chunked"]["codecs"][0]
        assert [c for w, c in used if w == "recur"] == ["bit"] * 4
        assert [c for w, c in used if w == "spiking"] == ["bit"]


def test_auto_codec_is_the_same_on_every_rank_and_the_most_general_one(results):
    # Without agreement rank 0 would pick `bit` (binary events) and rank 1 `uint8` (counts).
    assert [results[r]["planned"]["choose"][0] for r in range(WORLD)] == ["bit", "uint8"]
    for scenario in (
        "planned",
        "chunked",
        "planned_find_unused",
        "planned_static_graph",
        "fsdp_planned",
        "fsdp_chunked",
    ):
        for rank in range(WORLD):
            for step in range(2):
                stem = [c for w, c in results[rank][scenario]["codecs"][step] if w == "stem"]
                assert stem == ["uint8"], (scenario, rank, step, stem)
