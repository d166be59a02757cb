"""Resolve stage: binds a plan's rules to a real model and checks that the result is legal.

Every policy belongs to one *aspect* of a module (recompute: ``checkpoint`` or
``keep``; ``compress``; ``temporal_chunk``; ``state``; ``buffers``).  For each
module and aspect the most specific matching rule wins; two equally specific rules
that disagree are an error naming both lines.  All problems are reported at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from memoplan import ir
from memoplan.diagnostics import Diagnostic, PlanError, Severity, did_you_mean
from memoplan.enums import Aspect, Boundaries, Validate
from memoplan.resolver.dtr import candidates as dtr_candidates
from memoplan.resolver.effects import statement_effects
from memoplan.resolver.selectors import ModelIndex, Specificity, no_match_help, select, specificity
from memoplan.runtime import codecs
from memoplan.runtime.install import qualified_type_name
from memoplan.runtime.state import is_stateful
from memoplan.syntax import ast
from memoplan.syntax.blocks import config_of
from memoplan.syntax.formatter import format_policy, format_selector
from memoplan.syntax.parser import parse_with_diagnostics
from memoplan.syntax.policies import POLICIES, spec_of, with_defaults

RECOMPUTE = Aspect.RECOMPUTE
# The aspect of each policy's AST class (syntax/policies.py says it once).
ASPECTS = {spec.node: spec.aspect for spec in POLICIES.values()}


@dataclass(frozen=True)
class Candidate:
    """One policy of one rule that matched a module."""

    rule: ast.ModuleRule
    policy: ast.Policy
    specificity: Specificity

    @property
    def line(self) -> int:
        return self.rule.span.line

    def same_as(self, other: Candidate) -> bool:
        return _bare(self.policy) == _bare(other.policy)


def _bare(policy: ast.Policy) -> ast.Policy:
    """The policy as a decision: no comments, and options left out spelled as their defaults
    (syntax/policies.py), so `checkpoint` and `checkpoint rng = preserve` agree."""
    defaults: dict[str, Any] = with_defaults(policy)
    return replace(policy, comments=ast.NO_COMMENTS, **defaults)


@dataclass
class Decision:
    """Winner and losers for one (module, aspect)."""

    winner: Candidate
    candidates: list[Candidate]


@dataclass
class Resolution:
    """Everything the resolver learned; ``ResolvedPlan`` and ``explain`` are views of it."""

    plan: ast.Plan
    index: ModelIndex
    decisions: dict[str, dict[str, Decision]] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    inside_region: dict[str, str] = field(default_factory=dict)  # path -> enclosing checkpointed path
    shared_with: dict[str, str] = field(default_factory=dict)  # second path of a shared module -> first
    # The `dtr` block's candidates and the blocks it leaves out: path -> why (memoplan.resolver.dtr).
    evictable: dict[str, str] = field(default_factory=dict)
    not_evictable: dict[str, str] = field(default_factory=dict)

    def error(self, code, message, span=None, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, notes=notes))

    def warn(self, code, message, span=None, help=None, notes=()) -> None:
        self.diagnostics.append(Diagnostic(code, message, span, help, Severity.WARNING, notes))


def resolve(plan: ast.Plan, model: nn.Module) -> ir.ResolvedPlan:
    """Bind ``plan`` to ``model``; raise :class:`PlanError` with every problem found."""
    resolution = analyse(plan, model)
    errors = [d for d in resolution.diagnostics if d.is_error]
    if errors:
        raise PlanError(tuple(_in_order(resolution.diagnostics)), plan.source)
    return _to_ir(resolution)


def analyse(plan: ast.Plan, model: nn.Module) -> Resolution:
    """Match rules, pick winners and run the legality checks, collecting diagnostics."""
    resolution = Resolution(plan, ModelIndex(model))
    # Plan-wide statements that cannot act are refused here, so nothing `apply` runs drops them;
    # the notes (what cannot act on this machine) are printed with the warnings.
    resolution.diagnostics.extend(statement_effects(plan))
    _match_rules(resolution)
    _check_shared(resolution)
    _check_regions(resolution)
    _check_policies(resolution)
    _choose_evictable(resolution, model)
    return resolution


def _choose_evictable(res: Resolution, model: nn.Module) -> None:
    """The `dtr` block's candidates: the blocks, or the modules its `modules` key names, that no
    memory rule touches (:mod:`memoplan.resolver.dtr`)."""
    block = res.plan.block(ast.BlockKind.DTR)
    if block is None:
        return
    ruled: dict[str, int] = {}
    for path, aspects in res.decisions.items():
        lines = [d.winner.line for aspect, d in aspects.items() if aspect not in ("state", "buffers")]
        if lines:
            ruled[path] = min(lines)
    entry = next((e for e in block.entries if e.key == "modules"), None)
    named = None
    if entry is not None:
        named = _named_candidates(res, entry)
        if named is None:
            return
    res.evictable, res.not_evictable = dtr_candidates(model, ruled, named)
    if not res.evictable:
        res.error(
            "MP230",
            "the `dtr` block has no module to act on: "
            + (
                "every module it names has a rule of its own"
                if named
                else "every block of the model has a rule of its own"
            ),
            replace(block.span, end_line=block.span.line, end_column=block.span.column + len("dtr")),
            "remove the `dtr` block, or the rules on the blocks it should evict "
            "(`memoplan explain` lists the blocks and why each is left out)",
        )


def _named_candidates(res: Resolution, entry: ast.ConfigEntry) -> list[str] | None:
    """The modules the `dtr` block's `modules` key selects, or None after an MP232 error."""
    assert isinstance(entry.value, ast.Text), "check_block reads `modules` as a string"
    text = entry.value.value
    rule, problems = parse_with_diagnostics(f"memplan 1\nmodule {text} {{ keep }}\n", "<modules>")
    errors = [d for d in problems if d.is_error]
    statements = [] if rule is None else [s for s in rule.statements if isinstance(s, ast.ModuleRule)]
    if errors or len(statements) != 1:
        why = errors[0].message if errors else "it is not one selector"
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` is not a selector: {why}",
            entry.span,
            'write a selector as in a module rule, e.g. `modules = "layers.*"`',
        )
        return None
    paths = select(res.index, statements[0].selector)
    if not paths:
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` matches no module of the model",
            entry.span,
            did_you_mean(text, res.index.paths) or "`memoplan explain` lists the model's modules",
        )
        return None
    chosen = set(paths)
    nested = [(".".join(p.split(".")[:k]), p) for p in paths for k in range(1, p.count(".") + 1)]
    nested = [(outer, inner) for outer, inner in nested if outer in chosen]
    if nested:
        outer, inner = nested[0]
        res.error(
            "MP232",
            f"`modules = {json.dumps(text)}` selects `{outer}` and `{inner}`, inside it",
            entry.span,
            "candidates must not contain one another: select one level",
        )
        return None
    return paths


def _in_order(diagnostics):
    return sorted(diagnostics, key=lambda d: (d.span.line, d.span.column) if d.span else (0, 0))


# ---------------------------------------------------------------- matching and precedence


def _match_rules(res: Resolution) -> None:
    candidates: dict[str, dict[str, list[Candidate]]] = {}
    for rule in res.plan.rules:
        paths = select(res.index, rule.selector)
        if not paths:
            _no_match(res, rule)
            continue
        spec = specificity(rule.selector)
        for path in paths:
            per_aspect = candidates.setdefault(path, {})
            for policy in rule.policies:
                per_aspect.setdefault(spec_of(policy).aspect, []).append(Candidate(rule, policy, spec))
    for path in sorted(candidates, key=ir.path_key):
        for aspect, found in candidates[path].items():
            best = max(c.specificity for c in found)
            top = [c for c in found if c.specificity == best]
            winner = top[0]
            for other in top[1:]:
                if not other.same_as(winner):
                    res.error(
                        "MP303",
                        f"rules on lines {winner.line} and {other.line} disagree about `{path}` "
                        f"and are equally specific",
                        other.policy.span,
                        "make one selector more specific (e.g. an exact path), or drop one rule",
                        notes=(
                            (
                                f"`{format_policy(winner.policy)}` from `module {format_selector(winner.rule.selector)}`",
                                winner.policy.span,
                            ),
                        ),
                    )
                    break
            res.decisions.setdefault(path, {})[aspect] = Decision(winner, found)
    _spread_state(res)


def _spread_state(res: Resolution) -> None:
    """`state = functional` on a module that keeps no state of its own (a block, a container)
    means the stateful modules inside it: each gets the rule's decision, unless a rule of its own
    decides already.  With none inside, the decision stays and MP315 refuses it."""
    for path in sorted(res.decisions, key=ir.path_key, reverse=True):  # inner rules first
        decision = res.decisions[path].get("state")
        module = res.index.module(path)
        if decision is None or is_stateful(module):
            continue
        inside = [f"{path}.{name}" for name, sub in module.named_modules() if name and is_stateful(sub)]
        if not inside:
            continue
        del res.decisions[path]["state"]
        for sub in inside:
            res.decisions.setdefault(sub, {}).setdefault("state", decision)
    for path in [p for p, aspects in res.decisions.items() if not aspects]:
        del res.decisions[path]


def _no_match(res: Resolution, rule: ast.ModuleRule) -> None:
    text = format_selector(rule.selector)
    help_ = no_match_help(res.index, rule.selector.include)
    res.error("MP301", f"`{text}` matches no module of the model", rule.selector.span, help_)


# ---------------------------------------------------------------- legality checks


def _check_shared(res: Resolution) -> None:
    """A module registered under two paths must get one decision."""
    by_object: dict[int, str] = {}
    for path in res.index.paths:
        first = by_object.setdefault(id(res.index.module(path)), path)
        if first == path:
            continue
        a = {k: _bare(d.winner.policy) for k, d in res.decisions.get(first, {}).items()}
        b = {k: _bare(d.winner.policy) for k, d in res.decisions.get(path, {}).items()}
        if a != b:
            span = next(iter((res.decisions.get(path) or res.decisions[first]).values())).winner.policy.span
            res.error(
                "MP311",
                f"`{first}` and `{path}` are the same module object but the plan treats them differently",
                span,
                "a shared module runs one forward; give both paths the same policies",
            )
        else:
            # Install once, under the first path.
            if res.decisions.pop(path, None):
                res.shared_with[path] = first


def named(path: str) -> str:
    """A module path as messages quote it: the root (`module ""`) is the model itself."""
    return f"`{path}`" if path else 'the model itself (`""`)'


def _winner(res: Resolution, path: str, aspect: str):
    decision = res.decisions.get(path, {}).get(aspect)
    return None if decision is None else decision.winner.policy


def _check_regions(res: Resolution) -> None:
    """Nested regions (checkpoints, and regions inside time chunks), and `keep` inside a region."""
    checkpointed = [p for p in ("", *res.index.paths) if isinstance(_winner(res, p, RECOMPUTE), ast.Checkpoint)]
    marked = set(checkpointed)
    for path in res.index.paths:
        parts = path.split(".")
        for k in range(len(parts) - 1, -1, -1):  # down to the root, "" (`module ""`)
            ancestor = ".".join(parts[:k])
            if ancestor in marked:
                res.inside_region[path] = ancestor
                break
    for path in checkpointed:
        outer = res.inside_region.get(path)
        if outer is None:
            continue
        inner_policy = _winner(res, path, RECOMPUTE)
        outer_policy = _winner(res, outer, RECOMPUTE)
        if not (inner_policy.nested or outer_policy.nested):
            res.error(
                "MP305",
                f"`{path}` is checkpointed inside the checkpoint region of {named(outer)}",
                inner_policy.span,
                "nested regions recompute twice; drop one rule, or write `checkpoint nested = true`",
                notes=(("outer region", outer_policy.span),),
            )
    # A region inside time chunks: each chunk is a checkpointed region already.
    for path in res.index.paths:
        inner_policy = _region_policy(res, path)
        outer = chunked_ancestor(res, path) if inner_policy is not None else None
        if outer is None:
            continue
        outer_policy = _winner(res, outer, "temporal_chunk")
        what = "checkpointed" if isinstance(inner_policy, ast.Checkpoint) else "chunked"
        if not getattr(inner_policy, "nested", None):
            res.error(
                "MP305",
                f"`{path}` is {what} inside the time chunks of {named(outer)}",
                inner_policy.span,
                "each chunk is a checkpointed region already, so nested regions recompute twice; drop one rule"
                + (", or write `checkpoint nested = true`" if what == "checkpointed" else ""),
                notes=(("time chunks", outer_policy.span),),
            )
        elif (norm := _batch_norm_in(res.index.module(path), path)) is not None:
            res.error(
                "MP320",
                f"`{path}` is a region of its own inside the time chunks of {named(outer)}, and holds BatchNorm `{norm}`",
                inner_policy.span,
                "the chunks normalise with the statistics of all time steps, but this region's recompute in "
                "backward would use one chunk's; drop the inner rule, or chunk the modules inside instead",
                notes=(("time chunks", outer_policy.span),),
            )
    for path in res.decisions:
        keep = _winner(res, path, RECOMPUTE)
        outer = res.inside_region.get(path)
        if isinstance(keep, ast.Keep) and outer is not None:
            res.warn(
                "MP310",
                f"`keep` on `{path}` has no effect: it is inside the checkpoint region of {named(outer)}",
                keep.span,
                f"{named(outer)} recomputes everything inside it",
                notes=(("region", _winner(res, outer, RECOMPUTE).span),),
            )


def chunked_ancestor(res: Resolution, path: str) -> str | None:
    """The nearest enclosing module (itself excluded) that a `temporal_chunk` rule chunks."""
    parts = path.split(".") if path else []
    for k in range(len(parts) - 1, -1, -1):
        ancestor = ".".join(parts[:k])
        if "temporal_chunk" in res.decisions.get(ancestor, {}):
            return ancestor
    return None


def _region_policy(res: Resolution, path: str):
    """The rule that makes ``path`` a region: its `checkpoint`, else its `temporal_chunk`."""
    recompute = _winner(res, path, RECOMPUTE)
    return recompute if isinstance(recompute, ast.Checkpoint) else _winner(res, path, "temporal_chunk")


def _batch_norm_in(module: nn.Module, path: str) -> str | None:
    """The path of the first BatchNorm in ``module``'s subtree (itself included), or None."""
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            return f"{path}.{name}" if name else path
    return None


def _check_policies(res: Resolution) -> None:
    _check_model_checkpointing(res)
    for path in sorted(res.decisions, key=ir.path_key):
        module = res.index.module(path)
        recompute = _winner(res, path, RECOMPUTE)
        if isinstance(recompute, ast.Checkpoint):
            _check_checkpoint(res, path, module, recompute)
        chunk = _winner(res, path, "temporal_chunk")
        if chunk is not None:
            _check_chunk(res, path, module, chunk, recompute)
        state = _winner(res, path, "state")
        if state is not None and not is_stateful(module):
            res.error(
                "MP315",
                f"`state = functional` on `{path}`, a {type(module).__qualname__} that does not expose its "
                "state and holds no module that does",
                state.span,
                "mark the stateful modules themselves (e.g. `module class LIFNode { state = functional }`), or "
                f"implement `memoplan_state()` and `memoplan_load_state(state)` on {type(module).__qualname__} "
                "(`memoplan docs state`)",
            )
        if isinstance(recompute, ast.Checkpoint) or chunk is not None:
            _check_region_state(res, path, module, recompute, _winner(res, path, "compress"), chunk)
            _check_in_place(res, path, module, recompute, chunk)
        compress = _winner(res, path, "compress")
        if compress is not None and not isinstance(recompute, ast.Checkpoint) and chunk is None:
            res.error(
                "MP309",
                f"`compress` on `{path}` needs `checkpoint` on the same module",
                compress.span,
                "compression keeps the saved input of a checkpointed region; add `checkpoint` or `temporal_chunk`",
            )
        if compress is not None and not codecs.runs(compress.codec):
            res.error(
                "MP214",
                f"codec `{compress.codec.value}` has no implementation in this installation's runtime",
                compress.span,
                "register its encoder with `memoplan.runtime.codecs.register` before resolving, or use one of "
                + ", ".join(f"`{name}`" for name in codecs.registered()),
            )


def _check_chunk(res: Resolution, path: str, module: nn.Module, chunk: ast.TemporalChunk, recompute) -> None:
    if isinstance(recompute, ast.Keep):
        res.error(
            "MP207",
            f"`keep` and `temporal_chunk` contradict each other on `{path}`",
            chunk.span,
            "temporal chunks are checkpointed regions; drop one of the two rules",
            notes=(("`keep` here", recompute.span),),
        )
    if isinstance(recompute, ast.Checkpoint) and (recompute.segments or recompute.split):
        res.error(
            "MP316",
            f"`temporal_chunk` and `{'segments' if recompute.segments else 'split'}` on the same module `{path}`",
            chunk.span,
            "chunk the regions' children instead, or cut the module in one way only",
        )
    if chunk.boundaries is Boundaries.RECOMPUTE and not _region_state(res, path, module):
        res.warn(
            "MP321",
            f"`boundaries = recompute` on `{path}` has no effect: no module inside carries state from chunk to chunk",
            chunk.span,
            "the option recomputes the state each chunk starts from; mark the stateful modules "
            "`state = functional`, or drop it",
        )
    if chunk.allow_nonequivalent:
        return
    reasons = []
    for name, sub in module.named_modules():
        where = f"{path}.{name}" if name else path
        bases = [base.__name__ for base in type(sub).__mro__]
        if isinstance(sub, nn.SyncBatchNorm):
            # Other BatchNorms take the whole batch's statistics over the chunks
            # (memoplan/runtime/batchnorm.py); this one would also need them across ranks.
            reasons.append(f"SyncBatchNorm `{where}` takes its statistics across ranks, which chunks do not")
        elif isinstance(sub, (nn.MultiheadAttention, nn.RNNBase)) or any("Attention" in b for b in bases[:1]):
            reasons.append(f"`{where}` ({type(sub).__qualname__}) mixes time steps")
        elif "_DropoutNd" in bases:
            reasons.append(f"Dropout `{where}` would draw its mask chunk by chunk, which need not match one whole draw")
        elif _parallel_neuron(sub):
            reasons.append(
                f"`{where}` ({type(sub).__qualname__}) mixes time steps: each step's input is a weighted sum over steps"
            )
        elif getattr(sub, "memoplan_mixes_time", False):
            reasons.append(f"`{where}` ({type(sub).__qualname__}) processes the whole sequence at once")
    if reasons:
        res.error(
            "MP304",
            f"`temporal_chunk` on `{path}` is not equivalent: {reasons[0]}"
            + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""),
            chunk.span,
            "checkpoint the module instead, or write `allow_nonequivalent = true` to accept the difference",
        )


#: SpikingJelly's parallel spiking neurons: each step's potential is a learned mix of every step
#: of the sequence (PSN's T x T weight, MaskedPSN's band, SlidingPSN's window), so a chunk of
#: the time axis computes something else -- or a torch shape error, for PSN's fixed T.
_PARALLEL_NEURONS = frozenset({"PSN", "MaskedPSN", "SlidingPSN"})


def _parallel_neuron(module: nn.Module) -> bool:
    """Whether ``module`` is (a subclass of) one of SpikingJelly's parallel spiking neurons, by name."""
    return any(
        cls.__name__ in _PARALLEL_NEURONS and cls.__module__.startswith("spikingjelly.") for cls in type(module).__mro__
    )


def _check_in_place(res: Resolution, path: str, module: nn.Module, recompute, chunk) -> None:
    """A region whose first module overwrites its input in place (``ReLU(inplace=True)``) would
    recompute from the overwritten values; torch only notices in backward (a version error)."""
    policy = recompute if isinstance(recompute, ast.Checkpoint) else chunk
    groups = None
    if isinstance(recompute, ast.Checkpoint) and chunk is None and type(module).forward is nn.Sequential.forward:
        children = [n for n, child in module._modules.items() if child is not None]
        if recompute.segments or all(n in children for n in recompute.split or ()):  # else MP319
            groups = _split(module, recompute)
    firsts = [("", module)] if not groups else [(g[0], module.get_submodule(g[0])) for g in groups if g]
    for prefix, first in firsts:
        inner = _overwrites_input(first)
        if inner is None:
            continue
        where = ".".join(p for p in (path, prefix, inner) if p)
        parent = path.rpartition(".")[0]
        named = f"`{where}` ({type(res.index.module(where)).__qualname__}, inplace=True)"
        res.error(
            "MP323",
            (
                f"{named} overwrites its input in place"
                if where == path
                else f"the region of `{path}` starts with {named}, which overwrites the region's input in place"
            )
            + "; the recompute in backward would read the overwritten values",
            policy.span,
            (
                f"checkpoint the module that calls it instead (e.g. `module {parent} {{ checkpoint }}`), or "
                if parent
                else "leave it out of the region, or "
            )
            + f"build `{where}` with `inplace=False`",
        )
        return


def _overwrites_input(module: nn.Module) -> str | None:
    """The relative path ("" for itself) of the module that overwrites ``module``'s input in place
    as the first thing it runs, seen through nn.Sequential's first children; None if none is known."""
    name = ""
    while getattr(module, "inplace", None) is not True:
        first = next(((n, c) for n, c in module._modules.items() if c is not None), None)
        if type(module).forward is not nn.Sequential.forward or first is None:
            return None
        name, module = (f"{name}.{first[0]}" if name else first[0]), first[1]
    return name


def _check_region_state(res: Resolution, path: str, module: nn.Module, recompute, compress, chunk) -> None:
    """Stateful modules inside a region must be marked; torch's checkpoint cannot carry them."""
    unmarked = [
        f"{path}.{name}" if name else path
        for name, sub in module.named_modules()
        if is_stateful(sub) and _winner(res, f"{path}.{name}" if name else path, "state") is None
    ]
    span = (chunk or recompute).span
    if unmarked:
        res.error(
            "MP314",
            f"the region of `{path}` contains stateful `{unmarked[0]}`"
            + (f" and {len(unmarked) - 1} more" if len(unmarked) > 1 else "")
            + ", whose state recompute would advance a second time",
            span,
            f"add `module {unmarked[0]} {{ state = functional }}` (or `module class "
            f"{type(res.index.module(unmarked[0])).__name__} {{ state = functional }}`)",
        )
    if isinstance(recompute, ast.Checkpoint) and recompute.save:
        runs = _own_region_needs(res, path, module, compress, chunk)
        if runs:
            res.error(
                "MP325",
                f"`save = [...]` on `{path}`, a region that also has {' and '.join(runs)}: memoplan's own "
                "region runs those, and it does not save ops",
                recompute.span,
                "drop `save` (a plain checkpoint), or the other policy",
            )
    if isinstance(recompute, ast.Checkpoint) and recompute.impl is ast.CheckpointImpl.TORCH:
        needs = _own_region_needs(res, path, module, compress, chunk)
        if needs:
            res.error(
                "MP317",
                f"`impl = torch` on `{path}` cannot run {' and '.join(needs)}",
                recompute.span,
                "drop `impl = torch`: memoplan's own region runs them",
            )


def _region_state(res: Resolution, path: str, module: nn.Module) -> tuple[str, ...]:
    """Relative paths of the `state = functional` modules in ``module``'s subtree."""
    found = []
    for name, _ in module.named_modules():
        full = f"{path}.{name}" if name else path
        if isinstance(_winner(res, full, "state"), ast.State):
            found.append(name)
    return tuple(sorted(found, key=ir.path_key))


def _own_region_needs(res: Resolution, path: str, module, compress, chunk) -> list[str]:
    """What only memoplan's own region runs for ``path``: compression, time chunks, state."""
    return [
        word
        for word, present in (
            ("compress", compress is not None),
            ("temporal_chunk", chunk is not None),
            ("stateful modules", bool(_region_state(res, path, module))),
        )
        if present
    ]


def _check_model_checkpointing(res: Resolution) -> None:
    """A Hugging Face model whose own gradient checkpointing is on recomputes its layers already."""
    regions = [p for p in res.decisions if _region_policy(res, p) is not None]
    own = [p for p in res.index.paths if getattr(res.index.module(p), "gradient_checkpointing", None) is True]
    if not regions or not own:
        return
    spans = sorted((_region_policy(res, p).span for p in regions), key=lambda s: (s.line, s.column))
    first = min(regions, key=lambda p: (_region_policy(res, p).span.line, ir.path_key(p)))
    res.warn(
        "MP322",
        f"the model's own activation checkpointing (Hugging Face's `gradient_checkpointing` switch) is on (`{own[0]}`"
        + (f" and {len(own) - 1} more" if len(own) > 1 else "")
        + f"), and the plan checkpoints `{first}`"
        + (f" and {len(regions) - 1} more" if len(regions) > 1 else "")
        + ": layers would be recomputed twice",
        spans[0],
        "keep one: call `model.activation_checkpointing_disable()` (before transformers 5: `model.gradient_"
        "checkpointing_disable()`) before applying the plan and leave the Trainer's `activation_checkpointing` "
        "off, so that the plan decides what is recomputed, or drop the plan's `checkpoint` and `temporal_chunk` rules",
    )


def _check_checkpoint(res: Resolution, path: str, module: nn.Module, policy: ast.Checkpoint) -> None:
    if policy.segments is None and type(module).forward is nn.Module.forward:
        # nn.ModuleList / nn.ModuleDict are never called: a checkpoint patched onto their
        # forward would silently do nothing while explain reports the children recomputed.
        res.error(
            "MP312",
            f"`{path}` is a {type(module).__qualname__}, which is never called; `checkpoint` would do nothing",
            policy.span,
            "checkpoint its children instead, e.g. `module " + path + ".* { checkpoint }`",
        )
    if policy.segments is not None:
        if type(module).forward is not nn.Sequential.forward:
            res.error(
                "MP306",
                f"`segments` needs an nn.Sequential; `{path}` is {type(module).__qualname__}",
                policy.span,
                "checkpoint its children instead, e.g. `module " + path + ".* { checkpoint }`",
            )
        elif policy.segments > len(module._modules):
            res.warn(
                "MP307",
                f"`segments = {policy.segments}` over {len(module._modules)} children of `{path}`: "
                f"using {len(module._modules)}",
                policy.span,
                f"write `segments = {len(module._modules)}`",
            )
    if policy.split is not None:
        children = [n for n, child in module._modules.items() if child is not None]
        if type(module).forward is not nn.Sequential.forward:
            res.error(
                "MP306",
                f"`split` needs an nn.Sequential; `{path}` is {type(module).__qualname__}",
                policy.span,
                "checkpoint its children instead, e.g. `module " + path + ".* { checkpoint }`",
            )
        else:
            missing = [n for n in policy.split if n not in children]
            positions = [children.index(n) for n in policy.split if n in children]
            if missing:
                res.error(
                    "MP319",
                    f"`split` names `{missing[0]}`, which is not a child of `{path}`",
                    policy.span,
                    did_you_mean(missing[0], children) or "children: " + ", ".join(children[:12]),
                )
            elif positions != sorted(set(positions)) or 0 in positions:
                res.error(
                    "MP319",
                    f"`split` over `{path}` must name children in order, once each, after the first",
                    policy.span,
                    "children in order: " + ", ".join(children[:12]),
                )
    if policy.rng is ast.RngMode.OFF:
        random = [
            name or path
            for name, sub in module.named_modules()
            if any("Dropout" in base.__name__ for base in type(sub).__mro__)
        ]
        if random:
            res.error(
                "MP308",
                f"`rng = off` on `{path}`, which contains random modules ({', '.join(random[:3])})",
                policy.span,
                "recompute would draw different dropout masks; drop `rng = off`",
            )


# ---------------------------------------------------------------- IR


def _origin(res: Resolution, candidate: Candidate) -> ir.Origin:
    return ir.Origin(
        res.plan.file,
        candidate.policy.span.line,
        format_selector(candidate.rule.selector),
        format_policy(candidate.policy),
    )


def _split(module: nn.Module, policy: ast.Checkpoint) -> tuple[tuple[str, ...], ...] | None:
    if policy.segments:
        return _groups(module, policy.segments)
    if policy.split:
        names = [n for n, child in module._modules.items() if child is not None]
        cuts = [0] + [names.index(n) for n in policy.split] + [len(names)]
        return tuple(tuple(names[a:b]) for a, b in zip(cuts, cuts[1:]))
    return None


def _groups(module: nn.Module, segments: int) -> tuple[tuple[str, ...], ...]:
    names = [n for n, child in module._modules.items() if child is not None]
    if not names:
        return ()  # an empty nn.Sequential: nothing to split (MP307 said so)
    k = min(segments, len(names))
    size, extra = divmod(len(names), k)
    groups, start = [], 0
    for g in range(k):
        stop = start + size + (1 if g < extra else 0)
        groups.append(tuple(names[start:stop]))
        start = stop
    return tuple(groups)


def _checkpoint_action(origin: ir.Origin, policy: ast.Checkpoint, module: nn.Module) -> ir.CheckpointAction:
    return ir.CheckpointAction(
        origin,
        groups=_split(module, policy),
        preserve_rng=policy.rng is not ast.RngMode.OFF,
        nested=bool(policy.nested),
        save=policy.save or (),
    )


def _compress_action(origin: ir.Origin, policy: ast.Compress, module: nn.Module) -> ir.CompressAction:
    return ir.CompressAction(origin, policy.codec, policy.tolerance, policy.validate or Validate.SAMPLE)


def _temporal_chunk_action(origin: ir.Origin, policy: ast.TemporalChunk, module: nn.Module) -> ir.TemporalChunkAction:
    return ir.TemporalChunkAction(
        origin,
        policy.chunks,
        policy.dim,
        policy.args or (0,),
        bool(policy.allow_nonequivalent),
        policy.boundaries or Boundaries.KEEP,
    )


# A winning policy, by its spec's name (syntax/policies.py) -> the IR action it binds to its module.
_ACTIONS: dict[str, Callable[[ir.Origin, Any, nn.Module], ir.Action]] = {
    "checkpoint": _checkpoint_action,
    "compress": _compress_action,
    "temporal_chunk": _temporal_chunk_action,
    "keep": lambda origin, policy, module: ir.KeepAction(origin),
    "state": lambda origin, policy, module: ir.StateAction(origin, policy.mode),
    "buffers": lambda origin, policy, module: ir.BuffersCommitOnceAction(origin),
}


def _module_plan(res: Resolution, path: str, evict: ir.EvictAction | None) -> ir.ModulePlan:
    """The IR of one module: an action per aspect's winning rule, and ``evict`` (a ``dtr``
    candidate, alone or beside a ``state`` or ``buffers`` rule)."""
    module = res.index.module(path)
    actions: list[ir.Action] = []
    for decision in res.decisions.get(path, {}).values():
        policy = decision.winner.policy
        actions.append(_ACTIONS[spec_of(policy).name](_origin(res, decision.winner), policy, module))
    if evict is not None:
        actions.append(evict)
    region = any(isinstance(a, ir.REGION_ACTIONS) for a in actions)
    return ir.ModulePlan(
        path,
        qualified_type_name(type(module)),
        tuple(actions),
        region_state=_region_state(res, path, module) if region else (),
    )


def _to_ir(res: Resolution) -> ir.ResolvedPlan:
    plan = res.plan
    dtr_block = plan.block(ast.BlockKind.DTR)
    evict = None if dtr_block is None else ir.EvictAction(ir.Origin(plan.file, dtr_block.span.line, "dtr", "dtr"))
    paths = dict.fromkeys([*res.decisions, *res.evictable])
    modules = [
        _module_plan(res, path, evict if path in res.evictable else None) for path in sorted(paths, key=ir.path_key)
    ]
    blocks = {kind: plan.block(kind) for kind in ast.BlockKind}
    return ir.ResolvedPlan(
        file=plan.file,
        modules=tuple(modules),
        budget=plan.budget,
        dtr=_config(blocks[ast.BlockKind.DTR]),
        sublinear=_config(blocks[ast.BlockKind.SUBLINEAR]),
        memory=_config(blocks[ast.BlockKind.MEMORY]),
        memonger=_config(blocks[ast.BlockKind.MEMONGER]),
        warnings=tuple(_in_order(d for d in res.diagnostics if not d.is_error)),
    )


def _config(block):
    return None if block is None else config_of(block)
