"""Runtime stage: ops written into a given tensor without allocating — the arena module's own forms.

Many ATen ``out=`` overloads run the op into a tensor of their own and copy it into ``out``
(``relu.out``, ``embedding.out``, ``masked_fill.Scalar_out``), or compute another way than
the op does (``linear.out``: a matmul, then the bias added).  For such ops the arena module
calls the form here instead, named after the op it stands for: each computes on CPU
exactly what the op computes there — the same kernel on views of the same memory — but
writes into ``out``.  Nothing is taken on trust: capture uses a form for a step only after
it gave the op's bits on the captured values and on other values, and allocated nothing
inside (``memoplan.memonger.capture``); otherwise the step keeps the op as the model called it.

``scalar(value, dtype)``: a number passed where an op takes a tensor (``x * 0.5``) is
wrapped in a fresh 0-dim tensor on every call; the arena module passes one made once.

Every form raises (``RuntimeError``, ``ValueError``) for arguments it does not cover, such
as inputs whose strides a view cannot merge; capture then keeps the op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["FORMS", "scalar"]


_MADE: dict[tuple, torch.Tensor] = {}


def scalar(value: bool | int | float, dtype: torch.dtype) -> torch.Tensor:
    """A 0-dim CPU tensor holding ``value``, made once per value and dtype, never written.

    Kept by the value's type and ``repr``: ``-0.0`` and ``0.0`` (or ``True`` and ``1``) are equal
    as dictionary keys but not as operands.
    """
    key = (type(value), repr(value), dtype)
    made = _MADE.get(key)
    if made is None:
        with torch.inference_mode(False), torch.no_grad():
            made = _MADE[key] = torch.tensor(value, dtype=dtype)
    return made


def _flat(tensor: torch.Tensor, *tail: int) -> torch.Tensor:
    """``tensor`` seen as ``(-1, *tail)`` without a copy (``view`` raises where one would be needed)."""
    return tensor.view(-1, *tail)


def relu(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.relu``: torch computes it as ``clamp_min(x, 0)``, whose ``out=`` kernel is its own."""
    return torch.clamp_min(x, 0, out=out)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, out: torch.Tensor
) -> torch.Tensor:
    """``aten.linear`` as torch runs it on a contiguous input: one matrix product over the flattened
    leading dimensions, the bias added by ``addmm``."""
    rows = _flat(x, x.shape[-1])
    into = _flat(out, weight.shape[0])
    if bias is None:
        torch.mm(rows, weight.t(), out=into)
    else:
        torch.addmm(bias, rows, weight.t(), out=into)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.matmul`` where it is one ``mm`` (a matrix on the right) or one ``bmm`` (equal batch
    dimensions that merge without a copy)."""
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError("matmul of vectors: no form")
    if b.dim() == 2:
        torch.mm(_flat(a, a.shape[-1]), b, out=_flat(out, b.shape[-1]))
    elif a.dim() == b.dim() and a.shape[:-2] == b.shape[:-2]:
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        torch.bmm(_flat(a, m, k), _flat(b, k, n), out=_flat(out, m, n))
    else:
        raise ValueError("matmul with broadcast batch dimensions: no form")
    return out


def embedding(
    weight: torch.Tensor,
    indices: torch.Tensor,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    """``aten.embedding``: the rows of ``weight`` that ``indices`` name (``index_select``)."""
    torch.index_select(weight, 0, indices.view(-1), out=_flat(out, weight.shape[1]))
    return out


def masked_fill(x: torch.Tensor, mask: torch.Tensor, value, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.masked_fill``: torch clones ``x`` and fills it in place; here the clone is ``out``."""
    out.copy_(x)
    return out.masked_fill_(mask, value)


def reshape(x: torch.Tensor, shape, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.reshape`` where it copies (strides no view can express): the values, in order, into ``out``."""
    out.view(x.shape).copy_(x)
    return out


def clone(x: torch.Tensor, *, memory_format=None, out: torch.Tensor) -> torch.Tensor:
    """``aten.clone``: a copy into ``out``, which has the strides the clone would have."""
    return out.copy_(x)


def contiguous(x: torch.Tensor, *, memory_format=torch.contiguous_format, out: torch.Tensor) -> torch.Tensor:
    """``aten.contiguous`` where it copies: the values into ``out``, laid out as asked."""
    return out.copy_(x)


def to_copy(
    x: torch.Tensor,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking: bool = False,
    memory_format=None,
    out: torch.Tensor,
) -> torch.Tensor:
    """``aten._to_copy`` (``x.float()``, ``x.to(dtype)``) on one device: a converting copy into ``out``."""
    if device is not None and torch.device(device) != x.device or pin_memory:
        raise ValueError("a copy to another device or into pinned memory: no form")
    return out.copy_(x)


def batch_norm(
    x: torch.Tensor,
    weight,
    bias,
    running_mean,
    running_var,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
    *,
    out: torch.Tensor,
) -> torch.Tensor:
    """``aten.batch_norm`` in eval mode, as torch runs it on CPU: ``native_batch_norm`` with the
    running statistics (its saved mean and inverse deviation are empty in eval mode)."""
    if training or running_mean is None or running_var is None or x.device.type != "cpu":
        raise ValueError("batch norm with batch statistics, or off the CPU: no form")
    empty = out.new_empty(0)
    torch.ops.aten.native_batch_norm.out(
        x, weight, bias, running_mean, running_var, False, momentum, eps, out=out, save_mean=empty, save_invstd=empty
    )
    return out


def adaptive_avg_pool2d(x: torch.Tensor, output_size, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.adaptive_avg_pool2d`` to one value per channel, which torch computes as a mean over
    the last two dimensions."""
    if tuple(output_size) != (1, 1):
        raise ValueError("adaptive pooling to more than one value per channel: no form")
    return torch.mean(x, (-1, -2), keepdim=True, out=out)


def bitwise_and(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.__and__`` (``a & b``), which torch runs as ``bitwise_and``."""
    return torch.bitwise_and(a, b, out=out)


def bitwise_or(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """``aten.__or__`` (``a | b``), which torch runs as ``bitwise_or``."""
    return torch.bitwise_or(a, b, out=out)


# The ATen op (``namespace.name.overload``) each form stands for.
FORMS: dict[str, Callable[..., torch.Tensor]] = {
    "aten.relu.default": relu,
    "aten.linear.default": linear,
    "aten.matmul.default": matmul,
    "aten.embedding.default": embedding,
    "aten.masked_fill.Scalar": masked_fill,
    "aten.masked_fill.Tensor": masked_fill,
    "aten.reshape.default": reshape,
    "aten.clone.default": clone,
    "aten.contiguous.default": contiguous,
    "aten._to_copy.default": to_copy,
    "aten.batch_norm.default": batch_norm,
    "aten.adaptive_avg_pool2d.default": adaptive_avg_pool2d,
    "aten.__and__.Tensor": bitwise_and,
    "aten.__or__.Tensor": bitwise_or,
}
