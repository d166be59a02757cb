"""Runtime stage: codecs that keep a checkpointed region's saved input in a compact form.

A plan line ``compress input = bit`` makes a region store its input as a
:class:`Payload` instead of the full tensor and rebuild it with :func:`decode`
for the recompute.  This module is the pure-torch reference: a later GPU kernel
must produce **byte-identical payload tensors** and raise on exactly the same
inputs, so every layout and every rule below is normative.

Codecs (``codec`` is a plain string, or a :class:`memoplan.enums.Codec` or any
value whose ``.value`` is one of these)::

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

**The registry.**  Each codec is one :class:`RuntimeCodec` (its
:class:`memoplan.enums.CodecSpec`, encoder, decoder, byte count and what it holds),
registered under the spec's name with :func:`register`; :func:`encode`, :func:`decode`,
:func:`choose` and :func:`estimate_nbytes` dispatch through it.  The payload layouts
themselves are pure functions in :mod:`memoplan.runtime.codec_impls`.  ``auto``'s
per-region choice (first call, agreement across ranks, widening) is :func:`encode_auto`.

The checks of values a codec cannot hold (``validate``, :class:`CodecError`) are
:mod:`memoplan.runtime.codec_checks` (its names re-exported here).

This module imports only ``torch``, the standard library,
:mod:`memoplan.diagnostics` and :mod:`memoplan.enums` (leaves),
:mod:`memoplan.runtime.codec_impls` and :mod:`memoplan.runtime.codec_checks`, because generated
plan code imports it.  CUDA
tensors of the dtypes in :data:`memoplan.runtime.kernels.DTYPES` go to the
generated Triton kernels of :mod:`memoplan.runtime.kernels` (imported on first
use, only when triton is installed) for ``bit`` and ``uint8``; they write the
same bytes and raise on the same inputs.  CPU tensors always take the torch
code below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from memoplan.enums import Codec as _LanguageCodec
from memoplan.enums import CodecSpec, codec_specs, register_codec, unregister_codec, widening_order
from memoplan.runtime import codec_impls as impls
from memoplan.runtime.codec_checks import (
    SAMPLE_LIMIT,
    CodecError,
    check_int8,
    check_values,
    dtype_error,
    full_check,
    mark_validated,
    not_held,
    reset_validation,
    sample_indices,
)
from memoplan.runtime.codec_impls import INT8_GROUP, Data

__all__ = [
    "CODECS",  # noqa: F822 (module __getattr__: follows the registry)
    "HEADER_BYTES",
    "INT8_GROUP",
    "LOSSLESS",  # noqa: F822 (module __getattr__: follows the registry)
    "SAMPLE_LIMIT",
    "VALIDATE_MODES",
    "CodecError",
    "Payload",
    "RuntimeCodec",
    "agree",
    "choose",
    "decode",
    "encode",
    "encode_auto",
    "estimate_nbytes",
    "is_binary",
    "register",
    "registered",
    "reset_validation",
    "runs",
    "sample_indices",
    "unregister",
    "widen",
]

VALIDATE_MODES: tuple[str, ...] = ("off", "sample", "always")
#: Bytes counted for a payload's metadata in :attr:`Payload.nbytes` (it lives on the host).
HEADER_BYTES = 0


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
        return _REGISTRY[self.codec].spec.lossless


# ---------------------------------------------------------------- the registry


def _never(dtype: torch.dtype) -> bool:
    return False


@dataclass(frozen=True)
class RuntimeCodec:
    """One codec's implementation, registered under ``spec.name`` by :func:`register`.

    ``encode(flat)`` takes the input flattened in C order and applies the ``validate = off``
    rule; ``decode(data, numel, dtype, device)`` returns a new flat tensor;
    ``data_nbytes(numel, dtype, nnz, binary)`` is the payload's bytes (``nnz``: elements
    ``sparse`` stores, ``binary``: whether they are all 1).  ``invalid(flat)`` is the mask of
    the values it cannot hold (``None``: it holds anything), skipped for dtypes
    ``holds_dtype`` says it holds whole; ``what`` names those values in ``MP405``.
    ``check(flat, data, mode, where, tolerance)`` replaces ``invalid`` by a check of the
    payload (``int8``); ``fused(flat, mode, where)`` may encode and check in one pass (or
    return None).  ``keeps_input``: the payload is the input itself (``none``).
    """

    spec: CodecSpec
    encode: Callable[[torch.Tensor], Data]
    decode: Callable[[Data, int, torch.dtype, torch.device], torch.Tensor]
    data_nbytes: Callable[[int, torch.dtype, int | None, bool], int]
    invalid: Callable[[torch.Tensor], torch.Tensor] | None = None
    holds_dtype: Callable[[torch.dtype], bool] = _never
    what: str = ""
    floating_only: bool = False
    check: Callable[[torch.Tensor, Data, str, str, float | None], None] | None = None
    fused: Callable[[torch.Tensor, str, str], Data | None] | None = None
    keeps_input: bool = False

    @property
    def name(self) -> str:
        return self.spec.name


_REGISTRY: dict[str, RuntimeCodec] = {}


def register(codec: RuntimeCodec) -> RuntimeCodec:
    """Make ``codec`` encodable; a codec the language does not know yet is added to it too."""
    if codec.spec.chooses:
        raise ValueError(f"`{codec.name}` chooses among the codecs; it has no implementation of its own")
    if codec.name in _REGISTRY:
        raise ValueError(f"codec {codec.name!r} already has an implementation")
    if codec.name not in {spec.name for spec in codec_specs()}:
        register_codec(codec.spec)
    _REGISTRY[codec.name] = codec
    return codec


def unregister(name: str) -> None:
    """Remove a codec registered by :func:`register`, from the runtime and the language."""
    _REGISTRY.pop(name, None)
    unregister_codec(name)


def registered() -> tuple[str, ...]:
    """The codecs this runtime implements, in the language's order."""
    return tuple(spec.name for spec in codec_specs() if spec.name in _REGISTRY)


def runs(codec: Any) -> bool:
    """Whether a plan may name ``codec``: the runtime implements it, or it is ``auto``."""
    name = getattr(codec, "value", codec)
    spec = next((s for s in codec_specs() if s.name == name), None)
    return spec is not None and (spec.chooses or name in _REGISTRY)


def __getattr__(name: str) -> tuple[str, ...]:
    # CODECS and LOSSLESS follow the registry, so a codec registered later is in them.
    if name == "CODECS":
        return registered()
    if name == "LOSSLESS":
        return tuple(n for n in registered() if _REGISTRY[n].spec.lossless)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- public API


def encode(
    x: torch.Tensor,
    codec: Any,
    *,
    validate: Any = "sample",
    where: str = "<input>",
    tolerance: float | None = None,
) -> Payload:
    """Encode ``x`` with ``codec``; see the module docstring for layouts and rules.

    ``codec="auto"`` encodes with :func:`choose` (a per-call, per-rank choice:
    callers that need agreement across ranks use :func:`encode_auto`).
    ``tolerance`` bounds the realised max abs error of ``int8`` (ignored by the
    lossless codecs) and is checked unless ``validate="off"``.
    Raises :class:`CodecError` (``MP405``) for values the codec cannot hold.
    """
    name = _name(codec, _names(auto=True), "codec")
    mode = _name(validate, VALIDATE_MODES, "validate")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"encode() expects a tensor, got {type(x).__name__}")
    impl = _REGISTRY[choose(x)] if name not in _REGISTRY else _REGISTRY[name]
    if impl.keeps_input:
        return Payload(impl.name, (x,), x.shape, x.dtype, x.device, None)
    if x.is_complex() or (impl.floating_only and not x.dtype.is_floating_point):
        raise dtype_error(x, impl, where)
    src = x.detach()
    flat = src.reshape(-1)
    data = impl.fused(flat, mode, where) if impl.fused is not None and mode != "off" else None
    if data is None:
        if impl.check is None and mode != "off":
            check_values(flat, impl, mode, where)
        data = impl.encode(flat)
        if impl.check is not None and mode != "off":
            impl.check(flat, data, mode, where, tolerance)
    return Payload(impl.name, data, x.shape, x.dtype, x.device, _dense_stride(src))


def decode(payload: Payload) -> torch.Tensor:
    """Rebuild the tensor: same shape, dtype and device (bit-exact for lossless codecs).

    ``none`` returns the stored tensor itself.  Other codecs return a new tensor
    that shares no memory with the payload (so decoding twice, as a second
    backward does, gives the same result even if the first was modified in
    place), with the original strides when they were dense (``payload.stride``), else a
    contiguous one.  The result does not require grad.
    """
    impl = _REGISTRY[payload.codec]
    if impl.keeps_input:
        return payload.data[0]
    flat = impl.decode(payload.data, payload.numel, payload.dtype, payload.device)
    out = flat.reshape(payload.shape)
    if payload.stride is not None:
        out = torch.empty_strided(payload.shape, payload.stride, dtype=payload.dtype, device=payload.device).copy_(out)
    return out


def is_binary(x: torch.Tensor) -> bool:
    """Whether every element of ``x`` is exactly 0 or 1 (``-0.0`` counts as 0; empty: True)."""
    if x.dtype == torch.bool or x.numel() == 0:
        return True
    if x.is_complex():
        return False
    return not bool(impls.not_binary(x.detach()).any())


def choose(x: torch.Tensor) -> str:
    """The lossless codec with the smallest payload that ``x`` allows.

    Candidates: the codecs ``auto`` may pick (:func:`memoplan.enums.widening_order`:
    ``bit``/``bool`` if :func:`is_binary`, ``uint8`` if every value is an integer in
    0..255, ``sparse`` and ``none`` always); sizes are :attr:`Payload.nbytes` of the
    payload each would produce; ties go to the cheapest to encode (``none, bit, bool,
    uint8, sparse``: :attr:`CodecSpec.cost`).  In practice: ``bit`` for dense
    binary data, ``sparse`` for binary data below 1/32 density or other data
    below the break-even density, ``uint8`` for small integers, else ``none``.
    The result is a function of the values alone (deterministic), but different
    ranks see different values: agree on it across DDP ranks before encoding.
    """
    candidates = [_REGISTRY[name] for name in widening_order() if name in _REGISTRY]
    if x.is_complex():
        return candidates[-1].name
    flat = x.detach().reshape(-1)
    stored = flat[impls.stored_mask(flat)]
    nnz, ones = stored.numel(), bool((stored == 1).all())
    fits: dict[Callable[[torch.Tensor], torch.Tensor], bool] = {}
    sizes: dict[str, tuple[int, int]] = {}
    for impl in candidates:
        if impl.invalid is not None and not impl.holds_dtype(flat.dtype):
            if impl.invalid not in fits:
                fits[impl.invalid] = not bool(impl.invalid(flat).any())
            if not fits[impl.invalid]:
                continue
        sizes[impl.name] = (impl.data_nbytes(flat.numel(), x.dtype, nnz, ones), impl.spec.cost)
    return min(sizes, key=sizes.__getitem__)


def estimate_nbytes(
    codec: Any,
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
    name = _name(codec, _names(auto=False), "codec")
    return _REGISTRY[name].data_nbytes(numel, dtype, nnz, binary) + HEADER_BYTES


# ---------------------------------------------------------------- auto


def encode_auto(x: torch.Tensor, chosen: dict[str, str], where: str) -> Payload | None:
    """``compress input = auto`` for the region at ``where``: its payload, or None to keep ``x``.

    ``chosen`` maps ``where`` to the codec of the region's first call (:func:`choose`, then
    :func:`agree` across ranks).  Every call is checked in full: an input that codec cannot
    hold widens the choice (:func:`widen`) instead of being stored wrongly.  (A rank that
    widens alone changes its memory use, never the results.)
    """
    codec = chosen.get(where)
    if codec is None:
        codec = chosen[where] = agree(choose(x))
    try:
        payload = encode(x, codec, validate="always", where=where)
    except CodecError:
        codec = chosen[where] = widen(codec, choose(x))
        payload = encode(x, codec, validate="always", where=where)
    return None if _REGISTRY[codec].keeps_input else payload


def widen(a: str, b: str) -> str:
    """The more general of two codecs ``auto`` may pick (it holds everything the other holds)."""
    order = widening_order()
    return max(a, b, key=order.index)


def agree(codec: str) -> str:
    """Under torch.distributed, every rank takes the most general codec any rank needs."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return codec
    order = list(widening_order())
    rank = torch.tensor([order.index(codec)], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        rank = rank.cuda()
    dist.all_reduce(rank, op=dist.ReduceOp.MAX)
    return order[int(rank.item())]


def _fused_bit_check(flat: torch.Tensor, mode: str, where: str) -> Data | None:
    """``bit`` on the kernels with a full check due: pack and check in one pass; else None.

    A sampled check (``sample`` after the first call) stays on the torch path, which
    reads only the sample, so the kernels raise on exactly the inputs torch raises on.
    """
    if flat.dtype == torch.bool or flat.numel() == 0:
        return None
    if not impls.kernels_take(flat.device, flat.dtype) or not full_check(flat, "bit", mode, where):
        return None
    from memoplan.runtime.kernels import bit

    packed, index = bit.bit_pack_checked(flat)
    if index is not None:
        raise not_held(flat, _REGISTRY["bit"], where, index)
    if mode == "sample":
        mark_validated(where, "bit")
    return (packed,)


# ---------------------------------------------------------------- helpers


def _names(*, auto: bool) -> tuple[str, ...]:
    """The codec names a call accepts: the implemented ones, then ``auto`` where it applies."""
    chooses = tuple(spec.name for spec in codec_specs() if spec.chooses) if auto else ()
    return registered() + chooses


def _name(value: Any, allowed: tuple[str, ...], what: str) -> str:
    name = value if isinstance(value, str) else getattr(value, "value", value)
    if name not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {', '.join(allowed)}")
    return name


def _dense_stride(x: torch.Tensor) -> tuple[int, ...] | None:
    """``x``'s strides if they are a dense, non-overlapping, non-contiguous layout, else None."""
    if x.is_contiguous() or x.numel() == 0:
        return None
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(x.shape, x.stride()) if s != 1), key=lambda d: d[1]):
        if stride != expected:
            return None
        expected *= size
    return tuple(x.stride())


# ---------------------------------------------------------------- the built-in codecs


def _itemsize_bytes(numel: int, dtype: torch.dtype, nnz: int | None, binary: bool) -> int:
    return numel * torch.empty((), dtype=dtype).element_size()


def _byte_each(numel: int, dtype: torch.dtype, nnz: int | None, binary: bool) -> int:
    return numel


def _bit_bytes(numel: int, dtype: torch.dtype, nnz: int | None, binary: bool) -> int:
    return (numel + 7) // 8


def _sparse_bytes(numel: int, dtype: torch.dtype, nnz: int | None, binary: bool) -> int:
    if nnz is None:
        raise ValueError("estimate_nbytes('sparse', ...) needs nnz=")
    itemsize = torch.empty((), dtype=dtype).element_size()
    return nnz * (impls.index_dtype(numel).itemsize + (0 if binary or dtype == torch.bool else itemsize))


def _int8_bytes(numel: int, dtype: torch.dtype, nnz: int | None, binary: bool) -> int:
    return numel + 4 * ((numel + INT8_GROUP - 1) // INT8_GROUP)


def _is_bool(dtype: torch.dtype) -> bool:
    return dtype == torch.bool


def _is_byte(dtype: torch.dtype) -> bool:
    return dtype in (torch.bool, torch.uint8)


def _keep(flat: torch.Tensor) -> Data:
    return (flat,)


def _kept(data: Data, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return data[0]


_ZERO_ONE = "exactly 0 or 1"
for _impl in (
    RuntimeCodec(_LanguageCodec.NONE.spec, _keep, _kept, _itemsize_bytes, keeps_input=True),
    RuntimeCodec(_LanguageCodec.BOOL.spec, impls.encode_bool, impls.decode_bool, _byte_each,
                 impls.not_binary, _is_bool, _ZERO_ONE),
    RuntimeCodec(_LanguageCodec.UINT8.spec, impls.encode_uint8, impls.decode_uint8, _byte_each,
                 impls.not_uint8, _is_byte, "integers in 0..255"),
    RuntimeCodec(_LanguageCodec.BIT.spec, impls.encode_bit, impls.decode_bit, _bit_bytes,
                 impls.not_binary, _is_bool, _ZERO_ONE, fused=_fused_bit_check),
    RuntimeCodec(_LanguageCodec.SPARSE.spec, impls.encode_sparse, impls.decode_sparse, _sparse_bytes),
    RuntimeCodec(_LanguageCodec.INT8.spec, impls.encode_int8, impls.decode_int8, _int8_bytes,
                 floating_only=True, check=check_int8),
):  # fmt: skip
    register(_impl)
del _impl
