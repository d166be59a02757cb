"""Runtime stage: the ``memory`` block — gradients in one flat buffer, CUDA allocator settings.

``atomic_clean_policy = 0`` keeps every trainable parameter's gradient as a view of
one flat buffer per device and dtype, so zeroing all of them is one fill.  The values
are PyTorch's own, bit for bit:

* a gradient that autograd creates (the first backward, or any backward after
  ``zero_grad(set_to_none=True)``, PyTorch's default) is copied into the parameter's
  slot by a post-accumulate hook, and ``param.grad`` becomes the slot (a copy is exact);
* a backward onto an existing gradient adds into it in place, which is what autograd
  does to any gradient it finds (gradient accumulation);
* ``model.zero_grad(set_to_none=False)`` fills each buffer with zeros once, instead of
  one zeroing per parameter; ``set_to_none=True`` sets the gradients to ``None`` as
  PyTorch does, so optimizers skip the parameters that get no gradient, and the buffer
  stays allocated for the next backward.

Parameters that are frozen, sparse, not contiguous or already sharded (DTensor) keep
their own gradients.  A gradient with a graph of its own (``create_graph=True``) is left
where autograd put it.  Under DDP, gradients are copied into and out of the slots
(``gradient_as_bucket_view=False``); with ``gradient_as_bucket_view=True`` DDP keeps
them in its own flat buckets, and under FSDP2 ``fully_shard`` replaces the parameters:
the first forward then stops with an error that says so (``MP421``, ``MP422``) rather
than leave the buffer unused.

``static_memory_policy`` configures PyTorch's CUDA caching allocator (2: reserve the
plan's byte budget at the first forward on CUDA, 3: expandable segments, 4: both).  It
acts only in a process with CUDA; :func:`allocator_plan` decides, from what the
allocator has already done, whether it can act, and says why not.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memoplan.diagnostics import Diagnostic, PlanError

__all__ = ["FlatGradients", "MemorySettings", "allocator_plan", "install_memory", "uninstall_memory"]

# The key in the root module's ``__dict__`` under which the installed settings live.
MEMORY_ATTR = "_memoplan_memory"


@dataclass(frozen=True)
class MemorySettings:
    """The ``memory`` block as the generated module passes it to :func:`memoplan.runtime.install`."""

    static_memory_policy: int = 0
    atomic_clean_policy: int = 0
    reserve_bytes: int | None = None  # the plan's budget in bytes, reserved by policies 2 and 4


class FlatGradients:
    """One flat gradient buffer per (device, dtype) for ``params``; each parameter's slot is a view."""

    def __init__(self, model: nn.Module, params: list[nn.Parameter], owners=None) -> None:
        self.root = model
        self.params = tuple(params)
        self.slots: dict[int, torch.Tensor] = {}
        self.buffers: list[torch.Tensor] = []
        groups: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = {}
        for param in self.params:
            groups.setdefault((param.device, param.dtype), []).append(param)
        for (device, dtype), members in groups.items():
            flat = torch.zeros(sum(p.numel() for p in members), device=device, dtype=dtype)
            offset = 0
            for param in members:
                self.slots[id(param)] = flat[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
            self.buffers.append(flat)
        # Where each parameter is registered, to notice when something replaces it (FSDP2).
        if owners is None:
            owners = tuple(
                (module, name, param)
                for module in model.modules()
                for name, param in module._parameters.items()
                if param is not None and id(param) in self.slots
            )
        self.owners = owners
        self.handles = []
        with torch.no_grad():
            for param in self.params:
                if param.grad is not None:
                    self.adopt(param)
                self.handles.append(param.register_post_accumulate_grad_hook(self.adopt))

    def adopt(self, param: torch.Tensor) -> None:
        """Move a gradient autograd just created into its slot (an exact copy)."""
        slot = self.slots[id(param)]
        grad = param.grad
        if grad is None or grad is slot or grad.requires_grad or grad.layout is not torch.strided:
            return
        if grad.shape != slot.shape or grad.dtype != slot.dtype or grad.device != slot.device:
            return
        with torch.no_grad():
            slot.copy_(grad)
        param.grad = slot

    def zero_grad(self, model: nn.Module, set_to_none: bool) -> None:
        """``nn.Module.zero_grad``, with one fill per buffer instead of one zeroing per slot."""
        if set_to_none:
            nn.Module.zero_grad(model, set_to_none=True)  # PyTorch's own; the buffer stays for the next backward
            return
        for flat in self.buffers:
            flat.zero_()
        for param in model.parameters():
            grad = param.grad
            if grad is None or grad is self.slots.get(id(param)):
                continue
            if grad.grad_fn is not None:
                grad.detach_()
            else:
                grad.requires_grad_(False)
            grad.zero_()

    def check(self) -> None:
        """Before each forward: refuse the wrappers that take the gradients over."""
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel._get_active_ddp_module()
        if ddp is not None and ddp.gradient_as_bucket_view:
            raise PlanError(
                (
                    Diagnostic(
                        "MP421",
                        "`memory { atomic_clean_policy = 0 }` under DDP with `gradient_as_bucket_view=True`: "
                        "DDP keeps the gradients in its own flat buckets",
                        help="keep DDP's buckets (write `atomic_clean_policy = 1`), or wrap with "
                        "`gradient_as_bucket_view=False`",
                    ),
                )
            )
        for module, name, param in self.owners:
            if module._parameters.get(name) is not param:
                raise PlanError(
                    (
                        Diagnostic(
                            "MP422",
                            "`memory { atomic_clean_policy = 0 }`: the parameters were replaced after the plan "
                            "was applied (FSDP2 `fully_shard` does this), so the flat gradient buffer no longer "
                            "holds their gradients",
                            help="FSDP2 keeps sharded gradients itself: write `atomic_clean_policy = 1` "
                            "(or leave out the memory block)",
                        ),
                    )
                )

    def release(self) -> None:
        """Remove the hooks; each gradient in a slot becomes a tensor of its own, as PyTorch keeps it."""
        for handle in self.handles:
            handle.remove()
        with torch.no_grad():
            for param in self.params:
                if param.grad is self.slots[id(param)]:
                    param.grad = param.grad.clone()

    def __reduce__(self):
        raise TypeError(
            "memoplan: a model with `memory { atomic_clean_policy = 0 }` cannot be pickled: its gradients live "
            "in a flat buffer held by hooks. Save `model.state_dict()`, or `memoplan.remove(model)` first"
        )

    def __deepcopy__(self, memo):
        # The record is the root's last attribute, so by now the model's modules and
        # parameters are copied (they are in ``memo``, the root's ``__dict__`` not filled
        # in yet): the copy gets a buffer and hooks of its own over the copied parameters.
        copied = [memo.get(id(x)) for x in (self.root, *self.params, *(m for m, _, _ in self.owners))]
        if any(x is None for x in copied):
            raise TypeError("memoplan: the flat gradient buffer can only be copied with its model")
        owners = tuple((memo[id(m)], name, memo[id(p)]) for m, name, p in self.owners)
        return FlatGradients(memo[id(self.root)], [memo[id(p)] for p in self.params], owners)


def _zero_grad(self: nn.Module, set_to_none: bool = True) -> None:
    """``zero_grad`` of a model whose gradients live in a flat buffer (memoplan ``memory`` block)."""
    self.__dict__[MEMORY_ATTR].flat.zero_grad(self, set_to_none)


def flat_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters ``atomic_clean_policy = 0`` puts in the flat buffer, in ``parameters()`` order."""
    from torch.distributed.tensor import DTensor

    return [
        p
        for p in model.parameters()
        if p.requires_grad and p.layout is torch.strided and p.is_contiguous() and not isinstance(p, DTensor)
    ]


@dataclass
class InstalledMemory:
    """What :func:`install_memory` put on a model, for :func:`uninstall_memory`."""

    hook: RemovableHandle
    flat: FlatGradients | None = None
    reservation: Reservation | None = None
    expandable_segments: bool = False


def _before_forward(model: nn.Module, args) -> None:
    # A plain function, looking the record up, so a deep copy of the model runs its own.
    record = model.__dict__[MEMORY_ATTR]
    if record.flat is not None:
        record.flat.check()
    if record.reservation is not None:
        record.reservation.reserve(model)


def install_memory(model: nn.Module, settings: MemorySettings) -> None:
    """Put the ``memory`` block's settings in place on ``model`` (undone by :func:`uninstall_memory`).

    Raises :class:`PlanError` and changes nothing when a setting cannot act here.
    """
    allocator = allocator_plan(settings, allocator_state())  # raises before anything changes
    flat = FlatGradients(model, flat_parameters(model)) if settings.atomic_clean_policy == 0 else None
    reservation = Reservation(allocator.reserve_bytes) if allocator.reserve_bytes else None
    hook = model.register_forward_pre_hook(_before_forward)
    try:
        model.__dict__[MEMORY_ATTR] = InstalledMemory(hook, flat, reservation, allocator.expandable_segments)
    except BaseException:  # interrupted before the record that uninstall_memory undoes exists
        hook.remove()
        raise
    if flat is not None:
        model.zero_grad = types.MethodType(_zero_grad, model)  # type: ignore[method-assign]  # replaced per instance on purpose; uninstall_memory restores it
    if allocator.expandable_segments:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")


def uninstall_memory(model: nn.Module) -> None:
    record = model.__dict__.pop(MEMORY_ATTR, None)
    if not isinstance(record, InstalledMemory):
        return
    if record.flat is not None:
        record.flat.release()
        if isinstance(model.__dict__.get("zero_grad"), types.MethodType):
            del model.__dict__["zero_grad"]
    record.hook.remove()
    if record.expandable_segments:
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


# ---------------------------------------------------------------- the CUDA allocator


@dataclass(frozen=True)
class AllocatorState:
    """What the CUDA caching allocator has done in this process, as far as the decision needs it."""

    cuda: bool  # a CUDA device is there
    reserved_bytes: int = 0  # already reserved, all devices together
    segments: int = 0


@dataclass(frozen=True)
class AllocatorPlan:
    """What :func:`allocator_plan` decided: whether to turn on expandable segments, what to reserve."""

    expandable_segments: bool = False
    reserve_bytes: int = 0


def allocator_plan(settings: MemorySettings, state: AllocatorState) -> AllocatorPlan:
    """Decide what ``static_memory_policy`` does in this process, or raise why it cannot act.

    Without CUDA nothing acts (``memoplan check`` says so in a note).  Expandable segments
    must be on before the allocator reserves its first segment: a process that already
    holds reserved CUDA memory is refused with how much, rather than set too late.  The
    reservation (2, 4) happens at the first forward on CUDA, where the device is known.
    """
    policy = settings.static_memory_policy
    if policy == 0 or not state.cuda:
        return AllocatorPlan()
    expandable = policy in (3, 4)
    if expandable and state.reserved_bytes:
        raise PlanError(
            (
                Diagnostic(
                    "MP423",
                    f"`static_memory_policy = {policy}` turns on expandable segments, which must happen before the "
                    f"first CUDA allocation, but {state.reserved_bytes} B in {state.segments} segment"
                    f"{'s' if state.segments != 1 else ''} are already reserved",
                    help="apply the plan before anything is put on the GPU (before `model.to('cuda')`), or start "
                    "the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                ),
            )
        )
    return AllocatorPlan(expandable, (settings.reserve_bytes or 0) if policy in (2, 4) else 0)


def allocator_state() -> AllocatorState:
    if not torch.cuda.is_available():
        return AllocatorState(False)
    reserved = segments = 0
    if torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(index)
            reserved += stats.get("reserved_bytes.all.current", 0)
            segments += stats.get("segment.all.current", 0)
    return AllocatorState(True, reserved, segments)


class Reservation:
    """Reserve ``size`` bytes in the caching allocator of the device of the first CUDA forward."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.done: set[torch.device] = set()

    def reserve(self, model: nn.Module) -> None:
        device = next((p.device for p in model.parameters() if p.device.type == "cuda"), None)
        if device is None or device in self.done:
            return
        # Freed at once, the block stays in the caching allocator as one reserved segment,
        # which the step's allocations are then carved from instead of growing it.
        block = torch.empty(self.size, dtype=torch.uint8, device=device)
        del block
        self.done.add(device)
