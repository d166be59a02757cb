"""Spec loading: import models and example inputs named by ``module:callable`` or ``file.py:attr``.

A SPEC is ``LOCATION:ATTR``.  LOCATION is a dotted module name
(``memoplan.examples.cnn``) or a Python file (``models/net.py``; any location
that ends in ``.py`` or contains a path separator), a relative file being
resolved against ``base_dir`` (the plan file's folder) or else the current
directory.  ATTR may be dotted (``Net.factory``).  Module specs are imported
with ``base_dir`` and the current directory temporarily on ``sys.path``.

A file is loaded once per resolved path, under a private module name derived
from that path (``_memoplan_file_<stem>_<hash>``), so loading it twice gives the
same class objects and no common name in ``sys.modules`` is taken.  That name
never reaches a plan: a class's identity there is its module's importable name
(``memoplan.runtime.install.module_identity``: ``models.net.Blk`` for ``models/net.py``
inside a package ``models``, ``net.Blk`` for a plain folder).

Every failure raises :class:`PlanError` with one diagnostic:
``MP501`` malformed spec, ``MP502`` module or file not found, ``MP503``
attribute not found, ``MP504`` user code raised (importing or calling; any
exception but ``KeyboardInterrupt``, ``SystemExit`` too), ``MP505`` wrong type
returned, ``MP507`` an inline example too large to build (refused before allocating).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import importlib
import importlib.util
import math
import os
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from memoplan.diagnostics import Diagnostic, PlanError, Span, did_you_mean
from memoplan.runtime.install import FILE_MODULE_PREFIX
from memoplan.syntax.ast import ExampleStmt, TensorFn, TensorSpec


@dataclass(frozen=True, eq=False)
class Example:
    """Inputs for one call of a model: ``model(*args, **kwargs)``.

    ``args`` is normalised to a tuple and ``kwargs`` to a read-only mapping.
    Equality is identity (comparing tensors elementwise is not meaningful here).
    """

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    def run(self, fn: Callable[..., Any]) -> Any:
        """Call ``fn(*args, **kwargs)``."""
        return fn(*self.args, **self.kwargs)

    def to(self, device: torch.device | str) -> Example:
        """A copy with every tensor in the arguments (nested ones too) moved to ``device``."""

        def move(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        return Example(pytree.tree_map(move, self.args), pytree.tree_map(move, dict(self.kwargs)))


# ---------------------------------------------------------------- public API


def load_callable(spec: str, *, base_dir: Path | str | None = None, span: Span | None = None) -> Callable[..., Any]:
    """Import the object named by ``spec`` and check that it is callable."""
    span = _real_span(span)
    obj = _load_object(spec, base_dir, span)
    if not callable(obj):
        raise _error("MP505", f"`{spec}` is {_describe(obj)}, not a callable", span)
    return obj


def load_model(spec: str, *, base_dir: Path | str | None = None, span: Span | None = None) -> nn.Module:
    """Build the model named by ``spec``: call it with no arguments (or instantiate the class).

    An ``nn.Module`` instance named directly is returned as it is.
    """
    span = _real_span(span)
    obj = _load_object(spec, base_dir, span)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise _error(
            "MP505",
            f"`{spec}` is {_describe(obj)}; expected a callable returning an nn.Module, or an nn.Module class",
            span,
        )
    model = _call(obj, spec, span)
    if not isinstance(model, nn.Module):
        raise _error("MP505", f"`{spec}` returned {_describe(model)}; expected an nn.Module", span)
    return model


def load_example(spec: str, *, base_dir: Path | str | None = None, span: Span | None = None) -> Example:
    """Load example inputs: the callable's result (or the named value itself) as an ``Example``.

    A tensor becomes one positional argument, a tuple or list the positional
    arguments, and an :class:`Example` is taken as it is.
    """
    span = _real_span(span)
    obj = _load_object(spec, base_dir, span)
    value = obj
    if not isinstance(obj, (torch.Tensor, tuple, list, Example)):
        if not callable(obj):
            raise _error("MP505", f"`{spec}` is {_describe(obj)}; expected a callable returning inputs", span)
        value = _call(obj, spec, span)
    if isinstance(value, Example):
        return value
    if isinstance(value, torch.Tensor):
        return Example((value,))
    if isinstance(value, (tuple, list)):
        return Example(tuple(value))
    raise _error(
        "MP505",
        f"`{spec}` returned {_describe(value)}; expected a Tensor, a tuple or list of inputs, "
        "or a memoplan.specs.Example",
        span,
    )


def make_example(stmt: ExampleStmt, *, base_dir: Path | str | None = None, seed: int = 0) -> Example:
    """The inputs of an ``example`` statement: its loaded spec, or its inline tensors.

    Inline tensors are drawn in order from one ``torch.Generator`` seeded with
    ``seed``, so the same statement and seed always give the same values.
    """
    span = _real_span(stmt.span)
    if stmt.spec is not None:
        return load_example(stmt.spec, base_dir=base_dir, span=span)
    if not stmt.tensors:
        raise _error("MP501", "example has neither a spec nor inline tensors", span)
    _check_sizes(stmt.tensors, span)  # before anything is allocated
    generator = torch.Generator().manual_seed(seed)
    tensors = (_make_tensor(t, i, generator, _real_span(t.span) or span) for i, t in enumerate(stmt.tensors, 1))
    return Example(tuple(tensors))


# ---------------------------------------------------------------- inline tensor sizes

INT64_MAX = 2**63 - 1


def _check_sizes(tensors: tuple[TensorSpec, ...], span: Span | None) -> None:
    """MP507 for an example that overflows a 64-bit size or needs more memory than this machine has.

    A tensor's bytes count its dtype and, for ``randn``/``rand``/``randint``, the float32 or
    int64 draw it is converted from.  The limit is the machine's physical memory.
    """
    memory = _physical_memory()
    total = 0
    for index, t in enumerate(tensors, 1):
        where = f"example tensor {index} `{_format_tensor_spec(t)}`"
        at = _real_span(t.span) or span
        elements = math.prod(t.shape)
        nbytes = elements * _bytes_per_element(t)
        if max(t.shape, default=0) > INT64_MAX:
            raise _error("MP507", f"{where}: a size over 2**63 - 1 overflows 64 bits", at, "use a smaller example")
        if nbytes > INT64_MAX:
            raise _error(
                "MP507",
                f"{where}: {elements} elements ({nbytes} bytes) overflow a 64-bit size",
                at,
                "use a smaller example",
            )
        total += nbytes
        if memory is not None and total > memory:
            whole = "" if total == nbytes else f" ({_bytes_text(total)} with the tensors before it)"
            raise _error(
                "MP507",
                f"{where} needs {_bytes_text(nbytes)}{whole}, more than this machine's {_bytes_text(memory)} of memory",
                at,
                "an example is one small batch: shrink its sizes",
            )


def _bytes_per_element(t: TensorSpec) -> int:
    name = (t.dtype or "").removeprefix("torch.")
    drawn = {TensorFn.RANDN: torch.float32, TensorFn.RAND: torch.float32, TensorFn.RANDINT: torch.int64}.get(t.fn)
    final = DTYPES.get(name) or drawn or torch.float32
    size = final.itemsize
    if drawn is not None and drawn != final:
        size += drawn.itemsize
    return size


def _physical_memory() -> int | None:
    """Bytes of physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _bytes_text(n: int) -> str:
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------- inline tensors

DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        "float16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "float": torch.float32,
        "float64": torch.float64,
        "double": torch.float64,
        "uint8": torch.uint8,
        "int8": torch.int8,
        "int16": torch.int16,
        "short": torch.int16,
        "int32": torch.int32,
        "int": torch.int32,
        "int64": torch.int64,
        "long": torch.int64,
        "bool": torch.bool,
    }
)


def _make_tensor(t: TensorSpec, index: int, generator: torch.Generator, span: Span | None) -> torch.Tensor:
    where = f"example tensor {index} `{_format_tensor_spec(t)}`"

    def bad(message: str, help: str | None = None) -> PlanError:
        return _error("MP501", f"{where}: {message}", span, help)

    dtype: torch.dtype | None = None
    if t.dtype is not None:
        name = t.dtype.removeprefix("torch.")
        if name not in DTYPES:
            raise bad(f"unknown dtype `{t.dtype}`", did_you_mean(name, DTYPES) or _dtype_help())
        dtype = DTYPES[name]
    if any(d < 0 for d in t.shape):
        raise bad("dimensions must not be negative")
    if t.fn is not TensorFn.RANDINT and (t.low is not None or t.high is not None):
        raise bad("`low` and `high` only apply to randint")

    if t.fn in (TensorFn.RANDN, TensorFn.RAND):
        if dtype is not None and not dtype.is_floating_point:
            raise bad(
                f"{t.fn.value} draws floating-point values; dtype `{t.dtype}` is not one",
                "use randint for integer or bool tensors",
            )
        draw = torch.randn if t.fn is TensorFn.RANDN else torch.rand
        return draw(t.shape, generator=generator).to(dtype or torch.float32)
    if t.fn is TensorFn.RANDINT:
        if t.high is None:
            raise bad("randint needs `high` (exclusive upper bound)", "e.g. randint(4, 16, high=100)")
        low = 0 if t.low is None else t.low
        if low >= t.high:
            raise bad(f"`low` ({low}) must be less than `high` ({t.high})")
        values = torch.randint(low, t.high, t.shape, generator=generator, dtype=torch.int64)
        return values.to(dtype or torch.int64)
    fill = torch.zeros if t.fn is TensorFn.ZEROS else torch.ones
    return fill(t.shape, dtype=dtype or torch.float32)


def _format_tensor_spec(t: TensorSpec) -> str:
    parts = [str(d) for d in t.shape]
    options = (("low", t.low), ("high", t.high), ("dtype", t.dtype))
    parts += [f"{key}={value}" for key, value in options if value is not None]
    return f"{t.fn.value}({', '.join(parts)})"


def _dtype_help() -> str:
    return "dtypes: " + ", ".join(DTYPES)


# ---------------------------------------------------------------- resolution


@dataclass(frozen=True)
class _Target:
    spec: str
    location: str  # module name or file path, as written
    attr: str  # possibly dotted
    is_file: bool


_FILE_MODULES: dict[Path, ModuleType] = {}


def _load_object(spec: str, base_dir: Path | str | None, span: Span | None) -> Any:
    target = _parse(spec, span)
    base = Path(base_dir) if base_dir is not None else None
    if target.is_file:
        module = _load_file(target, base, span)
    else:
        module = _import_module(target, base, span)
    return _get_attr(module, target, span)


def _parse(spec: str, span: Span | None) -> _Target:
    text = spec.strip()
    location, colon, attr = text.rpartition(":")
    if not colon:
        raise _error("MP501", f"malformed spec `{spec}`: no `:` between module and callable", span, _colon_help(text))
    if not location:
        raise _error(
            "MP501",
            f"malformed spec `{spec}`: nothing before `:`",
            span,
            "write `package.module:callable` or `path/to/file.py:callable`",
        )
    if not attr:
        raise _error("MP501", f"malformed spec `{spec}`: no callable after `:`", span, f"e.g. `{location}:build`")
    if not _is_dotted_name(attr):
        raise _error("MP501", f"malformed spec `{spec}`: `{attr}` is not a (dotted) Python name", span)
    is_file = location.endswith(".py") or "/" in location or "\\" in location
    if not is_file and not _is_dotted_name(location):
        raise _error(
            "MP501", f"malformed spec `{spec}`: `{location}` is neither a module name nor a path to a .py file", span
        )
    return _Target(spec, location, attr, is_file)


def _colon_help(text: str) -> str:
    if text.endswith(".py"):
        return f"name the callable after a colon, e.g. `{text}:build`"
    if _is_dotted_name(text) and "." in text:
        module, _, name = text.rpartition(".")
        return f"did you mean `{module}:{name}`?"
    return "write `package.module:callable` or `path/to/file.py:callable`"


def _is_dotted_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _import_module(target: _Target, base_dir: Path | None, span: Span | None) -> ModuleType:
    name = target.location
    with _extra_sys_path([d for d in (base_dir, Path.cwd()) if d is not None]):
        importlib.invalidate_caches()
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if not (missing == name or name.startswith(missing + ".")):
                raise _raised(f"importing module `{name}`", exc, span) from exc
            message = f"module `{missing}` not found"
            if missing != name:
                message += f" (importing `{name}`)"
            help = _similar_modules(missing)
            raise _error("MP502", message, span, help) from None
        except BaseException as exc:  # user code: anything but Ctrl-C is a diagnostic
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise _raised(f"importing module `{name}`", exc, span) from exc


def _similar_modules(name: str) -> str | None:
    """'did you mean' help for a missing module, from the modules next to it."""
    parent, _, leaf = name.rpartition(".")
    if parent:
        path = getattr(sys.modules.get(parent), "__path__", None)
        if path is None:
            return None
        siblings = [m.name for m in pkgutil.iter_modules(path)]
    else:
        siblings = [m.name for m in pkgutil.iter_modules()]
    matches = difflib.get_close_matches(leaf, sorted(set(siblings)), n=3, cutoff=0.6)
    if not matches:
        return None
    prefix = f"{parent}." if parent else ""
    return "did you mean " + ", ".join(f"`{prefix}{m}`" for m in matches) + "?"


def _load_file(target: _Target, base_dir: Path | None, span: Span | None) -> ModuleType:
    path = Path(target.location).expanduser()
    if not path.is_absolute():
        path = (base_dir if base_dir is not None else Path.cwd()) / path
    path = path.resolve()
    cached = _FILE_MODULES.get(path)
    if cached is not None:
        return cached
    if not path.is_file():
        raise _file_not_found(target.location, path, span)

    name = _file_module_name(path)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise _error(
            "MP502", f"`{target.location}` is not a Python source file", span, "name a .py file, e.g. `models.py:build`"
        )
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # needed by dataclasses, pickling and the like
    try:
        with _extra_sys_path([path.parent]):
            module_spec.loader.exec_module(module)
    except BaseException as exc:  # user code: anything but Ctrl-C is a diagnostic
        del sys.modules[name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise _raised(f"running `{target.location}`", exc, span) from exc
    _FILE_MODULES[path] = module
    return module


def _file_not_found(location: str, path: Path, span: Span | None) -> PlanError:
    if path.is_dir():
        return _error("MP502", f"`{location}` is a directory, not a .py file", span)
    message = f"file `{location}` not found"
    if str(path) != location:
        message += f" (looked for `{path}`)"
    if not path.parent.is_dir():
        return _error("MP502", message, span, f"directory `{path.parent}` does not exist")
    siblings = [p.name for p in path.parent.glob("*.py")]
    return _error("MP502", message, span, did_you_mean(path.name, siblings))


def _file_module_name(path: Path) -> str:
    """The private ``sys.modules`` name; plans name the file's classes by its importable name
    instead (``memoplan.runtime.install.module_identity``), which holds no path."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    return f"{FILE_MODULE_PREFIX}{stem}_{digest}"


def _get_attr(module: ModuleType, target: _Target, span: Span | None) -> Any:
    obj: Any = module
    walked: list[str] = []
    for part in target.attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = target.location if not walked else f"{target.location}:{'.'.join(walked)}"
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise _error("MP503", f"`{owner}` has no attribute `{part}`", span, did_you_mean(part, public)) from None
        except BaseException as exc:  # a property's code
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise _raised(f"looking up `{part}` in `{target.spec}`", exc, span) from exc
        walked.append(part)
    return obj


def _call(fn: Callable[..., Any], spec: str, span: Span | None) -> Any:
    try:
        return fn()
    except BaseException as exc:  # user code: anything but Ctrl-C is a diagnostic
        if isinstance(exc, KeyboardInterrupt):
            raise
        built = _out_of_memory(exc, spec, span)
        if built is not None:
            raise built from None  # not chained: the traceback would keep what the factory allocated
        help = None
        if isinstance(exc, TypeError):
            help = f"`{spec}` is called with no arguments; give its parameters defaults"

        raise _raised(f"calling `{spec}`", exc, span, help) from exc


def _out_of_memory(exc: BaseException, spec: str, span: Span | None) -> PlanError | None:
    """MP411 when calling ``spec`` ran out of memory (a model too big to build here), else None."""
    from memoplan.oom import is_out_of_memory, wanted_bytes

    if not is_out_of_memory(exc):
        return None
    wanted = wanted_bytes(exc)
    text = str(exc).strip()
    asked = (
        f"the allocator could not give {wanted:,} B"
        if wanted
        else (text.splitlines()[0] if text else type(exc).__name__)
    )
    return _error(
        "MP411",
        f"calling `{spec}` ran out of memory: {asked}",
        span,
        'a model too big to build here can be built on the meta device (`with torch.device("meta"):` in the '
        "factory, or accelerate's `init_empty_weights`): `memoplan profile` and `plan` estimate its step with "
        "nothing allocated (`memoplan docs meta`)",
    )


@contextlib.contextmanager
def _extra_sys_path(dirs: Iterable[Path]) -> Iterator[None]:
    """Put ``dirs`` at the front of ``sys.path`` for the duration (those not there already)."""
    added: list[str] = []
    for d in dirs:
        entry = str(d)
        if entry not in sys.path and entry not in added:
            added.append(entry)
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(entry)


# ---------------------------------------------------------------- diagnostics

# User code (importing, calling a factory) is caught as BaseException: whatever it raises but
# KeyboardInterrupt is a diagnostic.  ``SystemExit`` (``sys.exit()`` in a factory, ``builtins:exit``
# as one) must not end memoplan silently with status 0.


def _error(code: str, message: str, span: Span | None, help: str | None = None) -> PlanError:
    return PlanError((Diagnostic(code, message, span, help),))


def _raised(action: str, exc: BaseException, span: Span | None, help: str | None = None) -> PlanError:
    return _error("MP504", f"{action} raised {describe_exception(exc)}", span, help)


def describe_exception(exc: BaseException) -> str:
    """``RuntimeError: message``; a ``SystemExit`` says its exit status."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (exit status {exc.code!r})" if not isinstance(exc.code, str) else f"SystemExit: {exc.code}"
    return f"{type(exc).__name__}: {exc}"


def _real_span(span: Span | None) -> Span | None:
    """``None`` for the placeholder span of nodes built in memory (line 0)."""
    return span if span is not None and span.line > 0 else None


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, type):
        return f"the class `{value.__qualname__}`"
    if isinstance(value, ModuleType):
        return f"the module `{value.__name__}`"
    return f"a value of type `{type(value).__qualname__}`"
