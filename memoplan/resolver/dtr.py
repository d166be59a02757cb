"""Resolve stage: which modules the plan's ``dtr`` block may evict (its *candidates*), and why.

The candidates are chosen from the model's structure alone (no profile is needed):

* the blocks: the children of every *outermost container* — an ``nn.Sequential`` or
  ``nn.ModuleList`` with children that is not inside another one (the model itself
  when it is one).  That is ``features.*`` of a CNN, ``transformer.h.*`` of GPT-2,
  ``encoder.layer.*`` of BERT, ``model.layers.*`` of Llama.  A model with no
  container uses its direct children;
* minus every block that a module rule touches: a block with a rule of its own
  (``keep`` exempts one explicitly), one with a rule on a module inside it, and one
  inside a module that has a rule.  Explicit rules always keep their meaning;
* minus a second path to a module object already chosen (a shared block runs as the
  candidate of its first path).

The block's ``modules`` key (a selector in quotes, as in a module rule) names the candidates
instead of the blocks; the same modules are left out of what it names.

Blocks that turn out to save little are not evicted at run time
(``evictee_minimum_size``).  ``memoplan explain`` prints every candidate and every
excluded block with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

__all__ = ["candidates"]

_CONTAINERS = (nn.Sequential, nn.ModuleList)


def candidates(
    model: nn.Module, ruled: Mapping[str, int], named: Sequence[str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """``(chosen, excluded)``: path -> why, in model order.

    ``ruled`` maps the path of every module a rule touches to that rule's line; ``named``,
    the modules the block's ``modules`` key selects (instead of the blocks).
    """
    paths = {path: module for path, module in model.named_modules(remove_duplicate=False)}
    if named is not None:
        return _filtered(
            paths, [p for p in paths if p in set(named)], dict.fromkeys(named, "named by `modules`"), ruled
        )
    containers = [path for path, module in paths.items() if isinstance(module, _CONTAINERS) and len(module._modules)]
    outer = [p for p in containers if not any(_inside(p, q) for q in containers if q != p)]
    if outer:
        blocks = [p for p in paths if p and any(_parent(p) == q for q in outer)]
        why = {p: f"a block of `{_parent(p) or '(the model)'}`, the outermost container" for p in blocks}
    else:
        blocks = [p for p in paths if p and "." not in p]
        why = {p: "a child of the model, which has no container" for p in blocks}
    return _filtered(paths, blocks, why, ruled)


def _filtered(
    paths: Mapping[str, nn.Module], blocks: Sequence[str], why: Mapping[str, str], ruled: Mapping[str, int]
) -> tuple[dict[str, str], dict[str, str]]:
    """``blocks`` without those a rule touches, and second paths to one module."""
    chosen: dict[str, str] = {}
    excluded: dict[str, str] = {}
    seen: dict[int, str] = {}
    for path in blocks:
        line = ruled.get(path)
        inner = sorted((line for p, line in ruled.items() if _inside(p, path) and p != path))
        outer_rule = sorted((line for p, line in ruled.items() if _inside(path, p) and p != path))
        module = paths[path]
        if line is not None:
            excluded[path] = f"has its own rule (line {line}), which it keeps"
        elif inner:
            excluded[path] = f"a module inside it has a rule (line {inner[0]})"
        elif outer_rule:
            excluded[path] = f"it is inside a module with a rule (line {outer_rule[0]})"
        elif id(module) in seen:
            excluded[path] = f"the same module object as `{seen[id(module)]}`, a candidate there"
        else:
            chosen[path] = why[path]
            seen[id(module)] = path
    return chosen, excluded


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _inside(path: str, outer: str) -> bool:
    """Whether ``path`` is ``outer`` or below it (``""`` is the model, above everything)."""
    return outer == "" or path == outer or path.startswith(outer + ".")
