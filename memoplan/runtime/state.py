"""Runtime stage: the state protocol — how a stateful module shows memoplan its per-step state.

A module whose forward reads and advances state kept between calls (a spiking
neuron's membrane potential, an RNN cell's hidden state) must expose it, so that a
checkpointed recompute starts from the state the first forward started from and
never advances it a second time (fangwei123456/spikingjelly#629), and so that
temporal chunks can hand the state from one chunk to the next.

The protocol is two methods::

    def memoplan_state(self) -> dict[str, torch.Tensor | float | None]: ...
    def memoplan_load_state(self, state: dict[str, torch.Tensor | float | None]) -> None: ...

``memoplan_state`` returns the module's *own* state (not its children's), in a
fixed key order; ``memoplan_load_state`` replaces it.  Values may be tensors (with
or without autograd history) or plain numbers (a state not yet materialised, such
as a potential that starts at 0.0).  SpikingJelly ``MemoryModule``s (state in their
``_memories`` dict) are adapted without importing SpikingJelly.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from torch import nn

State = dict[str, Any]


class _Stateful(Protocol):
    """The protocol's two methods, for the type checker (``nn.Module.__getattr__`` hides them)."""

    _memories: dict[str, Any]

    def memoplan_state(self) -> State: ...

    def memoplan_load_state(self, state: State) -> None: ...


def is_stateful(module: nn.Module) -> bool:
    return _has_protocol(module) or _is_memory_module(module)


def get_state(module: nn.Module) -> State:
    if _has_protocol(module):
        return dict(cast(_Stateful, module).memoplan_state())
    if _is_memory_module(module):
        return dict(cast(_Stateful, module)._memories)
    raise TypeError(f"{type(module).__qualname__} does not expose its state to memoplan")


def load_state(module: nn.Module, state: State) -> None:
    if _has_protocol(module):
        cast(_Stateful, module).memoplan_load_state(state)
    elif _is_memory_module(module):
        for name, value in state.items():
            setattr(module, name, value)  # MemoryModule routes registered names to _memories
    else:
        raise TypeError(f"{type(module).__qualname__} does not expose its state to memoplan")


def _has_protocol(module: nn.Module) -> bool:
    return callable(getattr(type(module), "memoplan_state", None)) and callable(
        getattr(type(module), "memoplan_load_state", None)
    )


def _is_memory_module(module: nn.Module) -> bool:
    return isinstance(module.__dict__.get("_memories"), dict)
