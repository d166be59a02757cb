"""Copies of a model to measure or estimate a step on, leaving the model as it was."""

from __future__ import annotations

import copy

import torch
from torch import nn

from memoplan import api
from memoplan.runtime.state import get_state, is_stateful, load_state


def unplanned_copy(model: nn.Module, memo: dict[int, object] | None = None) -> nn.Module:
    """A deep copy of ``model`` without any plan; states with autograd history are copied detached.

    A neuron's potential left by the last step is a tensor in that step's graph, which
    ``copy.deepcopy`` refuses; its value is what matters for the next step.
    """
    states = [(m, get_state(m)) for m in model.modules() if is_stateful(m)]
    try:
        for m, state in states:
            load_state(m, {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        clone = copy.deepcopy(model, memo)
    finally:
        for m, state in states:
            load_state(m, state)
    return api.remove(clone)


def sharing_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters share the model's storage: no second copy of the
    weights, while each copy's gradients, buffers and module state are its own.

    A training step reads its parameters and writes only their ``.grad``, so steps of several
    such copies start from the same weights as steps of full copies would.  Each copied
    parameter is a new ``nn.Parameter`` on the same storage (its ``requires_grad`` kept, no
    ``.grad``, as ``copy.deepcopy`` gives); parameters of other types are deep-copied.  Moving
    the copy to another device (``.to``) moves the copy only.  :func:`changed_parameters` tells
    whether a step wrote the shared storage after all (a model that edits a weight in place).
    """
    memo: dict[int, object] = {
        id(p): nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        for p in model.parameters()
        if type(p) is nn.Parameter
    }
    return copy.deepcopy(model, memo)


def estimate_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` to estimate a planned step on (fake tensors): parameters as
    :func:`sharing_copy` shares them, and buffers without storage (fake or meta) shared too.

    ``copy.deepcopy`` of a fake tensor reads its data pointer, which torch calls undefined
    behaviour; the estimate swaps every parameter and buffer for a fake copy anyway.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    memo: dict[int, object] = {
        id(p): nn.Parameter(p.detach(), requires_grad=p.requires_grad)
        for p in model.parameters()
        if type(p) is nn.Parameter or isinstance(p, FakeTensor)
    }
    memo.update({id(b): b for b in model.buffers() if isinstance(b, FakeTensor) or b.is_meta})
    return unplanned_copy(model, memo)


def parameter_versions(model: nn.Module) -> dict[str, int]:
    """Each parameter's version counter (bumped by every in-place write), by name."""
    return {name: p._version for name, p in model.named_parameters()}


def changed_parameters(model: nn.Module, versions: dict[str, int]) -> list[str]:
    """The parameters of ``model`` written in place since ``versions`` (:func:`parameter_versions`)."""
    return [name for name, p in model.named_parameters() if versions.get(name, p._version) != p._version]
