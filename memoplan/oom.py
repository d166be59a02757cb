"""Whether an exception is an allocator running out of memory, and the bytes it asked for.

Used where a training step runs (:mod:`memoplan.planner.profiling.shrink`) and where a model's factory
runs (:mod:`memoplan.specs`: a model too big to build is ``MP411``).
"""

from __future__ import annotations

import re

import torch

__all__ = ["is_out_of_memory", "wanted_bytes"]

# CPU: "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8388608 bytes";
# CUDA: "CUDA out of memory. Tried to allocate 20.00 MiB"; Python's own MemoryError too.
# oneDNN says "could not create a primitive" when it cannot allocate its own scratch memory.
_CPU_OOM = re.compile(
    r"can't allocate memory|not enough memory|out of memory|could not create a primitive", re.IGNORECASE
)
_CPU_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_CUDA_BYTES = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocator running out of memory (CPU, CUDA, or Python's MemoryError)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and bool(_CPU_OOM.search(str(exc)))


def wanted_bytes(exc: BaseException) -> int | None:
    """The bytes the failed allocation asked for, when the error says (None otherwise)."""
    text = str(exc)
    match = _CPU_BYTES.search(text)
    if match:
        return int(match.group(1))
    match = _CUDA_BYTES.search(text)
    if match:
        return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None
