"""Runtime stage: codecs that keep a checkpointed region's saved input in a compact form.

A plan line ``compress input = bit`` makes a region store its input as a
:class:`Payload` instead of the full tensor and rebuild it with :func:`decode`
for the recompute.  This module is the pure-torch reference: a later GPU kernel
must produce **byte-identical payload tensors** and raise on exactly the same
inputs, so every layout and every rule below is normative.

Codecs (``codec`` is a plain string; any enum whose ``.value`` is one of these,
such as ``memoplan.syntax.ast.Codec``, is accepted too)::

    codec   lossless  holds                        payload.data (all 1-D, C order)
    none    yes       anything                     (x,)             -- x itself, no copy
    bool    yes       0 and 1                      (bits,)          bool[numel]
    uint8   yes       integers 0..255              (values,)        uint8[numel]
    bit     yes       0 and 1                      (packed,)        uint8[ceil(numel / 8)]
    sparse  yes       anything                     (indices,) or (indices, values)
    int8    no        finite floats                (q, scales)      int8[numel], float32[ceil(numel / 64)]

*C order* means the element order of ``x.reshape(-1)``: payloads do not depend
on ``x``'s strides.  :func:`decode` restores the original strides when they
were dense (transposes, channels-last), because a recompute that sees another
memory format may pick other kernels and round differently.

``bit``
    Element ``i`` is bit ``i % 8`` (least significant bit first) of byte
    ``i // 8``; the bits of the last byte past ``numel`` are zero.  So
    ``[1,0,1,1,0,0,0,0, 1]`` packs to ``[0b00001101, 0b00000001]``.
``sparse``
    ``indices``: the ascending C-order positions of the *stored* elements,
    ``int32`` when ``numel < 2**31``, else ``int64``.  An element is stored when
    its bit pattern is not ``+0``: ``x != 0`` or ``signbit(x)`` (so ``-0.0`` and
    NaN are kept exactly).  ``values``: those elements in ``x.dtype``; omitted
    (a one-tensor payload) when every stored element equals 1, and always for
    ``bool`` inputs.  Sparse is smaller than ``none`` only below a break-even
    density (stored elements / numel) of ``itemsize / 4`` when the values are
    omitted and ``itemsize / (4 + itemsize)`` otherwise (int32 indices):

    * float64: always when binary (8/4), 0.667 general;
    * float32: 1.0 when binary (never larger), 0.5 general;
    * float16 / bfloat16: 0.5 when binary, 0.333 general;
    * bool / uint8: 0.25 when binary, 0.2 general.

    Against ``bit`` a binary tensor needs density < 1/32 (4-byte index vs 1/8 byte).
``int8`` (lossy)
    Groups of :data:`INT8_GROUP` (64) consecutive C-order elements; the last
    group is short when ``numel % 64 != 0`` (it is *not* padded in ``q``).  With
    ``xf = x.to(float32)``: ``scale[g] = max(|xf|) over the group's finite
    elements / 127`` (float32 IEEE division; 0 for an all-zero group);
    ``q[i] = clamp(round_half_even(nan_to_num(xf[i] / scale[g], nan=0)), -127, 127)``
    with a true IEEE float32 division, and ``q[i] = 0`` where ``scale[g] == 0``.
    Decoding is ``(q.to(float32) * scale[g]).to(dtype)``.  The error is at most
    ``scale/2`` per element, up to the float32 rounding of the division and
    product and the rounding of the output dtype; ``tolerance=`` checks the
    realised error (see below).

Values a codec cannot hold
    ``bit``/``bool`` hold exactly 0 and 1; ``uint8`` the integers 0..255;
    ``int8`` finite values (within ``tolerance`` when one is given).  Values are
    compared numerically, so ``-0.0`` is a valid 0 and decodes as ``+0.0``
    (the only bit pattern these three codecs do not keep; ``none`` and
    ``sparse`` keep every bit pattern).  With ``validate``:

    * ``"always"`` -- every element is checked on every call;
    * ``"sample"`` (the default) -- every element on the first call for a given
      ``(where, codec)`` in this process (until it passes), then only the
      subset :func:`sample_indices` (C-order positions ``0, s, 2s, ...`` with
      ``s = ceil(numel / 65536)``, at most 65,536 of them; all of them when
      ``numel <= 65536``).  A bad value outside the subset is not detected and
      is encoded by the ``"off"`` rule;
    * ``"off"`` -- nothing is checked and the result is still defined:
      ``bit``/``bool`` store ``x != 0`` (any non-zero, NaN included, decodes as
      1: neither truncation nor rounding, so 0.7 -> 1 and -3 -> 1);
      ``uint8`` stores ``clamp(round_half_even(x), 0, 255)`` with NaN -> 0,
      ``+inf`` -> 255, ``-inf`` -> 0; ``int8`` applies the rule above
      (NaN -> 0, ``+-inf`` -> ``+-127`` or 0 when the group's scale is 0).

    A check that fails raises :class:`CodecError` (``MP405``) naming ``where``,
    the codec, the first offending value found and its flat C-order index.

``Payload.nbytes`` counts the bytes of the payload tensors plus
:data:`HEADER_BYTES`, which is **0**: shape, dtype, device and layout live in
the host-side Python object, not in device memory, so ``nbytes`` equals what a
storage-tracking memory meter sees the payload keep alive.  ``bit`` is
therefore exactly ``ceil(numel / 8)`` bytes: 32x below float32, 16x below
float16/bfloat16, 8x below bool whenever ``numel % 8 == 0``.

This module imports only ``torch``, the standard library and
:mod:`memoplan.diagnostics`, because generated plan code imports it.  CUDA
tensors of the dtypes in :data:`memoplan.runtime.kernels.DTYPES` go to the
generated Triton kernels of :mod:`memoplan.runtime.kernels` (imported on first
use, only when triton is installed) for ``bit`` and ``uint8``; they write the
same bytes and raise on the same inputs.  CPU tensors always take the torch
code below.
"""

from __future__ import annotations

import enum
import math
import sys
import threading
from dataclasses import dataclass
from typing import Union

import torch
from torch.utils._python_dispatch import _disable_current_modes

from memoplan.diagnostics import Diagnostic, PlanError

__all__ = [
    "CODECS",
    "HEADER_BYTES",
    "INT8_GROUP",
    "LOSSLESS",
    "SAMPLE_LIMIT",
    "VALIDATE_MODES",
    "CodecError",
    "Payload",
    "choose",
    "decode",
    "encode",
    "estimate_nbytes",
    "is_binary",
    "reset_validation",
    "sample_indices",
]

#: Every codec :func:`encode` accepts besides ``"auto"``.
CODECS: tuple[str, ...] = ("none", "bool", "uint8", "bit", "sparse", "int8")
#: Codecs whose :func:`decode` is exact (up to the sign of zero for bool/uint8/bit).
LOSSLESS: tuple[str, ...] = ("none", "bool", "uint8", "bit", "sparse")
VALIDATE_MODES: tuple[str, ...] = ("off", "sample", "always")
#: Bytes counted for a payload's metadata in :attr:`Payload.nbytes` (it lives on the host).
HEADER_BYTES = 0
#: Most elements checked per call by ``validate="sample"`` after the first call.
SAMPLE_LIMIT = 65_536
#: Elements per scale of the ``int8`` codec.
INT8_GROUP = 64

CodecLike = Union[str, enum.Enum]

# Tie-break order of choose(): cheapest to encode first.
_CHOICE_ORDER = ("none", "bit", "bool", "uint8", "sparse")
_BIT_WEIGHTS_CACHE: dict[torch.device, torch.Tensor] = {}
_BIT_TABLE_CACHE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_validated: set[tuple[str, str]] = set()
_validated_lock = threading.Lock()

_HELP = (
    "keep the full input with `compress input = none`, use `compress input = uint8` "
    "for small integers, `compress input = auto` to pick a codec the input allows, "
    "or accept bounded error with `compress input = int8 lossy tolerance = ...`"
)


@dataclass(eq=False)
class CodecError(PlanError):
    """An input a codec cannot hold (``MP405``); raised by :func:`encode`.

    ``where`` is the module path given to :func:`encode`, ``index`` the flat
    C-order index of the offending element and ``value`` its value (both
    ``None`` when the problem is the dtype).
    """

    where: str = ""
    codec: str = ""
    index: int | None = None
    value: float | int | bool | None = None


@dataclass(frozen=True, eq=False)
class Payload:
    """An encoded tensor: everything :func:`decode` needs, and nothing else.

    ``data`` holds the codec's tensors in the order given in the module
    docstring.  ``shape``/``dtype``/``device`` describe the original tensor;
    ``stride`` is the original strides when they were a dense non-contiguous
    layout (a permutation such as channels-last or a transpose), which
    :func:`decode` restores so that a recompute sees the layout the forward saw,
    and ``None`` otherwise (decode returns a contiguous tensor).
    """

    codec: str
    data: tuple[torch.Tensor, ...]
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    stride: tuple[int, ...] | None = None

    @property
    def data_nbytes(self) -> int:
        """Bytes of the payload tensors (``numel * element_size`` each)."""
        return sum(t.numel() * t.element_size() for t in self.data)

    @property
    def nbytes(self) -> int:
        """:attr:`data_nbytes` plus :data:`HEADER_BYTES` (0)."""
        return self.data_nbytes + HEADER_BYTES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def lossless(self) -> bool:
        return self.codec in LOSSLESS


# ---------------------------------------------------------------- public API


def encode(
    x: torch.Tensor,
    codec: CodecLike,
    *,
    validate: CodecLike = "sample",
    where: str = "<input>",
    tolerance: float | None = None,
) -> Payload:
    """Encode ``x`` with ``codec``; see the module docstring for layouts and rules.

    ``codec="auto"`` encodes with :func:`choose` (a per-call, per-rank choice:
    callers that need agreement across ranks choose first and pass the result).
    ``tolerance`` bounds the realised max abs error of ``int8`` (ignored by the
    lossless codecs) and is checked unless ``validate="off"``.
    Raises :class:`CodecError` (``MP405``) for values the codec cannot hold.
    """
    name = _name(codec, CODECS + ("auto",), "codec")
    mode = _name(validate, VALIDATE_MODES, "validate")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"encode() expects a tensor, got {type(x).__name__}")
    if name == "auto":
        name = choose(x)
    if name == "none":
        return Payload("none", (x,), x.shape, x.dtype, x.device, None)
    if x.is_complex() or (name == "int8" and not x.dtype.is_floating_point):
        raise _dtype_error(x, name, where)
    src = x.detach()
    flat = src.reshape(-1)
    if name == "int8":
        data = _encode_int8(flat)
        if mode != "off":
            _check_int8(flat, data, mode, where, tolerance)
    else:
        fused = _fused_bit_check(flat, name, mode, where) if mode != "off" else None
        if fused is not None:
            data = fused
        else:
            if mode != "off":
                _check_values(flat, name, mode, where)
            data = _ENCODERS[name](flat)
    return Payload(name, data, x.shape, x.dtype, x.device, _dense_stride(src))


def decode(payload: Payload) -> torch.Tensor:
    """Rebuild the tensor: same shape, dtype and device (bit-exact for lossless codecs).

    ``none`` returns the stored tensor itself.  Other codecs return a new tensor
    that shares no memory with the payload (so decoding twice, as a second
    backward does, gives the same result even if the first was modified in
    place), with the original strides when they were dense (``payload.stride``), else a
    contiguous one.  The result does not require grad.
    """
    if payload.codec == "none":
        return payload.data[0]
    flat = _DECODERS[payload.codec](payload)
    out = flat.reshape(payload.shape)
    if payload.stride is not None:
        out = torch.empty_strided(
            payload.shape, payload.stride, dtype=payload.dtype, device=payload.device
        ).copy_(out)
    return out


def is_binary(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is exactly 0 or 1 (``-0.0`` counts as 0; empty: True)."""
    if x.dtype == torch.bool or x.numel() == 0:
        return True
    if x.is_complex():
        return False
    return not bool(_not_binary(x.detach()).any())


def choose(x: torch.Tensor) -> str:
    """The lossless codec with the smallest payload that ``x`` allows.

    Candidates: ``bit``/``bool`` if :func:`is_binary`, ``uint8`` if every value
    is an integer in 0..255, ``sparse`` and ``none`` always; sizes are
    :attr:`Payload.nbytes` of the payload each would produce; ties go to the
    first of ``none, bit, bool, uint8, sparse``.  In practice: ``bit`` for dense
    binary data, ``sparse`` for binary data below 1/32 density or other data
    below the break-even density, ``uint8`` for small integers, else ``none``.
    The result is a function of the values alone (deterministic), but different
    ranks see different values: agree on it across DDP ranks before encoding.
    """
    if x.is_complex():
        return "none"
    flat = x.detach().reshape(-1)
    numel = flat.numel()
    binary = is_binary(flat)
    sizes = {"none": estimate_nbytes("none", numel, x.dtype)}
    if binary:
        sizes["bit"] = estimate_nbytes("bit", numel, x.dtype)
        sizes["bool"] = estimate_nbytes("bool", numel, x.dtype)
    if binary or not bool(_not_uint8(flat).any()):
        sizes["uint8"] = estimate_nbytes("uint8", numel, x.dtype)
    stored = flat[_stored_mask(flat)]
    sizes["sparse"] = estimate_nbytes(
        "sparse", numel, x.dtype, nnz=stored.numel(), binary=bool((stored == 1).all())
    )
    best = min(sizes.values())
    return next(c for c in _CHOICE_ORDER if sizes.get(c) == best)


def estimate_nbytes(
    codec: CodecLike,
    numel: int,
    dtype: torch.dtype,
    *,
    nnz: int | None = None,
    binary: bool = True,
) -> int:
    """:attr:`Payload.nbytes` of encoding ``numel`` elements of ``dtype`` with ``codec``.

    ``sparse`` needs ``nnz`` (stored elements) and ``binary`` (whether the values
    are omitted).  For the planner: no tensor is needed.
    """
    name = _name(codec, CODECS, "codec")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if name == "none":
        data = numel * itemsize
    elif name in ("bool", "uint8"):
        data = numel
    elif name == "bit":
        data = (numel + 7) // 8
    elif name == "int8":
        data = numel + 4 * ((numel + INT8_GROUP - 1) // INT8_GROUP)
    else:
        if nnz is None:
            raise ValueError("estimate_nbytes('sparse', ...) needs nnz=")
        per = _index_dtype(numel).itemsize + (0 if binary or dtype == torch.bool else itemsize)
        data = nnz * per
    return data + HEADER_BYTES


def sample_indices(numel: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The C-order positions ``validate="sample"`` checks after the first call.

    ``arange(0, numel, s)`` with ``s = max(1, ceil(numel / SAMPLE_LIMIT))``: at most
    :data:`SAMPLE_LIMIT` positions, every one of them when ``numel <= SAMPLE_LIMIT``.
    """
    return torch.arange(0, numel, _sample_step(numel), device=device)


def reset_validation(where: str | None = None) -> None:
    """Forget which ``where`` had their full first check (all of them when ``None``)."""
    with _validated_lock:
        if where is None:
            _validated.clear()
        else:
            for key in [k for k in _validated if k[0] == where]:
                _validated.discard(key)


# ---------------------------------------------------------------- validation


def _check_values(flat: torch.Tensor, codec: str, mode: str, where: str) -> None:
    """Raise CodecError for the first value ``codec`` cannot hold among the checked ones."""
    if codec == "sparse" or flat.dtype == torch.bool or flat.numel() == 0:
        return
    if codec == "uint8" and flat.dtype == torch.uint8:
        return
    invalid = _not_uint8 if codec == "uint8" else _not_binary
    full = _full_check(flat, codec, mode, where)
    step = 1 if full else _sample_step(flat.numel())
    checked = flat if step == 1 else flat[::step]
    bad = invalid(checked)
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise _not_held(flat, codec, where, j * step)
    if full and mode == "sample":
        _mark_validated(where, codec)


def _full_check(flat: torch.Tensor, codec: str, mode: str, where: str) -> bool:
    """Whether this call checks every element (else only :func:`sample_indices`)."""
    return mode == "always" or (where, codec) not in _validated or flat.numel() <= SAMPLE_LIMIT


def _mark_validated(where: str, codec: str) -> None:
    with _validated_lock:
        _validated.add((where, codec))


def _not_held(flat: torch.Tensor, codec: str, where: str, index: int) -> CodecError:
    """The MP405 error for ``flat[index]``, a value ``codec`` (bit, bool or uint8) cannot hold."""
    what = "exactly 0 or 1" if codec in ("bit", "bool") else "integers in 0..255"
    return _value_error(
        where,
        codec,
        index,
        _py(flat[index]),
        f"`{where}`: codec `{codec}` holds only {what}, "
        f"but the input has {_show(flat[index])} at flat index {index}",
    )


def _kernels_take(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` tensors on ``device`` go to the generated Triton kernels.

    Only CUDA tensors, and only when triton is installed; CPU tensors never import
    :mod:`memoplan.runtime.kernels`.
    """
    if device.type != "cuda":
        return False
    from memoplan.runtime.kernels import supports

    return supports(device, dtype)


def _fused_bit_check(
    flat: torch.Tensor, codec: str, mode: str, where: str
) -> tuple[torch.Tensor, ...] | None:
    """``bit`` on the kernels with a full check due: pack and check in one pass; else None.

    A sampled check (``sample`` after the first call) stays on the torch path, which
    reads only the sample, so the kernels raise on exactly the inputs torch raises on.
    """
    if codec != "bit" or flat.dtype == torch.bool or flat.numel() == 0:
        return None
    if not _kernels_take(flat.device, flat.dtype) or not _full_check(flat, codec, mode, where):
        return None
    from memoplan.runtime.kernels import bit

    packed, index = bit.bit_pack_checked(flat)
    if index is not None:
        raise _not_held(flat, codec, where, index)
    if mode == "sample":
        _mark_validated(where, codec)
    return (packed,)


def _check_int8(
    flat: torch.Tensor,
    data: tuple[torch.Tensor, ...],
    mode: str,
    where: str,
    tolerance: float | None,
) -> None:
    if flat.numel() == 0:
        return
    key = (where, "int8")
    full = mode == "always" or key not in _validated or flat.numel() <= SAMPLE_LIMIT
    step = 1 if full else _sample_step(flat.numel())
    idx = None if step == 1 else sample_indices(flat.numel(), flat.device)
    orig = flat if idx is None else flat[idx]
    nonfinite = ~torch.isfinite(orig)
    if bool(nonfinite.any()):
        j = int(nonfinite.nonzero()[0, 0])
        index = j * step
        value = _py(flat[index])
        raise _value_error(
            where,
            "int8",
            index,
            value,
            f"`{where}`: codec `int8` holds only finite values, "
            f"but the input has {_show(flat[index])} at flat index {index}",
        )
    if tolerance is not None:
        q, scales = data
        if idx is None:
            got = _decode_int8_flat(q, scales, flat.dtype)
        else:
            got = (q[idx].to(torch.float32) * scales[idx // INT8_GROUP]).to(flat.dtype)
        err = (got.to(torch.float64) - orig.to(torch.float64)).abs()
        worst = int(err.argmax())
        if float(err[worst]) > tolerance:
            index = worst * step
            value = _py(flat[index])
            raise _value_error(
                where,
                "int8",
                index,
                value,
                f"`{where}`: codec `int8` error {float(err[worst]):.6g} exceeds "
                f"tolerance {tolerance:g} at flat index {index} (value {_show(flat[index])})",
            )
    if full and mode == "sample":
        with _validated_lock:
            _validated.add(key)


def _not_binary(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return torch.zeros_like(t)
    return ~((t == 0) | (t == 1))


def _not_uint8(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bool, torch.uint8):
        return torch.zeros(t.shape, dtype=torch.bool, device=t.device)
    in_range = (t >= 0) & (t <= 255)
    if t.dtype.is_floating_point:
        in_range &= t == torch.round(t)  # NaN fails every comparison
    return ~in_range


def _sample_step(numel: int) -> int:
    return max(1, -(-numel // SAMPLE_LIMIT))


def _value_error(where: str, codec: str, index: int, value, message: str) -> CodecError:
    return CodecError(
        (Diagnostic(code="MP405", message=message, help=_HELP),),
        where=where,
        codec=codec,
        index=index,
        value=value,
    )


def _dtype_error(x: torch.Tensor, codec: str, where: str) -> CodecError:
    need = "a floating-point" if codec == "int8" else "a real"
    return CodecError(
        (
            Diagnostic(
                code="MP405",
                message=f"`{where}`: codec `{codec}` needs {need} input, got {x.dtype}",
                help=_HELP,
            ),
        ),
        where=where,
        codec=codec,
    )


# ---------------------------------------------------------------- codecs


def _encode_bool(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (flat != 0,)


def _decode_bool(p: Payload) -> torch.Tensor:
    # copy=True: a recompute that writes into its input in place must not corrupt the payload.
    return p.data[0].to(p.dtype, copy=True)


def _encode_uint8(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if _kernels_take(flat.device, flat.dtype):
        from memoplan.runtime.kernels import uint8

        return (uint8.uint8_encode(flat),)
    if flat.dtype == torch.bool:
        return (flat.to(torch.uint8),)
    if flat.dtype.is_floating_point:
        # nan_to_num maps +-inf to the dtype's extremes, which the clamp then takes to 255/0.
        flat = torch.round(torch.nan_to_num(flat, nan=0.0))
    return (flat.clamp(0, 255).to(torch.uint8),)


def _decode_uint8(p: Payload) -> torch.Tensor:
    if _kernels_take(p.data[0].device, p.dtype):
        from memoplan.runtime.kernels import uint8

        return uint8.uint8_decode(p.data[0], p.dtype)  # a new tensor, as below
    return p.data[0].to(p.dtype, copy=True)


def _encode_bit(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if _kernels_take(flat.device, flat.dtype):
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


def _decode_bit(p: Payload) -> torch.Tensor:
    if _kernels_take(p.data[0].device, p.dtype):
        from memoplan.runtime.kernels import bit

        return bit.bit_unpack(p.data[0], p.numel, p.dtype)
    packed = p.data[0]
    table = _bit_table(packed.device, p.dtype)  # row b: the 8 elements byte b holds
    out = torch.empty(p.numel, dtype=p.dtype, device=packed.device)
    whole = p.numel // 8
    torch.index_select(table, 0, packed[:whole].int(), out=out[: whole * 8].view(whole, 8))
    if whole * 8 < p.numel:  # the last, partly used byte
        out[whole * 8 :] = table.index_select(0, packed[whole:].int())[0, : p.numel - whole * 8]
    return out


def _encode_sparse(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mask = _stored_mask(flat)
    indices = mask.nonzero().view(-1)
    values = flat[indices]
    indices = indices.to(_index_dtype(flat.numel()))
    if flat.dtype == torch.bool or bool((values == 1).all()):
        return (indices,)
    return (indices, values)


def _decode_sparse(p: Payload) -> torch.Tensor:
    out = torch.zeros(p.numel, dtype=p.dtype, device=p.device)
    indices = p.data[0].to(torch.int64)
    if len(p.data) == 2:
        out[indices] = p.data[1]
    else:
        out[indices] = 1
    return out


def _encode_int8(flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
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


def _decode_int8_flat(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    per = scales.repeat_interleave(INT8_GROUP)[: q.numel()]
    return (q.to(torch.float32) * per).to(dtype)


def _decode_int8(p: Payload) -> torch.Tensor:
    return _decode_int8_flat(p.data[0], p.data[1], p.dtype)


_ENCODERS = {
    "bool": _encode_bool,
    "uint8": _encode_uint8,
    "bit": _encode_bit,
    "sparse": _encode_sparse,
}
_DECODERS = {
    "bool": _decode_bool,
    "uint8": _decode_uint8,
    "bit": _decode_bit,
    "sparse": _decode_sparse,
    "int8": _decode_int8,
}


# ---------------------------------------------------------------- helpers


def _name(value: CodecLike, allowed: tuple[str, ...], what: str) -> str:
    name = value.value if isinstance(value, enum.Enum) else value
    if name not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")
    return name


def _stored_mask(flat: torch.Tensor) -> torch.Tensor:
    """Elements whose bit pattern is not +0 (``-0.0`` and NaN included)."""
    if flat.dtype == torch.bool:
        return flat
    mask = flat != 0
    if flat.dtype.is_floating_point:
        mask |= torch.signbit(flat)
    return mask


def _index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def _dense_stride(x: torch.Tensor) -> tuple[int, ...] | None:
    """``x``'s strides if they are a dense, non-overlapping, non-contiguous layout, else None."""
    if x.is_contiguous() or x.numel() == 0:
        return None
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(x.shape, x.stride()) if s != 1), key=lambda d: d[1]
    ):
        if stride != expected:
            return None
        expected *= size
    return tuple(x.stride())


def _bit_weights(device: torch.device) -> torch.Tensor:
    w = _BIT_WEIGHTS_CACHE.get(device)
    if w is None:
        with _disable_current_modes():  # a constant of the process, not of the step that first needs it
            w = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)
        _BIT_WEIGHTS_CACHE[device] = w
    return w


def _bit_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(256, 8)`` in ``dtype``: row ``b`` is bits 0..7 of ``b`` (what :func:`_decode_bit` looks up)."""
    table = _BIT_TABLE_CACHE.get((device, dtype))
    if table is None:
        # Made outside any dispatch mode: a constant of the process (8 KiB for float32),
        # not memory of the step that first decodes, nor a fake tensor under tracing.
        with _disable_current_modes():
            shifts = torch.arange(8, dtype=torch.int32, device=device)
            table = ((torch.arange(256, dtype=torch.int32, device=device).unsqueeze(1) >> shifts) & 1).to(dtype)
        _BIT_TABLE_CACHE[(device, dtype)] = table
    return table


def _py(t: torch.Tensor) -> float | int | bool:
    return t.item()


def _show(t: torch.Tensor) -> str:
    """The shortest decimal that reads back as the element ``t`` in its dtype (0.7, not 0.69999...)."""
    value = t.item()
    if not t.dtype.is_floating_point or not math.isfinite(value):
        return repr(value)
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if torch.tensor(float(text), dtype=t.dtype).item() == value:
            return text
    return repr(value)
