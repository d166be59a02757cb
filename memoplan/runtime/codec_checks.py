"""Values a codec cannot hold (``MP405``, :class:`CodecError`): the check of every element on a
region's first call, of :func:`sample_indices` after it (``validate = sample``), or of every call
(``validate = always``); the ``int8`` codec's finite values and ``tolerance``.  The rules are those
of :mod:`memoplan.runtime.codecs`'s docstring; its :func:`~memoplan.runtime.codecs.encode` calls
these checks.

Like :mod:`memoplan.runtime.codecs`, this module imports only ``torch``, the standard library and
the leaves, because generated plan code imports it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.runtime import codec_impls as impls
from memoplan.runtime.codec_impls import INT8_GROUP, Data

#: Most elements checked per call by ``validate="sample"`` after the first call.
SAMPLE_LIMIT = 65_536

_validated: set[tuple[str, str]] = set()
_validated_lock = threading.Lock()

_HELP = (
    "keep the full input with `compress input = none`, use `compress input = uint8` "
    "for small integers, `compress input = auto` to pick a codec the input allows, "
    "or accept bounded error with `compress input = int8 lossy tolerance = ...`"
)


class Checked(Protocol):
    """What a check reads of a codec (a :class:`~memoplan.runtime.codecs.RuntimeCodec`)."""

    @property
    def name(self) -> str: ...
    @property
    def invalid(self) -> Callable[[torch.Tensor], torch.Tensor] | None: ...
    @property
    def holds_dtype(self) -> Callable[[torch.dtype], bool]: ...
    @property
    def what(self) -> str: ...
    @property
    def floating_only(self) -> bool: ...


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


def check_values(flat: torch.Tensor, impl: Checked, mode: str, where: str) -> None:
    """Raise CodecError for the first value ``impl`` cannot hold among the checked ones."""
    if impl.invalid is None or impl.holds_dtype(flat.dtype) or flat.numel() == 0:
        return
    full = full_check(flat, impl.name, mode, where)
    step = 1 if full else _sample_step(flat.numel())
    checked = flat if step == 1 else flat[::step]
    bad = impl.invalid(checked)
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        raise not_held(flat, impl, where, j * step)
    if full and mode == "sample":
        mark_validated(where, impl.name)


def full_check(flat: torch.Tensor, codec: str, mode: str, where: str) -> bool:
    """Whether this call checks every element (else only :func:`sample_indices`)."""
    return mode == "always" or (where, codec) not in _validated or flat.numel() <= SAMPLE_LIMIT


def mark_validated(where: str, codec: str) -> None:
    with _validated_lock:
        _validated.add((where, codec))


def not_held(flat: torch.Tensor, impl: Checked, where: str, index: int) -> CodecError:
    """The MP405 error for ``flat[index]``, a value ``impl`` cannot hold."""
    return _value_error(
        where,
        impl.name,
        index,
        _py(flat[index]),
        f"`{where}`: codec `{impl.name}` holds only {impl.what}, "
        f"but the input has {_show(flat[index])} at flat index {index}",
    )


def check_int8(flat: torch.Tensor, data: Data, mode: str, where: str, tolerance: float | None) -> None:
    if flat.numel() == 0:
        return
    key = (where, "int8")
    full = mode == "always" or key not in _validated or flat.numel() <= SAMPLE_LIMIT
    step = 1 if full else _sample_step(flat.numel())
    idx = None if step == 1 else sample_indices(flat.numel(), flat.device)
    orig = flat if idx is None else flat[idx]
    nonfinite = ~torch.isfinite(orig)
    if bool(nonfinite.any()):
        index = int(nonfinite.nonzero()[0, 0]) * step
        raise _value_error(
            where,
            "int8",
            index,
            _py(flat[index]),
            f"`{where}`: codec `int8` holds only finite values, "
            f"but the input has {_show(flat[index])} at flat index {index}",
        )
    if tolerance is not None:
        q, scales = data
        if idx is None:
            got = impls.decode_int8_flat(q, scales, flat.dtype)
        else:
            got = (q[idx].to(torch.float32) * scales[idx // INT8_GROUP]).to(flat.dtype)
        err = (got.to(torch.float64) - orig.to(torch.float64)).abs()
        worst = int(err.argmax())
        if float(err[worst]) > tolerance:
            index = worst * step
            raise _value_error(
                where,
                "int8",
                index,
                _py(flat[index]),
                f"`{where}`: codec `int8` error {float(err[worst]):.6g} exceeds "
                f"tolerance {tolerance:g} at flat index {index} (value {_show(flat[index])})",
            )
    if full and mode == "sample":
        mark_validated(where, "int8")


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


def dtype_error(x: torch.Tensor, impl: Checked, where: str) -> CodecError:
    need = "a floating-point" if impl.floating_only else "a real"
    return CodecError(
        (
            Diagnostic(
                code="MP405",
                message=f"`{where}`: codec `{impl.name}` needs {need} input, got {x.dtype}",
                help=_HELP,
            ),
        ),
        where=where,
        codec=impl.name,
    )


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
