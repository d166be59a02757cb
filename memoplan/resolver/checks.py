"""The resolver's legality checks: what a plan bound to a model may not do (nested regions, a
region over state or an in-place first module, options the module cannot take, ...), each a coded
diagnostic added to the :class:`~memoplan.resolver.resolution.Resolution`; nothing here changes
a decision.
"""

from __future__ import annotations

from torch import nn

from memoplan import ir
from memoplan.diagnostics import did_you_mean
from memoplan.enums import Boundaries
from memoplan.resolver.lower import checkpoint_groups
from memoplan.resolver.resolution import RECOMPUTE, Resolution, bare, chunked_ancestor, named, region_state, winner
from memoplan.runtime import codecs
from memoplan.runtime.state import is_stateful
from memoplan.syntax import ast


def check(res: Resolution) -> None:
    """Every legality check, in the order their diagnostics are found."""
    _check_shared(res)
    _check_regions(res)
    _check_policies(res)


def _check_shared(res: Resolution) -> None:
    """A module registered under two paths must get one decision."""
    by_object: dict[int, str] = {}
    for path in res.index.paths:
        first = by_object.setdefault(id(res.index.module(path)), path)
        if first == path:
            continue
        a = {k: bare(d.winner.policy) for k, d in res.decisions.get(first, {}).items()}
        b = {k: bare(d.winner.policy) for k, d in res.decisions.get(path, {}).items()}
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


def _check_regions(res: Resolution) -> None:
    """Nested regions (checkpoints, and regions inside time chunks), and `keep` inside a region."""
    checkpointed = [p for p in ("", *res.index.paths) if isinstance(winner(res, p, RECOMPUTE), ast.Checkpoint)]
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
        inner_policy = winner(res, path, RECOMPUTE)
        outer_policy = winner(res, outer, RECOMPUTE)
        if not (inner_policy.nested or outer_policy.nested):
            res.error(
                "MP305",
                f"`{path}` is checkpointed inside the checkpoint region of {named(outer)}",
                inner_policy.span,
                "nested regions recompute twice; drop one rule, or write `checkpoint nested = true`",
                notes=(("outer region", outer_policy.span),),
            )
    _check_regions_in_chunks(res)
    _check_keep_in_regions(res)


def _check_regions_in_chunks(res: Resolution) -> None:
    """A region inside time chunks: each chunk is a checkpointed region already."""
    for path in res.index.paths:
        inner_policy = _region_policy(res, path)
        outer = chunked_ancestor(res, path) if inner_policy is not None else None
        if outer is None:
            continue
        outer_policy = winner(res, outer, "temporal_chunk")
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


def _check_keep_in_regions(res: Resolution) -> None:
    """`keep` inside a checkpoint region does nothing."""
    for path in res.decisions:
        keep = winner(res, path, RECOMPUTE)
        outer = res.inside_region.get(path)
        if isinstance(keep, ast.Keep) and outer is not None:
            res.warn(
                "MP310",
                f"`keep` on `{path}` has no effect: it is inside the checkpoint region of {named(outer)}",
                keep.span,
                f"{named(outer)} recomputes everything inside it",
                notes=(("region", winner(res, outer, RECOMPUTE).span),),
            )


def _region_policy(res: Resolution, path: str):
    """The rule that makes ``path`` a region: its `checkpoint`, else its `temporal_chunk`."""
    recompute = winner(res, path, RECOMPUTE)
    return recompute if isinstance(recompute, ast.Checkpoint) else winner(res, path, "temporal_chunk")


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
        recompute = winner(res, path, RECOMPUTE)
        if isinstance(recompute, ast.Checkpoint):
            _check_checkpoint(res, path, module, recompute)
        chunk = winner(res, path, "temporal_chunk")
        if chunk is not None:
            _check_chunk(res, path, module, chunk, recompute)
        state = winner(res, path, "state")
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
            _check_region_state(res, path, module, recompute, winner(res, path, "compress"), chunk)
            _check_in_place(res, path, module, recompute, chunk)
        compress = winner(res, path, "compress")
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
    if chunk.boundaries is Boundaries.RECOMPUTE and not region_state(res, path, module):
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
            groups = checkpoint_groups(module, recompute)
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
        if is_stateful(sub) and winner(res, f"{path}.{name}" if name else path, "state") is None
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


def _own_region_needs(res: Resolution, path: str, module, compress, chunk) -> list[str]:
    """What only memoplan's own region runs for ``path``: compression, time chunks, state."""
    return [
        word
        for word, present in (
            ("compress", compress is not None),
            ("temporal_chunk", chunk is not None),
            ("stateful modules", bool(region_state(res, path, module))),
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
        _check_split(res, path, module, policy)
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


def _check_split(res: Resolution, path: str, module: nn.Module, policy: ast.Checkpoint) -> None:
    """`split` names children of an nn.Sequential, in order, once each, after the first."""
    assert policy.split is not None
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
