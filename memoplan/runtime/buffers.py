"""Runtime stage: commit buffer updates once per step, however often a region is recomputed.

Recomputing a checkpointed region re-runs its forward, and with it every buffer
update: BatchNorm running statistics and ``num_batches_tracked`` move twice per
step (pytorch/pytorch#96136, still open; also Tencent/YOLO-Master#262 and
fairscale#1035), and a module whose output depends on a counter buffer sees
the already-advanced counter and recomputes different values.

:class:`BufferGuard` supplies the ``context_fn`` pair for
``torch.utils.checkpoint``:

* forward context: before the region runs, copy the buffers it is known to
  change (all of them on a module's first call); afterwards keep the copies of
  the ones that did change, the values the forward saw.
* recompute context: point each of those buffers at a fresh clone of that
  pre-forward value, so the recompute sees exactly what the forward saw and
  writes its updates into a throw-away tensor; then, in a ``finally`` (the
  recompute may stop early by raising), put the real tensor objects back.

Which buffers a region changes is learned on its first call per training mode
and cached per module, so later steps copy only those (usually a few small
BatchNorm vectors), not e.g. large constant masks.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from memoplan.diagnostics import warn

__all__ = ["BufferGuard"]

# root module -> {module.training: qualified names of the buffers its forward changes}.
# Weak keys: the cache must not keep models alive; a deep copy learns afresh.
_LEARNED: weakref.WeakKeyDictionary[nn.Module, dict[bool, frozenset[str]]] = weakref.WeakKeyDictionary()

_Context = contextlib.AbstractContextManager[None]

# Marks a buffer name absent from ``_buffers`` at recompute time (deleted since).
_ABSENT = object()


@dataclass
class _Before:
    """One buffer as it was just before the region's forward."""

    root: nn.Module
    qualname: str
    owner: nn.Module
    name: str
    tensor: torch.Tensor
    version: int
    copy: torch.Tensor | None


class BufferGuard:
    """The forward/recompute context pair for one checkpointed call of ``roots``."""

    def __init__(self, roots: Sequence[nn.Module]) -> None:
        self._roots = tuple(roots)
        # (owner, buffer name) -> the value the forward saw; None if it was not copied.
        self._seen: dict[tuple[nn.Module, str], torch.Tensor | None] = {}

    def contexts(self) -> tuple[_Context, _Context]:
        """``context_fn`` for ``torch.utils.checkpoint.checkpoint``."""
        return self._forward(), _Recompute(self._seen)

    @contextlib.contextmanager
    def _forward(self) -> Iterator[None]:
        before: list[_Before] = []
        with torch.no_grad():
            for root in self._roots:
                learned = _LEARNED.get(root, {}).get(root.training)
                for qualname, owner, name, tensor in _buffers(root):
                    wanted = learned is None or qualname in learned
                    before.append(
                        _Before(
                            root,
                            qualname,
                            owner,
                            name,
                            tensor,
                            tensor._version,
                            tensor.clone() if wanted else None,
                        )
                    )
        yield
        self._record(before)

    def _record(self, before: list[_Before]) -> None:
        changed: dict[nn.Module, set[str]] = {root: set() for root in self._roots}
        for b in before:
            now = b.owner._buffers.get(b.name)
            in_place = b.tensor._version != b.version
            # Some kernels write buffers without bumping their version counter
            # (native_batch_norm's running_mean/running_var), so also compare values.
            rewritten = b.copy is not None and not torch.equal(b.copy, b.tensor)
            if now is b.tensor and not in_place and not rewritten:
                continue
            changed[b.root].add(b.qualname)
            if b.copy is not None:
                self._seen[(b.owner, b.name)] = b.copy
            elif not in_place:
                # Reassigned (``self.n = self.n + 1``): the old object still holds the old value.
                self._seen[(b.owner, b.name)] = b.tensor
            else:
                warn(
                    f"memoplan: buffer `{b.qualname}` of a checkpointed "
                    f"{type(b.root).__name__} changed for the first time after its first "
                    "call; it is still updated once, but this recompute sees its new value",
                    RuntimeWarning,
                )
                self._seen[(b.owner, b.name)] = None
        for root, names in changed.items():
            per_mode = _LEARNED.setdefault(root, {})
            per_mode[root.training] = per_mode.get(root.training, frozenset()) | names


class _Recompute:
    """Recompute context: swap in clones of the pre-forward values, restore on exit.

    A class, not a generator: checkpoint enters the same context object once per
    recompute, and a region is recomputed again for every ``retain_graph`` backward.
    """

    def __init__(self, seen: dict[tuple[nn.Module, str], torch.Tensor | None]) -> None:
        self._seen = seen
        self._restore: list[list[tuple[nn.Module, str, object]]] = []

    def __enter__(self) -> None:
        restore: list[tuple[nn.Module, str, object]] = []
        self._restore.append(restore)
        with torch.no_grad():
            for (owner, name), seen in self._seen.items():
                current = owner._buffers.get(name, _ABSENT)
                source = seen if seen is not None else current
                if not isinstance(source, torch.Tensor):
                    continue
                restore.append((owner, name, current))
                # A fresh clone each time, since each recompute writes its updates into it.
                owner._buffers[name] = source.clone()

    def __exit__(self, *exc_info: object) -> None:
        # Runs on every exit, including the early-stop exception checkpoint raises to
        # end a recompute once it has what backward needs.
        for owner, name, current in reversed(self._restore.pop()):
            if current is _ABSENT:
                owner._buffers.pop(name, None)
            else:
                owner._buffers[name] = current  # type: ignore[assignment]


def _buffers(root: nn.Module) -> Iterator[tuple[str, nn.Module, str, torch.Tensor]]:
    """(qualified name, owning module, name in owner, tensor) for every buffer under ``root``."""
    for prefix, module in root.named_modules():
        for name, tensor in module._buffers.items():
            if tensor is not None:
                yield (f"{prefix}.{name}" if prefix else name), module, name, tensor
