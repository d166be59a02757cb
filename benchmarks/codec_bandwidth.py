"""Benchmark: bandwidth of the generated Triton codec kernels against a device-to-device copy.

    python benchmarks/codec_bandwidth.py                 # GPU: 64 MiB to 4 GiB inputs
    python benchmarks/codec_bandwidth.py --sizes-mib 64 --repeats 50 --json out.json

Bandwidth counts the bytes each kernel reads plus the bytes it writes, over the
median time of ``--repeats`` samples timed with CUDA events, each sample
``--inner`` back-to-back calls (after warm-up calls, which also let
``triton.autotune`` pick its block).  ``pack+unpack`` is the
round trip a checkpointed region pays: ``2 * (input bytes + packed bytes)``
over the summed medians.  The reference is ``dst.copy_(src)`` of the input
tensor, also counted as read + write.  The goal is >= 0.85x the copy on H100/H200.

Without a GPU it says so and exits 0 after an interpreter smoke test on a tiny
input (``TRITON_INTERPRET=1``): that checks the kernels run and agree with
codecs.py, and is NOT a bandwidth figure.

    python benchmarks/codec_bandwidth.py --cpu           # the pure-torch bit codec on CPU

``--cpu`` times ``codecs.encode(x, "bit", validate="off")`` and ``codecs.decode``
of binary float32 tensors (default: 2,097,152 elements, a block's spikes in the
spiking example), median of ``--repeats`` calls after ``--warmup``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 0.85


def _median_ms(fn, repeats: int, warmup: int, inner: int) -> float:
    """Median over ``repeats`` samples of the GPU time of one call; a sample times ``inner``
    back-to-back calls between two CUDA events, so the host's launch overhead (tens of
    microseconds, close to a 64 MiB kernel's run time) overlaps the kernels instead of
    being counted."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def run_gpu(sizes_mib: list[int], repeats: int, warmup: int, inner: int) -> list[dict]:
    import torch

    from memoplan.runtime import codecs
    from memoplan.runtime.kernels import bit, uint8

    rows = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        itemsize = torch.empty((), dtype=dtype).element_size()
        for mib in sizes_mib:
            n = mib * 2**20 // itemsize
            x = (torch.rand(n, device="cuda") < 0.5).to(dtype)
            in_bytes = n * itemsize
            packed = bit.bit_pack(x)
            assert torch.equal(packed, codecs.encode(x, "bit", validate="off").data[0]), "pack differs from codecs"
            assert torch.equal(bit.bit_unpack(packed, n, dtype), x), "unpack differs from the input"
            checked, first = bit.bit_pack_checked(x)
            assert first is None and torch.equal(checked, packed), "checked pack differs"
            values = uint8.uint8_encode(x)
            dst = torch.empty_like(x)
            t = {
                "copy": _median_ms(partial(dst.copy_, x), repeats, warmup, inner),
                "pack": _median_ms(partial(bit.bit_pack, x), repeats, warmup, inner),
                "unpack": _median_ms(partial(bit.bit_unpack, packed, n, dtype), repeats, warmup, inner),
                # the flags without their host read, which codecs.py adds once per call
                "checked_pack": _median_ms(partial(bit.bit_pack_checked_autotuned, x), repeats, warmup, inner),
                "uint8_encode": _median_ms(partial(uint8.uint8_encode, x), repeats, warmup, inner),
                "uint8_decode": _median_ms(partial(uint8.uint8_decode, values, dtype), repeats, warmup, inner),
                "torch_pack": _median_ms(partial(codecs.encode, x, "bit", validate="off"), min(repeats, 5), 1, 1),
            }
            moved = {
                "copy": 2 * in_bytes,
                "pack": in_bytes + packed.numel(),
                "unpack": in_bytes + packed.numel(),
                "checked_pack": in_bytes + packed.numel(),
                "uint8_encode": in_bytes + n,
                "uint8_decode": in_bytes + n,
                "torch_pack": in_bytes + packed.numel(),
            }
            gbps = {k: moved[k] / (t[k] * 1e-3) / 1e9 for k in t}
            round_trip = 2 * (in_bytes + packed.numel()) / ((t["pack"] + t["unpack"]) * 1e-3) / 1e9
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "input_mib": mib,
                    "numel": n,
                    "ms": t,
                    "gb_per_s": gbps,
                    "pack_unpack_gb_per_s": round_trip,
                    "ratio_to_copy": round_trip / gbps["copy"],
                }
            )
            del x, dst, packed, values, checked
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    import torch

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    import triton

    print(f"triton {triton.__version__}; GB/s = (bytes read + bytes written) / median time; 1 GB = 1e9 bytes")
    head = (
        f"{'dtype':9} {'MiB':>5} {'copy':>7} {'pack':>7} {'unpack':>7} {'pk+unpk':>7} {'ratio':>6} "
        f"{'checked':>7} {'u8 enc':>7} {'u8 dec':>7} {'torch pk':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        g = r["gb_per_s"]
        mark = "ok" if r["ratio_to_copy"] >= GOAL else "LOW"
        print(
            f"{r['dtype']:9} {r['input_mib']:>5} {g['copy']:>7.0f} {g['pack']:>7.0f} {g['unpack']:>7.0f} "
            f"{r['pack_unpack_gb_per_s']:>7.0f} {r['ratio_to_copy']:>5.2f}{'' if mark == 'ok' else '!'} "
            f"{g['checked_pack']:>7.0f} {g['uint8_encode']:>7.0f} {g['uint8_decode']:>7.0f} {g['torch_pack']:>8.0f}"
        )
    worst = min(r["ratio_to_copy"] for r in rows)
    print(f"pack+unpack / copy: worst {worst:.2f}x (goal >= {GOAL}x): {'met' if worst >= GOAL else 'NOT met'}")


def smoke_test() -> None:
    """Interpreter run on a tiny input: correctness only."""
    os.environ["TRITON_INTERPRET"] = "1"  # before triton and the kernel modules are imported
    import torch

    from memoplan.runtime import codecs
    from memoplan.runtime.kernels import bit, uint8

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.bool):
        x = (torch.rand(4099) < 0.5).to(dtype)
        packed = bit.bit_pack(x)
        assert torch.equal(packed, codecs.encode(x, "bit").data[0])
        assert torch.equal(bit.bit_unpack(packed, x.numel(), dtype), x)
        assert torch.equal(uint8.uint8_decode(uint8.uint8_encode(x), dtype), x)
    print("SMOKE TEST ONLY (TRITON_INTERPRET=1 on CPU, 4099 elements): kernels agree with codecs.py.")
    print("This is not a bandwidth figure.")


def run_cpu(numels: list[int], repeats: int, warmup: int) -> list[dict]:
    """Median milliseconds of the pure-torch ``bit`` pack and unpack on CPU."""
    import time

    import torch

    from memoplan.runtime import codecs

    rows = []
    for numel in numels:
        x = (torch.rand(numel, generator=torch.Generator().manual_seed(0)) < 0.2).float()
        payload = codecs.encode(x, "bit", validate="off")
        assert torch.equal(codecs.decode(payload), x)
        row = {"numel": numel, "threads": torch.get_num_threads()}
        for name, call in (
            ("pack_ms", partial(codecs.encode, x, "bit", validate="off")),
            ("unpack_ms", partial(codecs.decode, payload)),
        ):
            for _ in range(warmup):
                call()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                call()
                times.append((time.perf_counter() - start) * 1000)
            row[name] = statistics.median(times)
        rows.append(row)
        print(
            f"bit codec on CPU, float32, {numel:,} elements, {row['threads']} threads: "
            f"pack {row['pack_ms']:.2f} ms, unpack {row['unpack_ms']:.2f} ms (median of {repeats})"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 256, 1024, 4096], help="input sizes in MiB")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls first (autotuning happens here)")
    parser.add_argument("--inner", type=int, default=10, help="back-to-back calls per timed sample")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    parser.add_argument("--cpu", action="store_true", help="time the pure-torch bit codec on CPU instead")
    parser.add_argument("--numel", type=int, nargs="+", default=[2_097_152], help="elements per tensor (--cpu)")
    args = parser.parse_args(argv)

    import torch

    if args.cpu:
        rows = run_cpu(args.numel, args.repeats, args.warmup)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
        return 0

    if not torch.cuda.is_available():
        print("codec_bandwidth needs a CUDA GPU: no bandwidth measured.")
        # Found, not imported: TRITON_INTERPRET must be set before triton is first imported.
        if importlib.util.find_spec("triton") is None or importlib.util.find_spec("numpy") is None:
            print("(triton or numpy missing: no interpreter smoke test either)")
            return 0
        smoke_test()
        return 0
    rows = run_gpu(args.sizes_mib, args.repeats, args.warmup, args.inner)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
