"""Runtime stage: the built-in codecs' payload layouts, as pure tensor functions.

What each function writes is normative (see :mod:`memoplan.runtime.codecs`, whose registry
binds these functions to the codecs of :mod:`memoplan.enums` and adds validation).  Every
encoder takes the input flattened in C order and applies the ``validate = off`` rule; every
decoder returns a new flat tensor of the original dtype (never the payload's memory, so a
recompute that writes into its input in place cannot corrupt the payload).  CUDA tensors of
the dtypes the generated Triton kernels take go to :mod:`memoplan.runtime.kernels`.
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import _disable_current_modes

__all__ = [
    "BIT_TABLE_CACHE",
    "INT8_GROUP",
    "Data",
    "decode_bit",
    "decode_bool",
    "decode_int8",
    "decode_int8_flat",
    "decode_sparse",
    "decode_uint8",
    "encode_bit",
    "encode_bool",
    "encode_int8",
    "encode_sparse",
    "encode_uint8",
    "index_dtype",
    "kernels_take",
    "not_binary",
    "not_uint8",
    "stored_mask",
]

#: Elements per scale of the ``int8`` codec.
INT8_GROUP = 64
#: (device, dtype) -> the ``(256, 8)`` table :func:`decode_bit` looks bytes up in.
BIT_TABLE_CACHE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_BIT_WEIGHTS_CACHE: dict[torch.device, torch.Tensor] = {}

Data = tuple[torch.Tensor, ...]


def kernels_take(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` tensors on ``device`` go to the generated Triton kernels.

    Only CUDA tensors, and only when triton is installed; CPU tensors never import
    :mod:`memoplan.runtime.kernels`.
    """
    if device.type != "cuda":
        return False
    from memoplan.runtime.kernels import supports

    return supports(device, dtype)


# ---------------------------------------------------------------- what a codec holds


def not_binary(t: torch.Tensor) -> torch.Tensor:
    """Mask of the elements that are not exactly 0 or 1 (``bit``, ``bool``)."""
    if t.dtype == torch.bool:
        return torch.zeros_like(t)
    return ~((t == 0) | (t == 1))


def not_uint8(t: torch.Tensor) -> torch.Tensor:
    """Mask of the elements that are not integers in 0..255 (``uint8``)."""
    if t.dtype in (torch.bool, torch.uint8):
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    in_range = (t >= 0) & (t <= 255)
    if t.dtype.is_floating_point:
        in_range &= t == torch.round(t)  # NaN fails every comparison
    return ~in_range


def stored_mask(flat: torch.Tensor) -> torch.Tensor:
    """Elements whose bit pattern is not +0 (``-0.0`` and NaN included): what ``sparse`` stores."""
    if flat.dtype == torch.bool:
        return flat
    mask = flat != 0
    if flat.dtype.is_floating_point:
        mask |= torch.signbit(flat)
    return mask


def index_dtype(numel: int) -> torch.dtype:
    """``sparse``'s index dtype: int32 below 2**31 elements, else int64."""
    return torch.int32 if numel < 2**31 else torch.int64


# ---------------------------------------------------------------- bool, uint8


def encode_bool(flat: torch.Tensor) -> Data:
    return (flat != 0,)


def decode_bool(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return data[0].to(dtype, copy=True)


def encode_uint8(flat: torch.Tensor) -> Data:
    if kernels_take(flat.device, flat.dtype):
        from memoplan.runtime.kernels import uint8

        return (uint8.uint8_encode(flat),)
    if flat.dtype == torch.bool:
        return (flat.to(torch.uint8),)
    if flat.dtype.is_floating_point:
        # nan_to_num maps +-inf to the dtype's extremes, which the clamp then takes to 255/0.
        flat = torch.round(torch.nan_to_num(flat, nan=0.0))
    return (flat.clamp(0, 255).to(torch.uint8),)


def decode_uint8(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if kernels_take(data[0].device, dtype):
        from memoplan.runtime.kernels import uint8

        return uint8.uint8_decode(data[0], dtype)  # a new tensor, as below
    return data[0].to(dtype, copy=True)


# ---------------------------------------------------------------- bit


def encode_bit(flat: torch.Tensor) -> Data:
    if kernels_take(flat.device, flat.dtype):
        from memoplan.runtime.kernels import bit

        return (bit.bit_pack(flat),)
    n = flat.numel()
    bits = torch.zeros(n + (-n % 8), dtype=torch.bool, device=flat.device)
    torch.ne(flat, 0, out=bits[:n])
    if sys.byteorder != "little":
        return ((bits.view(torch.uint8).view(-1, 8) * _bit_weights(bits.device)).sum(dim=1, dtype=torch.uint8),)
    # Eight elements are one little-endian int64, element j at bit 8j; three
    # shift-and-or steps gather bit 8j into bit j of the low byte (j < 4, then j < 8).
    word = bits.view(torch.uint8).view(torch.int64)
    word = word | (word >> 7)
    word = word | (word >> 14)
    word = word | (word >> 28)
    return ((word & 0xFF).to(torch.uint8),)


def decode_bit(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    packed = data[0]
    if kernels_take(packed.device, dtype):
        from memoplan.runtime.kernels import bit

        return bit.bit_unpack(packed, numel, dtype)
    table = _bit_table(packed.device, dtype)  # row b: the 8 elements byte b holds
    out = torch.empty(numel, dtype=dtype, device=packed.device)
    whole = numel // 8
    torch.index_select(table, 0, packed[:whole].int(), out=out[: whole * 8].view(whole, 8))
    if whole * 8 < numel:  # the last, partly used byte
        out[whole * 8 :] = table.index_select(0, packed[whole:].int())[0, : numel - whole * 8]
    return out


def _bit_weights(device: torch.device) -> torch.Tensor:
    w = _BIT_WEIGHTS_CACHE.get(device)
    if w is None:
        with _disable_current_modes():  # a constant of the process, not of the step that first needs it
            w = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)
        _BIT_WEIGHTS_CACHE[device] = w
    return w


def _bit_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(256, 8)`` in ``dtype``: row ``b`` is bits 0..7 of ``b`` (what :func:`decode_bit` looks up)."""
    table = BIT_TABLE_CACHE.get((device, dtype))
    if table is None:
        # Made outside any dispatch mode: a constant of the process (8 KiB for float32),
        # not memory of the step that first decodes, nor a fake tensor under tracing.
        with _disable_current_modes():
            shifts = torch.arange(8, dtype=torch.int32, device=device)
            table = ((torch.arange(256, dtype=torch.int32, device=device).unsqueeze(1) >> shifts) & 1).to(dtype)
        BIT_TABLE_CACHE[(device, dtype)] = table
    return table


# ---------------------------------------------------------------- sparse


def encode_sparse(flat: torch.Tensor) -> Data:
    mask = stored_mask(flat)
    indices = mask.nonzero().view(-1)
    values = flat[indices]
    indices = indices.to(index_dtype(flat.numel()))
    if flat.dtype == torch.bool or bool((values == 1).all()):
        return (indices,)
    return (indices, values)


def decode_sparse(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = torch.zeros(numel, dtype=dtype, device=device)
    indices = data[0].to(torch.int64)
    if len(data) == 2:
        out[indices] = data[1]
    else:
        out[indices] = 1
    return out


# ---------------------------------------------------------------- int8 (lossy)


def encode_int8(flat: torch.Tensor) -> Data:
    n = flat.numel()
    groups = -(-n // INT8_GROUP)
    xf = flat.to(torch.float32)
    padded = torch.cat([xf, xf.new_zeros(groups * INT8_GROUP - n)]).view(groups, INT8_GROUP)
    finite = torch.where(torch.isfinite(padded), padded, padded.new_zeros(()))
    scales = finite.abs().amax(dim=1) / 127 if groups else xf.new_zeros(0)
    s = scales.unsqueeze(1)
    ratio = torch.where(s > 0, padded / torch.where(s > 0, s, 1), padded.new_zeros(()))
    q = torch.round(torch.nan_to_num(ratio, nan=0.0)).clamp(-127, 127).to(torch.int8)
    return (q.view(-1)[:n].clone(), scales)


def decode_int8_flat(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    per = scales.repeat_interleave(INT8_GROUP)[: q.numel()]
    return (q.to(torch.float32) * per).to(dtype)


def decode_int8(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return decode_int8_flat(data[0], data[1], dtype)
