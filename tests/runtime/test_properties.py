"""Property tests: random small models, random plans over them, random inputs.

For every draw, one training step of the planned model must equal the unplanned
model bit for bit: outputs, parameter gradients, buffers (BatchNorm statistics
committed once), the RNG state after the step (dropout draws replayed, not
redrawn), and state_dict keys.
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
from memoplan.syntax import ast
from memoplan.syntax.formatter import format_path

WIDTH = 6
CHANNELS = 3


class ListContainer(nn.Module):
    """Children in an nn.ModuleList, applied in order by a custom forward."""

    def __init__(self, children):
        super().__init__()
        self.items = nn.ModuleList(children)

    def forward(self, x):
        for item in self.items:
            x = item(x)
        return x


class DictContainer(nn.Module):
    """Children in an nn.ModuleDict, applied in insertion order, with a residual."""

    def __init__(self, children):
        super().__init__()
        self.parts = nn.ModuleDict({f"part{i}": c for i, c in enumerate(children)})

    def forward(self, x):
        y = x
        for part in self.parts.values():
            y = part(y)
        return x + y


def _leaf(kind: str, conv: bool) -> nn.Module:
    if conv:
        return {
            "linear": nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1),
            "norm": nn.BatchNorm2d(CHANNELS),
            "dropout": nn.Dropout(0.3),
            "act": nn.GELU(),
        }[kind]
    return {
        "linear": nn.Linear(WIDTH, WIDTH),
        "norm": nn.BatchNorm1d(WIDTH),
        "dropout": nn.Dropout(0.3),
        "act": nn.Tanh(),
    }[kind]


def _tree(draw, conv: bool, depth: int) -> nn.Module:
    if depth == 0 or draw(st.booleans()):
        return _leaf(draw(st.sampled_from(["linear", "linear", "norm", "dropout", "act"])), conv)
    children = [_tree(draw, conv, depth - 1) for _ in range(draw(st.integers(1, 3)))]
    container = draw(st.sampled_from([nn.Sequential, ListContainer, DictContainer]))
    return container(*children) if container is nn.Sequential else container(children)


@st.composite
def models(draw):
    conv = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    torch.manual_seed(seed)
    model = nn.Sequential(*[_tree(draw, conv, 2) for _ in range(draw(st.integers(1, 4)))])
    batch = draw(st.integers(2, 4))
    shape = (batch, CHANNELS, 5, 5) if conv else (batch, WIDTH)
    return model, shape, seed


def _has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) for m in module.modules())


def _selector(path: str, model: nn.Module, draw) -> str:
    """The path written either exactly or as a one-element slice of its Sequential parent."""
    parent, _, last = path.rpartition(".")
    container = model.get_submodule(parent) if parent else model
    segments = [ast.Name(s) for s in path.split(".")]
    if last.isdigit() and isinstance(container, (nn.Sequential, nn.ModuleList)) and draw(st.booleans()):
        index = int(last)
        segments[-1] = ast.Slice(index, index + 1, None)
    return format_path(ast.PathPattern(tuple(segments)))


@st.composite
def planned_models(draw):
    model, shape, seed = draw(models())
    # ModuleList / ModuleDict are never called themselves (the resolver refuses them: MP312).
    paths = [p for p, m in model.named_modules() if p and not isinstance(m, (nn.ModuleList, nn.ModuleDict))]
    chosen = draw(st.lists(st.sampled_from(paths), unique=True, max_size=4)) if paths else []
    lines = ["memplan 1"]
    taken: list[str] = []
    for path in sorted(chosen):
        if any(path.startswith(t + ".") or t.startswith(path + ".") for t in taken):
            continue  # no nested regions
        module = model.get_submodule(path)
        options = []
        if isinstance(module, nn.Sequential) and len(module) > 1 and draw(st.booleans()):
            options.append(f"segments = {draw(st.integers(1, len(module)))}")
        if not _has_dropout(module) and draw(st.booleans()):
            options.append("rng = off")
        if draw(st.booleans()):  # op-level saving: the kept outputs are the forward's own tensors
            ops = []  # each family whole or some of its ops by their place in the region's forward
            for family in draw(st.lists(st.sampled_from(["matmul", "conv", "attention"]), unique=True, min_size=1)):
                places = [] if draw(st.booleans()) else draw(st.lists(st.integers(1, 4), unique=True, min_size=1))
                ops += [f"{family}_{p}" for p in places] or [family]
            options.append(f"save = [{', '.join(ops)}]")
        taken.append(path)
        lines.append(f"module {_selector(path, model, draw)} {{ checkpoint {' '.join(options)} }}")
    return model, shape, seed, "\n".join(lines) + "\n"


def _grads(model: nn.Module) -> dict:
    return {name: p.grad for name, p in model.named_parameters()}


def _step(model: nn.Module, x: torch.Tensor, weight: torch.Tensor, seed: int):
    x = x.clone().requires_grad_()
    torch.manual_seed(seed)
    out = model(x)
    (out * weight).sum().backward()
    return out, x.grad, torch.get_rng_state()


@settings(max_examples=n_examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planned_models(), st.integers(0, 2**16))
def test_planned_step_equals_unplanned(case, input_seed):
    model, shape, seed, text = case
    generator = torch.Generator().manual_seed(input_seed)
    x = torch.randn(shape, generator=generator)
    reference = copy.deepcopy(model)
    planned = copy.deepcopy(model)
    memoplan.apply(planned, text)
    weight = torch.randn(shape, generator=generator)  # every layer keeps the input's shape

    out_a, dx_a, rng_a = _step(reference, x, weight, seed)
    out_b, dx_b, rng_b = _step(planned, x, weight, seed)

    # memoplan.compare, as `memoplan verify` compares: every leaf bit for bit, named by its path.
    for check in (
        compare("outputs", {"outputs": out_a, "input grad": dx_a}, {"outputs": out_b, "input grad": dx_b}),
        compare("gradients", _grads(reference), _grads(planned)),
        compare("buffers", dict(reference.named_buffers()), dict(planned.named_buffers())),
        compare("rng state", {"cpu": rng_a}, {"cpu": rng_b}),
    ):
        assert check.exact, f"{check.name}: {check.differences[:3]} {check.within[:3]}\n{text}"
    assert list(reference.state_dict()) == list(planned.state_dict())

    memoplan.remove(planned)
    assert all("forward" not in m.__dict__ for m in planned.modules())


@settings(max_examples=n_examples(25), deadline=None)
@given(planned_models())
def test_eval_without_grad_is_unchanged(case):
    model, shape, seed, text = case
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    planned = memoplan.apply(copy.deepcopy(model), text)
    model.eval()
    planned.eval()
    with torch.no_grad():
        assert torch.equal(model(x), planned(x))


def test_resolution_does_not_depend_on_registration_order():
    def build(names):
        model = nn.Module()
        for name in names:
            model.add_module(name, nn.Sequential(nn.Linear(2, 2), nn.Tanh()))
        return model

    plan = memoplan.parse("memplan 1\nmodule * { checkpoint }\nmodule b.1 { keep }\n")
    first = memoplan.resolve(plan, build(["b", "a", "c"]))
    second = memoplan.resolve(plan, build(["c", "a", "b"]))
    assert [m.path for m in first.modules] == ["a", "b", "b.1", "c"]
    assert first == second
    assert first.digest == second.digest
