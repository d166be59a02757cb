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
from memoplan.memonger.program import BufferInfo, Const, ConstGuard, Program, Ref, ScalarTensor, Step, TensorGuard
from memoplan.runtime import arena_into
from memoplan.runtime.arena_into import FORMS, scalar

_OPTIONS = {"dtype", "layout", "device", "pin_memory"}  # dropped by out= variants: the out tensor says
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
                    f"memonger cannot capture {where} with torch.export: {type(error).__name__}: "
                    f"{_first_line(error)}",
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
        self.storage_owner: dict[int, int] = {}  # storage data_ptr -> the value that made it
        self.producer: dict[int, int] = {}  # value -> step that defined it
        self.steps: list[Step] = []
        self.deps: list[set[int]] = []
        self.fresh: list[int] = []  # values that are fresh allocations by a step
        self.over: dict[int, int] = {}  # step -> the fresh value its out form may write over
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
    guards = []
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
    graph = exported.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs_in = exported.graph_signature.input_specs
    user = [n for n, s in zip(placeholders, specs_in) if s.kind == InputKind.USER_INPUT]
    if len(placeholders) != len(specs_in) or len(user) != len(leaves):
        raise b.error(f"the graph takes {len(user)} inputs for {len(leaves)} example leaves")
    env: dict[Any, int] = {}
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


def _real(arg, b: _Builder, values: dict[int, Any] | None = None):
    """The value of a literal; ``values`` stands in for some of the captured values (by index)."""
    if isinstance(arg, Ref):
        return values[arg.index] if values and arg.index in values else b.values[arg.index]
    if isinstance(arg, tuple):
        return [_real(a, b, values) for a in arg]
    if isinstance(arg, Const):
        return _const_value(arg)
    if isinstance(arg, ScalarTensor):
        return scalar(arg.value, getattr(torch, arg.dtype))
    return arg


def _const_value(const: Const):
    if const.kind == "device":
        return torch.device(const.text)
    return getattr(torch, const.text)


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
        value = target(*(_real(a, b) for a in args), **{k: _real(v, b) for k, v in kwargs})
    else:
        raise b.error(f"the graph calls `{getattr(target, '__name__', target)}`, which is not an ATen op", node)
    if not _storable(value):
        raise b.error(f"`{node.name}` returns a {type(value).__name__}, not tensors", node)
    result = b.add_value(node.name, value, index) if value is not None else None
    if result is not None:
        env[node] = result
    reads = {a.index for a in _refs(args)} | {a.index for a in _refs(tuple(v for _, v in kwargs))}
    deps = {b.producer[r] for r in reads if r in b.producer}
    b.deps.append(deps)
    step = Step(op, args, kwargs, result, function, module)
    if isinstance(target, torch._ops.OpOverload):
        step = _mutation_and_order(b, target, step, reads)
        if isinstance(value, torch.Tensor) and b.root.get(result) == result and not b.written[index]:
            # Probed now, while the arguments and the result hold the values this step saw:
            # a later step may write either in place.
            b.out_variants[index] = _with_out_variant(b, step, value, -1)
            out_step, note, _ = b.out_variants[index]
            if not note:
                over = _writes_over(b, target, out_step, value)
                if over is not None:
                    b.over[index] = over
    b.steps.append(step)


def _writes_over(b: _Builder, functional, out_step: Step, tensor: torch.Tensor) -> int | None:
    """The fresh value a pointwise step's out form may write over (its only read of that storage,
    laid out as the result), checked to give the same bits when it does; None if there is none."""
    if torch.Tag.pointwise not in functional.tags:
        return None
    refs = [r.index for r in _refs(out_step.args + tuple(v for _, v in out_step.kwargs))]
    fresh = set(b.fresh)
    for candidate in refs:
        value = b.values[candidate]
        if (
            candidate not in fresh
            or b.root[candidate] != candidate
            or sum(1 for r in refs if b.root.get(r) == candidate) != 1
            or (value.dtype, value.shape, value.stride()) != (tensor.dtype, tensor.shape, tensor.stride())
            or value.untyped_storage().nbytes() != tensor.untyped_storage().nbytes()
        ):
            continue
        shared = value.clone(memory_format=torch.preserve_format)
        if shared.stride() != tensor.stride():
            continue
        values = {candidate: shared}
        try:
            _callable(out_step.op)(*(_real(a, b, values) for a in out_step.args),
                                   **{k: _real(v, b, values) for k, v in out_step.kwargs}, out=shared)
        except Exception:  # the form refuses to write over its input: it keeps a buffer of its own
            continue
        if _same_bits(shared, tensor):
            return candidate
    return None


def _callable(op: str):
    if op.startswith("into."):
        return getattr(arena_into, op.removeprefix("into."))
    namespace, name, overload = op.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def _storable(value) -> bool:
    if value is None or isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) for v in value)


def _refs(args) -> Iterator[Ref]:
    for a in args:
        if isinstance(a, Ref):
            yield a
        elif isinstance(a, tuple):
            yield from _refs(a)


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
    bound = _bind(op._schema, step.args, step.kwargs)
    written = set()
    for argument in op._schema.arguments:
        info = argument.alias_info
        if info is not None and info.is_write and argument.name in bound:
            written |= {b.root[r.index] for r in _refs((bound[argument.name],))}
    b.written[index] = written
    if torch.Tag.nondeterministic_seeded in op.tags:
        b.random.append(index)
    return step


def _bind(schema, args, kwargs) -> dict[str, Any]:
    positional = [a for a in schema.arguments if not a.kwarg_only]
    bound = {a.name: v for a, v in zip(positional, args)}
    bound.update(dict(kwargs))
    return bound


def _touches(b: _Builder, step: Step) -> set[int]:
    return {b.root[r.index] for r in _refs(step.args + tuple(v for _, v in step.kwargs))}


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
    buffers = []
    for value in b.fresh:
        step_index = b.producer[value]
        step = b.steps[step_index]
        tensor = b.values[value]
        note = _why_not(b, step_index, step, value, tensor, pinned)
        out_step = None
        scratch = 0
        if not note:
            candidate, note, scratch = b.out_variants[step_index]
            if not note:
                out_step = Step(candidate.op, candidate.args, candidate.kwargs, candidate.result, candidate.function,
                                candidate.module, len(buffers))
        if note and not step.note:
            b.steps[step_index] = Step(step.op, step.args, step.kwargs, step.result, step.function,
                                       step.module, None, note)
        buffers.append(
            BufferInfo(
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
        )
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
        attribute_guards=tuple(
            _tensor_guard(b.values[len(guards) + i]) for i in range(len(attributes))
        ),
        names=tuple(b.names),
        steps=tuple(b.steps),
        deps=tuple(tuple(sorted(d)) for d in b.deps),
        buffers=tuple(buffers),
        outputs=outputs,
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


def _with_out_variant(b: _Builder, step: Step, tensor: torch.Tensor, buffer: int) -> tuple[Step, str, int]:
    """The step written into arena buffer ``buffer``, or why it cannot be, and the scratch bytes it allocates.

    Tried in turn: the op's ``out=`` overload with numbers in tensor arguments passed as
    tensors made once, then as they are; then the op's form in ``memoplan.runtime.arena_into``.
    The first that gives the op's bits on the captured values and on other values without
    allocating its result inside is taken; otherwise the first one's problem is the note.
    """
    namespace, name, overload = step.op.split(".")
    functional = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    candidates: list[tuple[str, Callable, tuple, tuple]] = []
    out = _out_overload(functional)
    if out is not None:
        args, kwargs = _out_arguments(functional, out, step)
        constant = _with_constants(out, args, kwargs, b)
        if constant is not None:
            candidates.append((f"{namespace}.{name}.{out._overloadname}", out, *constant))
        candidates.append((f"{namespace}.{name}.{out._overloadname}", out, args, kwargs))
    form = FORMS.get(step.op)
    if form is not None:
        candidates.append((f"into.{form.__name__}", form, step.args, step.kwargs))
    if not candidates:
        return step, f"{step.op} has no out= variant: allocated by the op", 0
    first = ""
    for op_name, call, args, kwargs in candidates:
        problem, scratch = _check(b, functional, step, call, args, kwargs, tensor)
        if not problem:
            return Step(op_name, args, kwargs, step.result, step.function, step.module, buffer), "", scratch
        first = first or problem
    return step, first, 0


def _out_arguments(functional, out, step: Step) -> tuple[tuple, tuple]:
    """The step's arguments laid out for the ``out=`` overload's schema."""
    bound = _bind(functional._schema, step.args, step.kwargs)
    args, kwargs = [], []
    positional = True
    for argument in out._schema.arguments:
        if argument.name == "out":
            continue
        if argument.name not in bound:
            positional = False
            continue
        if positional and not argument.kwarg_only:
            args.append(bound[argument.name])
        else:
            kwargs.append((argument.name, bound[argument.name]))
    return tuple(args), tuple(kwargs)


def _with_constants(out, args: tuple, kwargs: tuple, b: _Builder) -> tuple[tuple, tuple] | None:
    """The arguments with each number given for a tensor argument as a :class:`ScalarTensor` of the
    dtype torch computes in (the result type of the first tensor argument and the number); None
    when there is no such number."""
    tensors = [b.values[r.index] for r in _refs(args + tuple(v for _, v in kwargs))]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors:
        return None
    schema = {a.name: str(a.type) for a in out._schema.arguments}
    positional = [a.name for a in out._schema.arguments if not a.kwarg_only]
    changed = False

    def swap(name: str, value):
        nonlocal changed
        if schema.get(name) == "Tensor" and isinstance(value, (bool, int, float)):
            changed = True
            dtype = torch.result_type(tensors[0], value)
            return ScalarTensor(value, str(dtype).removeprefix("torch."))
        return value

    new_args = tuple(swap(n, v) for n, v in zip(positional, args))
    new_kwargs = tuple((k, swap(k, v)) for k, v in kwargs)
    return (new_args, new_kwargs) if changed else None


def _check(b: _Builder, functional, step: Step, call, args: tuple, kwargs: tuple, tensor: torch.Tensor) -> tuple[str, int]:
    """Why ``call(*args, **kwargs, out=view)`` does not stand for the step, and the scratch bytes it allocates.

    Checked on the captured values, then on other values drawn for the floating tensors the
    step reads (one matching example could be luck), against the op run on the same values.
    """
    scratch = 0
    for trial in range(2):
        values = None
        expected = tensor
        if trial == 1:
            generator = torch.Generator(tensor.device).manual_seed(0)
            refs = sorted({r.index for r in _refs(step.args + tuple(v for _, v in step.kwargs))})
            values = {i: _redrawn(b.values[i], generator) for i in refs}
            expected = functional(*(_real(a, b, values) for a in step.args),
                                  **{k: _real(v, b, values) for k, v in step.kwargs})
        real_args = [_real(a, b, values) for a in args]
        real_kwargs = {k: _real(v, b, values) for k, v in kwargs}
        problem, allocated = _probe(call, real_args, real_kwargs, expected, b.allocates if trial == 0 else None)
        if problem:
            return problem, 0
        if trial == 0:
            scratch = allocated
    return "", scratch


def _redrawn(value, generator):
    """A floating tensor argument with other values (same shape, strides and dtype); others as they are."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        fresh = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
        try:
            return fresh.normal_(generator=generator)
        except RuntimeError:  # overlapping strides (an expanded tensor): keep the example's values
            return value
    return value


def _probe(out, args, kwargs, expected: torch.Tensor, allocates: dict | None) -> tuple[str, int]:
    """Why ``out(*args, **kwargs, out=view)`` does not stand for the op that gave ``expected``, and
    the bytes it allocates inside.

    ``allocates``: whether the call allocates inside is measured (and remembered there, by the
    op and its arguments' shapes, strides and dtypes) when given, else only the result checked.
    A call that allocates an eighth of the result or more runs the op into a tensor of its own
    and copies it; less is a kernel's scratch (BatchNorm's per-channel factors), which the
    step keeps and the statistics count.
    """
    probe = torch.empty(expected.untyped_storage().nbytes(), dtype=torch.uint8, device=expected.device)
    view = probe.view(expected.dtype).as_strided(expected.shape, expected.stride())
    key = (_call_name(out), _signature((args, kwargs)), _signature(expected))
    try:
        if allocates is not None and key not in allocates:
            allocated, result = _allocated_inside(lambda: out(*args, **kwargs, out=view), expected.device)
            allocates[key] = allocated
        else:
            result = out(*args, **kwargs, out=view)
    except Exception as error:  # the variant refuses these arguments: keep the op as the model called it
        return f"its out= variant fails here ({type(error).__name__}): allocated by the op", 0
    allocated = allocates.get(key, 0) if allocates is not None else 0
    if allocated * 8 >= max(1, probe.numel()):
        return (f"its out= variant allocates {allocated} bytes inside (the op's result, then a copy): "
                "allocated by the op"), 0
    same_place = (
        isinstance(result, torch.Tensor)
        and result.data_ptr() == view.data_ptr() == probe.data_ptr()
        and tuple(result.shape) == tuple(expected.shape)
        and tuple(result.stride()) == tuple(expected.stride())
        and result.dtype == expected.dtype
    )
    if not same_place:
        return "its out= variant does not write into the view it is given: allocated by the op", 0
    if not _same_bits(result, expected):
        return "its out= variant gives other bits than the op: allocated by the op", 0
    return "", allocated


def _call_name(call) -> str:
    return str(call) if isinstance(call, torch._ops.OpOverload) else f"into.{call.__name__}"


def _signature(tree) -> tuple:
    """Shapes, strides and dtypes of the tensors in ``tree``, and its other values, in order."""
    return tuple(
        (tuple(v.shape), v.stride(), str(v.dtype), str(v.device)) if isinstance(v, torch.Tensor) else repr(v)
        for v in pytree.tree_leaves(tree)
    )


def _allocated_inside(fn, device: torch.device) -> tuple[int, Any]:
    """Bytes the allocator hands out while ``fn()`` runs (kernels' temporaries too), and its result.

    Many ``out=`` overloads are wrappers that run the op into a tensor of their own and copy it
    (``relu.out``, ``masked_fill.Scalar_out``, ``embedding.out``): writing through them saves
    nothing, and the live-storage meter, which sees only what ops return, would not show it.
    On CPU the profiler's memory events see every allocation; on CUDA the allocator's peak.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - before), result
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    return sum(e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0), result


def _out_overload(op):
    """The ``out=`` overload of ``op`` taking the same arguments (less dtype/device options), or None."""
    packet = op.overloadpacket
    overload = op._overloadname
    names = ["out"] if overload == "default" else [f"{overload}_out", "out"]
    functional = {a.name: a for a in op._schema.arguments}
    for name in names:
        if name not in packet.overloads():
            continue
        candidate = getattr(packet, name)
        schema = candidate._schema
        outs = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if len(outs) != 1 or outs[0].name != "out" or len(schema.returns) != 1:
            continue
        others = {a.name for a in schema.arguments if a.name != "out"}
        if not others <= functional.keys() or not (functional.keys() - others) <= _OPTIONS:
            continue
        if any(str(schema_arg.type) != str(functional[schema_arg.name].type)
               for schema_arg in schema.arguments if schema_arg.name != "out"):
            continue
        return candidate
    return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bytes (so -0.0 differs from 0.0, and a NaN matches only itself)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
