"""Comparison of a planned step's results with the unplanned step's: structured values by their tensors.

One function, :func:`compare`, used by ``memoplan verify``, the property tests and the
benchmarks.  It takes two tables of named values (``{"outputs": output}``, or the
gradients by parameter name) and walks every value down to its leaves:

* tuples, lists and ``torch.Size`` by index (``outputs[0]``), named tuples and
  dataclasses (transformers' ``ModelOutput``) by field (``outputs.logits``), other
  mappings by key (``outputs['y']``);
* any other object by its attributes (``__dict__`` and ``__slots__``), so a
  transformers ``DynamicCache`` is compared by the tensors it holds:
  ``outputs.past_key_values.layers[1].keys``;
* tensors, numbers, strings, ``None``, dtypes and devices are leaves; functions,
  classes and modules (``nn.Module`` too) are compared by their qualified name, never
  walked.

A leaf or a container type present in one run only, or a container of another type,
is a difference.  Tensors must have the same shape, dtype and device; equal values
are bit for bit (``torch.equal``; NaN where the other run has NaN too counts as
equal), and with ``rtol > 0`` a floating-point tensor whose largest absolute
difference is at most ``rtol`` times the largest unplanned magnitude of the whole
table (its category: outputs, gradients, buffers) is "within".  Differences are
listed in the unplanned value's order, so the first one named is the first
differing leaf of the output.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["Check", "compare", "flatten"]

#: Deeper than this, a value is compared by its type only (a guard against runaway recursion).
MAX_DEPTH = 64

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
_NAMED = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, nn.Module)


@dataclass(frozen=True)
class Check:
    """One category of the comparison, e.g. gradients: how many leaves compared, which differ."""

    name: str
    compared: int
    differences: tuple[str, ...] = ()
    within: tuple[str, ...] = ()  # tensors that differ, but within the tolerance
    #: The largest max |planned - unplanned| / max |unplanned| of the category over its differing
    #: leaves: 0.0 when all are bit for bit, inf where a difference has no size (a shape, a None).
    largest: float = 0.0

    @property
    def equal(self) -> bool:
        return not self.differences

    @property
    def exact(self) -> bool:
        """Equal bit for bit, not only within the tolerance."""
        return self.equal and not self.within


@dataclass(frozen=True)
class _Kind:
    """A container's type, recorded at its path so that a tuple never equals a list of the same leaves."""

    name: str


def flatten(named: Mapping[str, Any]) -> dict[str, Any]:
    """``{path: leaf}`` for every leaf of every named value, in order; containers appear as their kinds."""
    out: dict[str, Any] = {}
    for name, value in named.items():
        _walk(value, str(name), out, set(), 0)
    return out


def compare(name: str, expected: Mapping[str, Any], actual: Mapping[str, Any], rtol: float = 0.0) -> Check:
    """Compare two tables of named values leaf by leaf; ``expected`` is the unplanned run's."""
    a, b = flatten(expected), flatten(actual)
    scale = max(
        (_magnitude(v) for v in a.values() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()),
        default=0.0,
    )
    differences: list[str] = []
    within: list[str] = []
    largest = 0.0
    for key in list(a) + [k for k in b if k not in a]:
        if key not in a or key not in b:
            differences.append(f"{key}: only in the {'planned' if key in b else 'unplanned'} run")
            largest = math.inf
            continue
        line, close = _difference(a[key], b[key], scale, name)
        if line is None:
            continue
        largest = max(largest, math.inf if close is None or not scale else close / scale)
        (within if close is not None and close <= rtol * scale else differences).append(f"{key}: {line}")
    compared = sum(1 for v in a.values() if not isinstance(v, _Kind))
    return Check(name, compared, tuple(differences), tuple(within), largest)


def _magnitude(v: torch.Tensor) -> float:
    """The largest finite-or-infinite magnitude in ``v``, NaN ignored, without a copy of ``v``
    (``aminmax``) unless it holds NaN."""
    low, high = (t.item() for t in v.detach().aminmax())
    if math.isnan(low) or math.isnan(high):
        return v.detach().double().abs().nan_to_num(nan=0.0).max().item()
    return max(abs(low), abs(high))


def _difference(x: Any, y: Any, scale: float, category: str) -> tuple[str | None, float | None]:
    """(how ``x`` and ``y`` differ or None, and the float tensors' max abs difference or None)."""
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"{tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}", None
        if x.device != y.device:
            return f"on {x.device} vs on {y.device}", None
        if torch.equal(x, y):
            return None, None
        if not x.is_floating_point() and not x.is_complex():
            return "values differ", None
        x, y = x.detach(), y.detach()
        nan = x.isnan()
        if not torch.equal(nan, y.isnan()):
            return "NaN in one run only", None
        if nan.any():  # NaN where the other run has NaN too is the same result
            x, y = x.masked_fill(nan, 0), y.masked_fill(nan, 0)
            if torch.equal(x, y):
                return None, None
        wide = torch.complex128 if x.is_complex() else torch.float64  # no overflow in half precision
        diff = (x.to(wide) - y.to(wide)).abs().max().item()
        ratio = f"{diff / scale:.2g}" if scale else "inf"
        return f"max abs difference {diff:.3g} ({ratio} x max |unplanned {category}|)", diff
    if _same(x, y):
        return None, None
    return f"{_short(x)} vs {_short(y)}", None


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or type(x) is not type(y):
        return False
    if isinstance(x, float) and x != x:
        return y != y  # NaN equals NaN here: the same computation gave it
    try:
        return bool(x == y)
    except Exception:  # noqa: BLE001 - a leaf whose == raises or is ambiguous is compared by repr
        return repr(x) == repr(y)


def _walk(value: Any, path: str, out: dict[str, Any], active: set[int], depth: int) -> None:
    if isinstance(value, torch.Tensor) or isinstance(value, _SCALARS):
        out[path] = value
        return
    if isinstance(value, _NAMED):
        out[path] = _Kind(_type_name(value if isinstance(value, type) else type(value)) + " " + _qualname(value))
        return
    out[path] = _Kind(_type_name(type(value)))
    if id(value) in active or depth >= MAX_DEPTH:
        return  # a cycle, or too deep: its type was recorded
    active.add(id(value))
    try:
        for key, child in _children(value):
            _walk(child, path + key, out, active, depth + 1)
    finally:
        active.discard(id(value))


def _children(value: Any) -> list[tuple[str, Any]]:
    """The parts of a container or object, each with the path suffix that names it."""
    if dataclasses.is_dataclass(value):
        return [(f".{f.name}", getattr(value, f.name, None)) for f in dataclasses.fields(value)]
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return [(f".{field}", getattr(value, field)) for field in value._fields]
    if isinstance(value, (tuple, list)):
        return [(f"[{i}]", child) for i, child in enumerate(value)]
    if isinstance(value, Mapping):
        return [(f"[{key!r}]", child) for key, child in value.items()]
    if isinstance(value, (set, frozenset)):
        return [("{}", sorted(map(repr, value)))]
    attrs: dict[str, Any] = {}
    for cls in reversed(type(value).__mro__):
        for slot in (
            [cls.__dict__["__slots__"]]
            if isinstance(cls.__dict__.get("__slots__"), str)
            else cls.__dict__.get("__slots__", ())
        ):
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                attrs[slot] = getattr(value, slot)
    attrs.update(getattr(value, "__dict__", {}))
    return [(f".{key}", child) for key, child in attrs.items()]


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _qualname(value: Any) -> str:
    return getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or ""


def _short(value: Any) -> str:
    if isinstance(value, _Kind):
        return value.name
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    return repr(value)[:60]
