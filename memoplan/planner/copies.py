"""Copies of a model to measure or estimate a step on, leaving the model as it was."""

from __future__ import annotations

import copy

import torch
from torch import nn

from memoplan import api
from memoplan.runtime.state import get_state, is_stateful, load_state


def unplanned_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` without any plan; states with autograd history are copied detached.

    A neuron's potential left by the last step is a tensor in that step's graph, which
    ``copy.deepcopy`` refuses; its value is what matters for the next step.
    """
    states = [(m, get_state(m)) for m in model.modules() if is_stateful(m)]
    try:
        for m, state in states:
            load_state(m, {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in state.items()})
        clone = copy.deepcopy(model)
    finally:
        for m, state in states:
            load_state(m, state)
    return api.remove(clone)
