"""The arena module on random graphs: views, in-place writes, several outputs — bit for bit eager's."""

from __future__ import annotations

import copy

import torch
from _profiles import n_examples  # tests/_profiles.py: the hypothesis profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import memoplan
from memoplan.runtime.arena import arena_state

WIDTH = 8  # square values, so a transpose (a view) keeps the shape
OPS = (
    "linear",
    "relu",
    "gelu",
    "add",
    "mul",
    "transpose",
    "scale_",
    "tanh",
    "softmax",
    "cat_half",
    "chunk_swap",
    "rowmax",
    "relu_",
)


class RandomGraph(nn.Module):
    """Runs ``recipe``: each entry (op, a, b) makes a new value from values a and b made before it."""

    def __init__(self, recipe, outputs):
        super().__init__()
        self.recipe = recipe
        self.outputs = outputs
        self.linears = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for op, _, _ in recipe if op == "linear")

    def forward(self, x):
        values = [x]
        linears = iter(self.linears)
        for op, a, b in self.recipe:
            u, v = values[a], values[b]
            if op == "linear":
                out = next(linears)(u)
            elif op == "relu":
                out = torch.relu(u)
            elif op == "gelu":
                out = nn.functional.gelu(u)
            elif op == "add":
                out = u + v
            elif op == "mul":
                out = u * v
            elif op == "transpose":
                out = u.t()
            elif op == "scale_":  # writes a value in place: every later reader sees the new one
                out = u.mul_(0.5) if a else u * 0.5
            elif op == "tanh":
                out = torch.tanh(u)
            elif op == "softmax":
                out = torch.softmax(u, dim=-1)
            elif op == "chunk_swap":  # views from an op with several results
                left, right = torch.chunk(u, 2, dim=1)
                out = torch.cat([right, left], dim=1)
            elif op == "rowmax":  # an op with several fresh results, then a broadcast view
                out = u.max(dim=1, keepdim=True).values.expand(WIDTH, WIDTH) * v
            elif op == "relu_":
                out = torch.relu_(u) if a else torch.relu(u)
            else:
                out = torch.cat([u[:, : WIDTH // 2], v[:, WIDTH // 2 :]], dim=1)
            values.append(out)
        return tuple(values[i] for i in self.outputs)


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 14))
    recipe = []
    for i in range(n):
        op = draw(st.sampled_from(OPS))
        recipe.append((op, draw(st.integers(0, i)), draw(st.integers(0, i))))
    outputs = sorted(set(draw(st.lists(st.integers(1, n), min_size=1, max_size=2)) + [n]))
    return recipe, outputs


@settings(max_examples=n_examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graphs(),
    st.sampled_from(["greedy", "dp"]),
    st.sampled_from(["topological", "longest_path"]),
    st.integers(0, 2**16),
    st.sampled_from(["", "; peak_slack = 10"]),
)
def test_random_graphs_give_eager_outputs_bit_for_bit(graph, algo, ordering, seed, slack):
    recipe, outputs = graph
    torch.manual_seed(seed)
    model = RandomGraph(recipe, outputs).eval()
    reference = copy.deepcopy(model)
    memoplan.apply(
        model,
        f"memplan 1\nexample randn({WIDTH}, {WIDTH})\nmemonger {{ algo = {algo}; ordering = {ordering}{slack} }}\n",
    )
    for _ in range(2):
        x = torch.randn(WIDTH, WIDTH)
        with torch.no_grad():
            got = model(x.clone())
            expected = reference(x.clone())
        assert len(got) == len(expected)
        assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert arena_state(model).arena_calls == 2
