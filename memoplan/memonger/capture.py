"""Memonger stage: capture a model's inference forward as a :class:`Program`.

``torch.export`` (non-strict) traces the model in ``eval()`` mode with the plan's
example; the graph is then run once, eagerly, on the example, which tells for every
value whether it is a fresh allocation or a view of another (by storage), and checks
for each op that its ``out=`` variant, writing into an arena view shaped like the
op's own result, gives the same bits.  The model is left as it was: training flags,
tensor attributes, buffers and the RNG are restored, whatever happens.

What cannot be captured is a :class:`~memoplan.diagnostics.PlanError` naming the
module and the cause: ``MP240`` (the trace fails: a graph break), ``MP241`` (the
forward keeps state between calls: it assigns a tensor attribute or writes a
buffer), ``MP242`` (the graph holds something the arena module cannot run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.export.graph_signature import InputKind
from torch.utils import _pytree as pytree

from memoplan.diagnostics import Diagnostic, PlanError, Span
from memoplan.memonger.probe import allocated_inside, bind, out_form, real, refs, writes_over
from memoplan.memonger.program import BufferInfo, Const, ConstGuard, Program, Ref, Step, TensorGuard

_LITERALS = (bool, int, float, str, type(None))


def capture(model: nn.Module, args: tuple, kwargs: dict, *, span: Span | None = None) -> Program:
    """The program of ``model(*args, **kwargs)`` in eval mode without grad; the model is unchanged."""
    with _untouched(model, span) as check_state:
        with torch.no_grad():  # one eager call first: does it keep state between calls?
            model(*args, **kwargs)
        check_state()
        exported = _export(model, args, kwargs, span)
        return _program(model, exported, args, kwargs, span)


def describe_model(model: nn.Module) -> str:
    return f"the model ({type(model).__qualname__})"


# ---------------------------------------------------------------- export


def _export(model: nn.Module, args: tuple, kwargs: dict, span: Span | None):
    stack: list[str] = []
    paths = {id(m): p for p, m in model.named_modules()}
    failed_in: list[str] = []

    def enter(module, _inputs):
        stack.append(paths.get(id(module), "?"))

    def leave(module, _inputs, _output):
        if stack:
            stack.pop()

    hooks = [
        nn.modules.module.register_module_forward_pre_hook(enter),
        nn.modules.module.register_module_forward_hook(leave),
    ]
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return torch.export.export(model, args, kwargs, strict=False)
            except Exception as error:  # any failure of the trace is the model's, reported with its cause
                failed_in.extend(stack)
                where = f"`{failed_in[-1]}`" if failed_in and failed_in[-1] else describe_model(model)
                raise _error(
                    "MP240",
                    f"memonger cannot capture {where} with torch.export: {type(error).__name__}: {_first_line(error)}",
                    span,
                    "the arena runs one graph of the whole model; make that forward traceable "
                    "(no data-dependent Python control flow) or remove the `memonger` block; nothing was applied",
                ) from None
    finally:
        for hook in hooks:
            hook.remove()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else "(no message)"


def _error(code: str, message: str, span: Span | None, help: str | None = None) -> PlanError:
    return PlanError((Diagnostic(code, message, span, help),))


# ---------------------------------------------------------------- leaving the model as it was


@contextlib.contextmanager
def _untouched(model: nn.Module, span: Span | None) -> Iterator[Callable[[], None]]:
    modules = list(model.named_modules(remove_duplicate=False))
    training = [(m, m.training) for _, m in modules]
    attributes = {id(m): (m, _tensor_attributes(m)) for _, m in modules}
    buffers = [(b, b.detach().clone(), b._version) for b in model.buffers()]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def check_state() -> None:
        """MP241 if tracing the forward assigned a tensor attribute or wrote a buffer."""
        for path, module in modules:
            before = attributes[id(module)][1]
            after = _tensor_attributes(module)
            changed = sorted(k for k in before.keys() | after.keys() if before.get(k) is not after.get(k))
            if changed:
                raise _error(
                    "MP241",
                    f"`{path or type(model).__qualname__}` assigns the tensor attribute "
                    f"`{changed[0]}` in its forward: it keeps state between calls, which one captured graph "
                    "cannot carry",
                    span,
                    "memonger plans stateless inference graphs; remove the `memonger` block (nothing was applied)",
                )
        for name, buffer in model.named_buffers():
            if any(buffer is b and buffer._version != v for b, _, v in buffers):
                raise _error(
                    "MP241",
                    f"the forward writes the buffer `{name}` in eval mode: it keeps state between calls, "
                    "which one captured graph cannot carry",
                    span,
                    "memonger plans stateless inference graphs; remove the `memonger` block (nothing was applied)",
                )

    try:
        model.eval()
        yield check_state
        check_state()  # the capture run, too
    finally:
        for module, flag in training:
            module.training = flag
        for module, before in attributes.values():
            after = _tensor_attributes(module)
            for key in after.keys() - before.keys():
                del module.__dict__[key]
            for key, value in before.items():
                module.__dict__[key] = value
        with torch.no_grad():
            for buffer, saved, version in buffers:
                if buffer._version != version:
                    buffer.copy_(saved)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _tensor_attributes(module: nn.Module) -> dict[str, Any]:
    return {k: v for k, v in module.__dict__.items() if isinstance(v, torch.Tensor)}


# ---------------------------------------------------------------- the program


class _Builder:
    def __init__(self, model: nn.Module, span: Span | None) -> None:
        self.model = model
        self.span = span
        self.names: list[str] = []
        self.values: list[Any] = []  # the real values of the capture run
        self.root: dict[int, int] = {}  # value -> the value whose storage it uses (itself if fresh)
        self.storage_owner: dict[tuple, int] = {}  # storage (device type, index, data_ptr) -> the value that made it
        self.producer: dict[int, int] = {}  # value -> step that defined it
        self.steps: list[Step] = []
        self.deps: list[set[int]] = []
        self.fresh: list[int] = []  # values that are fresh allocations by a step
        self.over: dict[int, int] = {}  # step -> the fresh value its out form may write over
        self.workspaces: dict[int, int] = {}  # step -> bytes its op allocates and frees inside (as the model calls it)
        self.external: set[int] = set()
        self.written: dict[int, set[int]] = {}  # step -> roots it writes in place
        self.random: list[int] = []  # steps that draw random numbers
        self.out_variants: dict[int, tuple[Step, str, int]] = {}  # step -> its out= form (buffer -1) or why
        # not, and the scratch bytes the form allocates
        self.allocates: dict[tuple, int] = {}  # (out= overload, argument signature) -> bytes it allocates inside

    def add_value(self, name: str, value: Any, step: int | None) -> int:
        index = len(self.values)
        self.values.append(value)
        self.names.append(name)
        if step is not None:
            self.producer[index] = step
        owner = None
        if isinstance(value, torch.Tensor):
            owner = self._storage_owner(value)
        if isinstance(value, (tuple, list)):
            for element in value:  # fresh results of a multi-result op belong to the op's value
                if element.untyped_storage().nbytes() and self._storage_owner(element) is None:
                    self.storage_owner[_storage_key(element)] = index
        if owner is not None:
            self.root[index] = self.root[owner]
        else:
            self.root[index] = index
            if isinstance(value, torch.Tensor):
                self.storage_owner[_storage_key(value)] = index
                if step is None:
                    self.external.add(index)
                else:
                    self.fresh.append(index)
            elif step is None:
                self.external.add(index)
        return index

    def _storage_owner(self, tensor: torch.Tensor) -> int | None:
        if tensor.untyped_storage().nbytes() == 0:
            return None
        return self.storage_owner.get(_storage_key(tensor))

    def error(self, message: str, node=None) -> PlanError:
        where = _module_of(node) if node is not None else ""
        place = f"`{where}`" if where else describe_model(self.model)
        return _error(
            "MP242",
            f"memonger cannot run {place} from its captured graph: {message}",
            self.span,
            "remove the `memonger` block (nothing was applied)",
        )


def _storage_key(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()
    return (tensor.device.type, tensor.device.index, storage.data_ptr())


def _module_of(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, _cls = list(stack.values())[-1]
    return path if isinstance(path, str) else ""


def _program(model: nn.Module, exported, args: tuple, kwargs: dict, span: Span | None) -> Program:
    b = _Builder(model, span)
    signature = exported.graph_signature
    mutated = list(signature.buffers_to_mutate.values()) + list(signature.user_inputs_to_mutate.values())
    if mutated:
        raise _error(
            "MP241",
            f"the forward writes `{mutated[0]}` in eval mode: it keeps state between calls, "
            "which one captured graph cannot carry",
            span,
            "memonger plans stateless inference graphs; remove the `memonger` block (nothing was applied)",
        )
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    if spec != exported.call_spec.in_spec:
        raise b.error("torch.export flattened the example's arguments in another order")
    guards = _example_guards(b, leaves)
    graph = exported.graph
    env: dict[Any, int] = {}
    attributes = _graph_inputs(b, model, exported, leaves, env)
    with torch.no_grad():
        for node in graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                continue
            if node.op == "output":
                outputs = tuple(_literal(a, env, b, node) for a in node.args[0])
                out_spec = exported.call_spec.out_spec
                if len(outputs) != out_spec.num_leaves:
                    raise b.error(f"the graph returns {len(outputs)} values for {out_spec.num_leaves} outputs")
                break
            if node.op != "call_function":
                raise b.error(f"the graph has a `{node.op}` node `{node.name}`", node)
            _add_step(b, node, env)
        else:  # pragma: no cover - an fx graph always ends with its output node
            raise b.error("the graph has no output")
        return _finish(b, model, guards, leaves, spec, out_spec, attributes, outputs)


def _example_guards(b: _Builder, leaves: list) -> list[TensorGuard | ConstGuard]:
    """What the generated module checks of each example leaf: a tensor's dtype, shape and
    stride, a constant's value; the leaves' tensors on one device."""
    guards: list[TensorGuard | ConstGuard] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            guards.append(_tensor_guard(leaf))
        elif isinstance(leaf, _LITERALS):
            guards.append(ConstGuard(leaf))
        else:
            raise b.error(f"an example argument is a {type(leaf).__name__}, not a tensor or a plain constant")
    devices = {leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor)}
    if len(devices) > 1:
        raise b.error(f"the example's tensors are on several devices ({sorted(map(str, devices))})")
    return guards


def _graph_inputs(b: _Builder, model: nn.Module, exported, leaves: list, env: dict[Any, int]) -> list[str]:
    """The graph's placeholders as values (into ``env``): the example's leaves, then the model's
    parameters and buffers the graph reads, whose paths are returned."""
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]
    specs_in = exported.graph_signature.input_specs
    user = [n for n, s in zip(placeholders, specs_in) if s.kind == InputKind.USER_INPUT]
    if len(placeholders) != len(specs_in) or len(user) != len(leaves):
        raise b.error(f"the graph takes {len(user)} inputs for {len(leaves)} example leaves")
    for node, leaf in zip(user, leaves):
        env[node] = b.add_value(node.name, leaf, None)
    attributes = []
    for node, spec_in in zip(placeholders, specs_in):
        if spec_in.kind == InputKind.USER_INPUT:
            continue
        value = _attribute(model, spec_in.target) if spec_in.kind in (InputKind.PARAMETER, InputKind.BUFFER) else None
        if not isinstance(value, torch.Tensor):
            raise b.error(
                f"the graph reads `{spec_in.target}` ({spec_in.kind.name.lower()}), which is not a parameter "
                "or buffer of the model (a tensor made outside the forward is baked into the graph)"
            )
        attributes.append(spec_in.target)
        env[node] = b.add_value(node.name, value, None)
    return attributes


def _tensor_guard(tensor: torch.Tensor) -> TensorGuard:
    return TensorGuard(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tuple(tensor.stride()))


def _attribute(model: nn.Module, path: str) -> Any:
    value: Any = model
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _literal(arg, env, b: _Builder, node):
    if isinstance(arg, torch.fx.Node):
        return Ref(env[arg])
    if isinstance(arg, (list, tuple)):
        return tuple(_literal(a, env, b, node) for a in arg)
    if isinstance(arg, _LITERALS):
        return arg
    if isinstance(arg, torch.dtype):
        return Const("dtype", str(arg).removeprefix("torch."))
    if isinstance(arg, torch.device):
        return Const("device", str(arg))
    if isinstance(arg, torch.layout):
        return Const("layout", str(arg).removeprefix("torch."))
    if isinstance(arg, torch.memory_format):
        return Const("memory_format", str(arg).removeprefix("torch."))
    raise b.error(f"an argument of `{node.name}` is a {type(arg).__name__}, which cannot be written as code", node)


def _add_step(b: _Builder, node, env) -> None:
    target = node.target
    module = _module_of(node)
    index = len(b.steps)
    args = tuple(_literal(a, env, b, node) for a in node.args)
    kwargs = tuple((k, _literal(v, env, b, node)) for k, v in node.kwargs.items())
    if target is operator.getitem:
        source, item = b.values[args[0].index], args[1]
        value = source[item]
        op = function = "getitem"
    elif isinstance(target, torch._ops.OpOverload):
        op = function = _op_name(target, b, node)
        call_args = [real(a, b) for a in args]
        call_kwargs = {k: real(v, b) for k, v in kwargs}
        tensors = [t for t in pytree.tree_leaves((call_args, call_kwargs)) if isinstance(t, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        allocated, value = allocated_inside(lambda: target(*call_args, **call_kwargs), device)
        b.workspaces[index] = max(0, allocated - _new_bytes(b, value))
    else:
        raise b.error(f"the graph calls `{getattr(target, '__name__', target)}`, which is not an ATen op", node)
    if not _storable(value):
        raise b.error(f"`{node.name}` returns a {type(value).__name__}, not tensors", node)
    result = b.add_value(node.name, value, index) if value is not None else None
    if result is not None:
        env[node] = result
    reads = {a.index for a in refs(args)} | {a.index for a in refs(tuple(v for _, v in kwargs))}
    deps = {b.producer[r] for r in reads if r in b.producer}
    b.deps.append(deps)
    step = Step(op, args, kwargs, result, function, module)
    if isinstance(target, torch._ops.OpOverload):
        step = _mutation_and_order(b, target, step, reads)
        if (
            isinstance(value, torch.Tensor)
            and result is not None
            and b.root.get(result) == result
            and not b.written[index]
        ):
            # Probed now, while the arguments and the result hold the values this step saw:
            # a later step may write either in place.
            b.out_variants[index] = out_form(b, step, value, -1)
            out_step, note, _ = b.out_variants[index]
            if not note:
                over = writes_over(b, target, out_step, value)
                if over is not None:
                    b.over[index] = over
    b.steps.append(step)


def _new_bytes(b: _Builder, value) -> int:
    """Bytes of the storages among ``value``'s tensors that no earlier value lives in."""
    seen: set = set()
    total = 0
    for tensor in pytree.tree_leaves(value):
        if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
            key = _storage_key(tensor)
            if key not in seen and key not in b.storage_owner:
                seen.add(key)
                total += tensor.untyped_storage().nbytes()
    return total


def _storable(value) -> bool:
    if value is None or isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value)


def _op_name(op, b: _Builder, node) -> str:
    namespace = op.namespace
    name = op._schema.name.split("::", 1)[-1]
    overload = op._overloadname
    if not all(part.isidentifier() for part in (namespace, name, overload)):
        raise b.error(f"the op `{op}` has a name that is not an identifier", node)
    return f"{namespace}.{name}.{overload}"


def _mutation_and_order(b: _Builder, op, step: Step, reads: set[int]) -> Step:
    """Record what an op writes in place and whether it draws random numbers: such steps keep
    their place among the steps that touch the same storage (or draw from the generator)."""
    index = len(b.steps)
    bound = bind(op._schema, step.args, step.kwargs)
    written = set()
    for argument in op._schema.arguments:
        info = argument.alias_info
        if info is not None and info.is_write and argument.name in bound:
            written |= {b.root[r.index] for r in refs((bound[argument.name],))}
    b.written[index] = written
    if torch.Tag.nondeterministic_seeded in op.tags:
        b.random.append(index)
    return step


def _touches(b: _Builder, step: Step) -> set[int]:
    return {b.root[r.index] for r in refs(step.args + tuple(v for _, v in step.kwargs))}


def _order_edges(b: _Builder) -> None:
    """In-place writes: after every earlier step touching the storage, before every later one.
    Random ops: in their captured order."""
    touching: dict[int, list[int]] = {}
    for index, step in enumerate(b.steps):
        for root in _touches(b, step):
            touching.setdefault(root, []).append(index)
    for writer, roots in b.written.items():
        for root in roots:
            for other in touching.get(root, ()):
                if other < writer:
                    b.deps[writer].add(other)
                elif other > writer:
                    b.deps[other].add(writer)
    for before, after in zip(b.random, b.random[1:]):
        b.deps[after].add(before)


def _finish(b: _Builder, model, guards, leaves, spec, out_spec, attributes, outputs) -> Program:
    _order_edges(b)
    pinned = {b.root[o.index] for o in outputs if isinstance(o, Ref)}
    users: dict[int, set[int]] = {}
    for index, step in enumerate(b.steps):
        for root in _touches(b, step):
            users.setdefault(root, set()).add(index)
    buffers = [_buffer_info(b, value, number, pinned, users) for number, value in enumerate(b.fresh)]
    buffer_of = {info.value: i for i, info in enumerate(buffers)}
    for i, info in enumerate(buffers):
        over = buffer_of.get(b.over.get(info.producer, -1))
        if info.arena and over is not None and buffers[over].arena:
            buffers[i] = dataclasses.replace(info, over=over)
    device = next((str(leaf.device) for leaf in leaves if isinstance(leaf, torch.Tensor)), "cpu")
    return Program(
        model_class=type(model).__qualname__,
        device=device,
        inputs=tuple(guards),
        in_spec=pytree.treespec_dumps(spec),
        out_spec=pytree.treespec_dumps(out_spec),
        attributes=tuple(attributes),
        attribute_guards=tuple(_tensor_guard(b.values[len(guards) + i]) for i in range(len(attributes))),
        names=tuple(b.names),
        steps=tuple(b.steps),
        deps=tuple(tuple(sorted(d)) for d in b.deps),
        buffers=tuple(buffers),
        outputs=outputs,
        workspaces=tuple(b.workspaces.get(i, 0) for i in range(len(b.steps))),
    )


def _buffer_info(b: _Builder, value: int, number: int, pinned: set[int], users: dict[int, set[int]]) -> BufferInfo:
    """The ``number``-th buffer, the fresh ``value``: its size, layout and readers, and whether it
    may live in the arena (its producer's out= form) or, in a note on the producer, why not."""
    step_index = b.producer[value]
    step = b.steps[step_index]
    tensor = b.values[value]
    note = _why_not(b, step_index, step, value, tensor, pinned)
    out_step = None
    scratch = 0
    if not note:
        candidate, note, scratch = b.out_variants[step_index]
        if not note:
            out_step = Step(
                candidate.op,
                candidate.args,
                candidate.kwargs,
                candidate.result,
                candidate.function,
                candidate.module,
                number,
            )
    if note and not step.note:
        b.steps[step_index] = Step(step.op, step.args, step.kwargs, step.result, step.function, step.module, None, note)
    return BufferInfo(
        value=value,
        producer=step_index,
        users=tuple(sorted(users.get(value, ()))),
        size=tensor.untyped_storage().nbytes(),
        dtype=str(tensor.dtype).removeprefix("torch."),
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        arena=not note,
        note=note,
        out_step=out_step,
        scratch=scratch if out_step is not None else 0,
    )


def _why_not(b: _Builder, index: int, step: Step, value: int, tensor: torch.Tensor, pinned: set[int]) -> str:
    """Why the fresh ``tensor`` made by ``step`` cannot live in the arena; empty if it can."""
    if value in pinned:
        return "an output of the model: a tensor of its own on every call"
    if step.op == "getitem" or step.result != value:
        return "one of several results of an op: allocated by the op"
    if tensor.untyped_storage().nbytes() == 0:
        return "no bytes"
    if tensor.storage_offset() != 0:
        return "a view into its own allocation"
    if b.written.get(index) or index in b.random:
        return "an op that writes in place or draws random numbers"
    return ""
