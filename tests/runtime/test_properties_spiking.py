"""Property tests for the spiking path: random spiking/recurrent models, random plans, random inputs.

Models mix time-folded Linear layers, BatchNorm over all time steps, Dropout and
stateful LIF neurons in nested containers; plans mix checkpoint, compress (bit
where the input is known to be binary, auto elsewhere), split regions and
temporal chunks.  Buffers and RNG progression must equal the unplanned step bit
for bit; so must outputs, input gradients, parameter gradients and every neuron's
final state — except under temporal chunks: a layer run on fewer rows may take a
different BLAS path, weight gradients and BatchNorm statistics are summed chunk by
chunk, so those agree up to float reassociation: max |Δ| <= memoplan.verification.CHUNK_RTOL
· the largest reference magnitude of the category (outputs, parameter gradients,
buffers, states), and integer buffers exactly.
Examples are derandomized so CI runs the same draws every time.
"""

from __future__ import annotations

import copy

import torch
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import memoplan
from memoplan.compare import compare
from memoplan.neurons import LIF, reset
from memoplan.verification import CHUNK_RTOL

FEATURES = 5


class TimeBatchNorm(nn.Module):
    """BatchNorm over every time step at once: (T, B, F) folded to (T*B, F)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(FEATURES)

    def forward(self, x):
        return self.bn(x.flatten(0, 1)).unflatten(0, x.shape[:2])


def _leaf(kind: str) -> nn.Module:
    return {
        "linear": lambda: nn.Linear(FEATURES, FEATURES),
        "norm": TimeBatchNorm,
        "dropout": lambda: nn.Dropout(0.25),
        "lif": lambda: LIF(threshold=0.2),
        "tanh": nn.Tanh,
    }[kind]()


def _stage(draw, depth: int) -> nn.Module:
    if depth == 0 or draw(st.booleans()):
        return _leaf(draw(st.sampled_from(["linear", "linear", "norm", "dropout", "lif", "lif", "tanh"])))
    return nn.Sequential(*[_stage(draw, depth - 1) for _ in range(draw(st.integers(1, 3)))])


def _binary_inputs(model: nn.Module) -> set[str]:
    """Paths of modules whose input is known to be binary: first ones, and those right after a LIF."""
    known: set[str] = set()

    def walk(module: nn.Module, prefix: str, binary: bool) -> bool:
        if binary:
            known.add(prefix)
        if isinstance(module, nn.Sequential):
            for name, child in module.named_children():
                binary = walk(child, f"{prefix}.{name}" if prefix else name, binary)
            return binary
        if isinstance(module, LIF):
            return True
        return False

    walk(model, "", True)
    known.discard("")
    return known


def _mixes_chunks(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) for m in module.modules())


@st.composite
def cases(draw):
    torch.manual_seed(draw(st.integers(0, 2**16)))
    model = nn.Sequential(*[_stage(draw, 2) for _ in range(draw(st.integers(2, 4)))])
    binary = _binary_inputs(model)
    paths = [p for p, _ in model.named_modules() if p]
    chosen = draw(st.lists(st.sampled_from(paths), unique=True, max_size=4))
    lines = ["memplan 1"]
    if any(isinstance(m, LIF) for m in model.modules()):
        lines.append("module class LIF { state = functional }")
    taken: list[str] = []
    chunked = False
    for path in sorted(chosen):
        if any(path.startswith(t + ".") or t.startswith(path + ".") for t in taken):
            continue
        taken.append(path)
        module = model.get_submodule(path)
        policies = []
        can_chunk = not _mixes_chunks(module)
        if can_chunk and draw(st.booleans()):
            policies.append(f"temporal_chunk {draw(st.integers(1, 5))} dim 0")
            chunked = True
        else:
            option = ""
            if isinstance(module, nn.Sequential) and len(module) > 1 and draw(st.booleans()):
                option = f" split = [{draw(st.integers(1, len(module) - 1))}]"
            policies.append("checkpoint" + option)
        codec = draw(st.sampled_from(["none", "auto", "bit"]))
        if codec == "bit" and path not in binary:
            codec = "auto"
        if codec != "none":
            policies.append(f"compress input = {codec}")
        lines.append(f"module {path} {{ {'; '.join(policies)} }}")
    steps = draw(st.integers(1, 6))
    batch = draw(st.integers(2, 3))
    return model, "\n".join(lines) + "\n", (steps, batch, FEATURES), chunked


def _step(model: nn.Module, x: torch.Tensor, weight: torch.Tensor):
    reset(model)
    torch.manual_seed(7)
    x = x.clone().requires_grad_()
    out = model(x)
    (out * weight).sum().backward()
    states = [
        m.v.detach().clone() if isinstance(m.v, torch.Tensor) else m.v for m in model.modules() if isinstance(m, LIF)
    ]
    return out.detach(), x.grad, torch.get_rng_state(), states


def _close(a: list, b: list, exact: bool) -> bool:
    """Tensors of one category equal, or (under chunks) within CHUNK_RTOL of the category's scale:
    memoplan.compare, as `memoplan verify` compares."""
    named = [{str(i): torch.as_tensor(t) for i, t in enumerate(ts)} for ts in (a, b)]
    check = compare("category", *named, rtol=0.0 if exact else CHUNK_RTOL)
    return check.exact if exact else check.equal


@settings(
    max_examples=n_examples(50),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases(), st.integers(0, 2**16))
def test_spiking_plans_keep_training_equivalent(case, seed):
    model, text, shape, chunked = case
    generator = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=generator) < 0.4).float()
    weight = torch.randn(shape, generator=generator)
    reference, planned = copy.deepcopy(model), copy.deepcopy(model)
    memoplan.apply(planned, text)
    a = _step(reference, x, weight)
    b = _step(planned, x, weight)
    exact = not chunked
    assert _close([a[0]], [b[0]], exact), text
    assert _close([a[1]], [b[1]], exact), text
    assert torch.equal(a[2], b[2]), text
    assert _close(a[3], b[3], exact), text
    grads = [(name, p.grad, q.grad) for (name, p), q in zip(reference.named_parameters(), planned.parameters())]
    for name, g, h in grads:
        assert (g is None) == (h is None), name
    assert _close([g for _, g, _ in grads if g is not None], [h for _, _, h in grads if h is not None], exact), text
    assert _close(list(reference.buffers()), list(planned.buffers()), exact), text
    assert list(reference.state_dict()) == list(planned.state_dict())
