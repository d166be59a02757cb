"""Runtime stage: install a generated plan's forwards on a model, validate first, undo exactly.

A plan is installed by giving each target module an *instance* attribute
``forward`` (a bound method of the generated policy function).  Nothing else
about the module changes: its class, ``state_dict`` keys, parameters, buffers
and hooks stay as they were, so ``isinstance`` checks, checkpoints and
optimizers built before the plan keep working.  No wrapper container is
inserted, which is what adds ``.0.``/``_checkpoint_wrapped_module`` prefixes to
``state_dict`` keys in other tools (pytorch/pytorch#117399).

``copy.deepcopy`` re-binds bound methods to the copied module, so a deep copy
of a planned model is planned too, and independent of the original.  Pickling
(``torch.save``) keeps the plan as well: a loaded model is planned with the same
forwards (:mod:`memoplan.runtime.pickling`).

Installing is all or nothing: if setting any forward raises (a module whose
``__setattr__`` refuses it), every module patched so far is restored and the
failure is a :class:`PlanMismatchError` (``MP406``) naming the module.  Any other
``BaseException`` on the way (Ctrl-C's ``KeyboardInterrupt``, ``SystemExit``) is
rolled back the same way and then re-raised as it was.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError, did_you_mean
from memoplan.runtime import hfcheck, pickling
from memoplan.runtime.dtr import DTR_ATTR, DtrSettings, Tracker
from memoplan.runtime.memory import MemorySettings, install_memory, uninstall_memory

__all__ = [
    "InstalledPlan",
    "PlanMismatchError",
    "Target",
    "install",
    "installed_plan",
    "module_identity",
    "qualified_type_name",
    "uninstall",
]

# The key in the root module's ``__dict__`` under which the installed plan is recorded.
# Written to ``__dict__`` directly: it is plain data, not a parameter, buffer or submodule.
_PLAN_ATTR = "_memoplan_plan"
# The module path a plan installed a forward at, kept on the module for runtime messages.
PATH_ATTR = "_memoplan_path"
#: The start of the private ``sys.modules`` names under which ``memoplan.specs`` loads
#: ``path/file.py`` models; :func:`module_identity` gives such a module its importable name.
FILE_MODULE_PREFIX = "_memoplan_file_"


class PlanMismatchError(PlanError):
    """The model does not match the plan (``MP401``-``MP403``, ``MP406``); nothing was changed."""


@dataclass(frozen=True)
class Target:
    """One module to patch: where it is, what class the plan was made for, its new forward.

    ``type_name`` is :func:`qualified_type_name` of the class; ``forward`` is a
    plain function taking the module as ``self`` (it is bound at install time).
    """

    path: str
    type_name: str
    forward: Callable[..., Any]
    evictable: bool = False  # a candidate of the plan's `dtr` block (memoplan.runtime.dtr)


@dataclass(frozen=True)
class InstalledPlan:
    """What :func:`install` changed on a model, kept so that :func:`uninstall` can undo it."""

    plan_id: str
    # (path, the function installed there); the function identifies *our* patch.
    forwards: tuple[tuple[str, Callable[..., Any]], ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path, _ in self.forwards)

    def __reduce__(self) -> Any:
        # The functions as pickling.portable references: a generated plan module that
        # apply() imported from its cache cannot be imported by name elsewhere.
        entries = tuple((path, pickling.portable(function)) for path, function in self.forwards)
        return (_restore_record, (self.plan_id, entries))


def _restore_record(plan_id: str, entries: tuple[tuple[str, Any], ...]) -> InstalledPlan:
    return InstalledPlan(plan_id, tuple((path, pickling.restore(spec)) for path, spec in entries))


def qualified_type_name(cls: type) -> str:
    """The name a :class:`Target` records for a module class: ``module.QualName``.

    ``module`` is :func:`module_identity` of the class's module: the same whether the
    model was imported normally, loaded by memoplan from ``path/file.py`` or run as a
    script, and never a path (docs/design.md, "Class identity").
    """
    return f"{module_identity(cls.__module__)}.{cls.__qualname__}"


def module_identity(name: str) -> str:
    """The importable name of the module called ``name`` in ``sys.modules``.

    Normally ``name`` itself.  A script run as ``__main__`` and a file memoplan loaded
    under a private name (``FILE_MODULE_PREFIX``) are named as ``import`` would name
    their file: its stem, prefixed by the names of the enclosing folders that are
    packages (have an ``__init__.py``).  ``python -m pkg.mod`` keeps ``pkg.mod``.
    """
    if name != "__main__" and not name.startswith(FILE_MODULE_PREFIX):
        return name
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    spec_name = getattr(spec, "name", None)
    if spec_name and spec_name != "__main__" and not spec_name.startswith(FILE_MODULE_PREFIX):
        return spec_name
    file = getattr(module, "__file__", None)
    return importable_name(Path(file)) if file else name


def importable_name(path: Path) -> str:
    """``pkg.sub.mod`` for ``.../pkg/sub/mod.py`` where ``pkg`` and ``sub`` have an ``__init__.py``."""
    path = Path(path).resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts) or path.stem


def installed_plan(model: nn.Module) -> str | None:
    """The id of the plan installed on ``model``, or ``None``."""
    record = model.__dict__.get(_PLAN_ATTR)
    return record.plan_id if isinstance(record, InstalledPlan) else None


def install(
    model: nn.Module,
    targets: Iterable[Target],
    *,
    plan_id: str,
    memory: MemorySettings | None = None,
    dtr: DtrSettings | None = None,
) -> None:
    """Patch every target's forward, put the ``memory`` block in place and give the ``dtr``
    candidates their tracker (:mod:`memoplan.runtime.dtr`), or raise and change nothing."""
    targets = tuple(targets)
    modules = _validate(model, targets)
    done: list[tuple[nn.Module, types.MethodType]] = []
    try:
        for target, module in zip(targets, modules, strict=True):
            _patch(target, module, done)
        if memory is not None:
            install_memory(model, memory)
        if dtr is not None:
            tracker = Tracker(dtr)
            model.__dict__[DTR_ATTR] = tracker
            for target, module in zip(targets, modules, strict=True):
                if target.evictable:
                    tracker.attach(module, target.path)
        model.__dict__[_PLAN_ATTR] = InstalledPlan(
            plan_id=plan_id, forwards=tuple((t.path, t.forward) for t in targets)
        )
    except BaseException:
        # Anything at all (a refusing module, Ctrl-C, a SystemExit from a hook) leaves the
        # model as it was: a half-installed plan could be neither removed nor applied again.
        _undo(model, done)
        raise


def _patch(target: Target, module: nn.Module, done: list[tuple[nn.Module, types.MethodType]]) -> None:
    """Give ``module`` the target's forward; recorded in ``done`` before it is set, so that an
    interruption at any point is undone."""
    # An instance attribute shadows the class's forward for this module only;
    # ``nn.Module.__call__`` looks up ``self.forward``, so hooks still run around it.
    bound = types.MethodType(target.forward, module)
    done.append((module, bound))
    try:
        module.forward = bound
        if module.__dict__.get("forward") is not bound:
            raise AttributeError("the module's __setattr__ did not store `forward` on the instance")
    except Exception as error:
        raise PlanMismatchError(
            (
                Diagnostic(
                    code="MP406",
                    message=(
                        f"cannot install the plan's forward on `{target.path}` "
                        f"({type(module).__qualname__}): {type(error).__name__}: {error}"
                    ),
                    help="its class refuses an instance `forward`; leave this module out of the plan "
                    "(nothing was changed)",
                ),
            )
        ) from None
    module.__dict__[PATH_ATTR] = target.path  # named in runtime messages
    pickling.register(target.forward)


def _undo(model: nn.Module, done: list[tuple[nn.Module, types.MethodType]]) -> None:
    """Take back what an install that failed or was interrupted part way had done."""
    if isinstance(model.__dict__.get(_PLAN_ATTR), InstalledPlan):
        del model.__dict__[_PLAN_ATTR]
    uninstall_memory(model)
    model.__dict__.pop(DTR_ATTR, None)
    for module, bound in reversed(done):
        if module.__dict__.get("forward") is bound:
            del module.__dict__["forward"]
        module.__dict__.pop(PATH_ATTR, None)
        module.__dict__.pop(DTR_ATTR, None)


def uninstall(model: nn.Module) -> None:
    """Remove the installed plan, restoring every patched module; no-op without a plan."""
    hfcheck.unwatch(model)
    record = model.__dict__.pop(_PLAN_ATTR, None)
    if not isinstance(record, InstalledPlan):
        return
    uninstall_memory(model)
    model.__dict__.pop(DTR_ATTR, None)
    for path, function in record.forwards:
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue  # the module was replaced since; nothing of ours is left there
        patched = module.__dict__.get("forward")
        if isinstance(patched, types.MethodType) and patched.__func__ is function:
            del module.__dict__["forward"]
            module.__dict__.pop(PATH_ATTR, None)
            module.__dict__.pop(DTR_ATTR, None)
        else:
            warnings.warn(
                f"memoplan: the forward of `{path}` was replaced after the plan was installed; leaving it as it is",
                RuntimeWarning,
                stacklevel=2,
            )


def _validate(model: nn.Module, targets: tuple[Target, ...]) -> list[nn.Module]:
    """Resolve every target to its module, collecting one diagnostic per problem."""
    problems: list[Diagnostic] = []
    if installed_plan(model) is not None:
        problems.append(
            Diagnostic(
                code="MP403",
                message=f"the model already has memoplan plan {installed_plan(model)} installed",
                help="remove it first (`remove(model)`, memoplan.runtime.uninstall)",
            )
        )
    paths = [name for name, _ in model.named_modules(remove_duplicate=False) if name]
    modules: list[nn.Module] = []
    seen: dict[int, str] = {}
    for target in targets:
        module = _lookup(model, target.path)
        if module is None:
            problems.append(_missing(target.path, paths))
            continue
        modules.append(module)
        found = qualified_type_name(type(module))
        if found != target.type_name:
            problems.append(
                Diagnostic(
                    code="MP402",
                    message=(f"`{target.path}` is a {found}, but the plan was made for a {target.type_name}"),
                    help="the model changed since the plan was compiled; recompile the plan",
                )
            )
        elif id(module) in seen:
            problems.append(
                Diagnostic(
                    code="MP403",
                    message=(
                        f"`{target.path}` is the same module as `{seen[id(module)]}`, which the plan already patches"
                    ),
                )
            )
        elif "forward" in module.__dict__:
            problems.append(
                Diagnostic(
                    code="MP403",
                    message=f"`{target.path}` already has its forward patched on the instance",
                    help="another tool or plan replaced it; remove that patch first",
                )
            )
        seen.setdefault(id(module), target.path)
    if problems:
        raise PlanMismatchError(tuple(problems))
    return modules


def _lookup(model: nn.Module, path: str) -> nn.Module | None:
    if not path:
        return model  # the root (`module ""`): its forward is patched like any module's
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def _missing(path: str, paths: list[str]) -> Diagnostic:
    if not path:
        return Diagnostic(
            code="MP401",
            message='the root module (path "") cannot be a plan target',
            help="target its submodules instead",
        )
    return Diagnostic(
        code="MP401",
        message=f"the model has no module `{path}`",
        help=did_you_mean(path, paths),
    )
