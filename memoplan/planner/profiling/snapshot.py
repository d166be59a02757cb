"""Leaving the model as it was: everything a training step can change in a model and around it
(attributes, modes, parameters and their gradients, buffers, state, RNG), put back after a
profile's steps or a measured trial."""

from __future__ import annotations

import random
import warnings

import torch
from torch import nn

from memoplan.planner.profiling.module_hooks import tensors_in
from memoplan.planner.profiling.schema import some_names
from memoplan.runtime.state import get_state, is_stateful, load_state
from memoplan.specs import Example


class Snapshot:
    """Everything a training step can change in ``model`` and around it; ``restore()`` puts it back.

    Modules' attributes and train/eval modes, parameters (the objects, their ``.grad`` and
    ``requires_grad``), buffers (the tensors and their values), stateful modules' state
    (:mod:`memoplan.runtime.state`), the gradients of the example's tensors, and the torch,
    CUDA and Python RNG states.  As a context manager it restores on exit, exceptions
    included.  Used around profiling steps and around the planner's measured trials.
    """

    def __init__(self, model: nn.Module, example: Example, device: torch.device | None = None) -> None:
        paths = {id(m): path for path, m in model.named_modules()}
        modules = list(model.modules())
        self.training = [(m, m.training) for m in modules]
        self.attributes = [(m, dict(m.__dict__)) for m in modules]
        # (module, name, parameter, its .grad, its requires_grad, its version counter, its full path)
        self.parameters = [
            (
                m,
                name,
                p,
                None if p is None else p.grad,
                None if p is None else p.requires_grad,
                None if p is None else p._version,
                f"{paths[id(m)]}.{name}".lstrip("."),
            )
            for m in modules
            for name, p in m._parameters.items()
        ]
        self.buffers = [
            (m, name, b, None if b is None else b.detach().clone()) for m in modules for name, b in m._buffers.items()
        ]
        self.states = [(m, get_state(m)) for m in modules if is_stateful(m)]
        self.example_grads = [(t, t.grad) for t in tensors_in((example.args, dict(example.kwargs))) if t.requires_grad]
        self.rng_cpu = torch.get_rng_state()
        cuda = (device is not None and device.type == "cuda") or torch.cuda.is_initialized()
        self.rng_cuda = torch.cuda.get_rng_state_all() if cuda else None
        self.rng_python = random.getstate()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def modified_parameters(self) -> list[str]:
        """Paths of parameters changed in place since the snapshot (which cannot be undone)."""
        return sorted(
            {path for _, _, p, _, _, version, path in self.parameters if p is not None and p._version != version}
        )

    def restore(self) -> None:
        """Put back the state captured at construction."""
        for m, attributes in self.attributes:
            current = m.__dict__
            for key in [k for k in current if k not in attributes]:
                del current[key]
            for key, value in attributes.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value
        for m, mode in self.training:
            m.training = mode
        for m, name, p, grad, requires_grad, _, _ in self.parameters:
            m._parameters[name] = p
            if p is not None:
                p.grad = grad
                p.requires_grad_(bool(requires_grad))  # a parameter's flag, never None
        with torch.no_grad():
            for m, name, b, saved in self.buffers:
                m._buffers[name] = b
                if b is not None and saved is not None:
                    b.copy_(saved)
        for m, state in self.states:
            load_state(m, dict(state))
        for t, grad in self.example_grads:
            t.grad = grad
        torch.set_rng_state(self.rng_cpu)
        if self.rng_cuda is not None:
            torch.cuda.set_rng_state_all(self.rng_cuda)
        random.setstate(self.rng_python)


class Restored(Snapshot):
    """The snapshot around a whole profile, which runs in train mode.

    Entered: puts the model in train mode if its root is in eval mode; ``reset()`` before
    every step (same buffers, states and RNG, so every step sees the same dropout masks);
    on exit restores everything, modes included, and warns about parameters changed in place.
    """

    def __init__(self, model: nn.Module, example: Example, device: torch.device) -> None:
        super().__init__(model, example, device)
        self.model = model

    def __enter__(self) -> Restored:
        self._train()
        return self

    def _train(self) -> None:
        if not self.model.training:
            self.model.train()

    def __exit__(self, *exc_info: object) -> None:
        self.restore()
        changed = self.modified_parameters()
        if changed:
            warnings.warn(
                f"the model's forward modified parameter(s) {some_names(changed)} in place; "
                "profile() restored everything else but cannot undo that",
                RuntimeWarning,
                stacklevel=3,
            )

    def reset(self) -> None:
        """Put back the state captured at construction, in the profiling modes."""
        self.restore()
        self._train()


_MISSING = object()
