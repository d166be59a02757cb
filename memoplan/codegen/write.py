"""Codegen stage: writes generated files and imports the plan module from the cache.

``memoplan.apply`` goes through here: the code it runs is exactly the code
``memoplan compile`` would write into a user's repository.  The cache folder is
``$MEMOPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/memoplan``, else ``~/.cache/memoplan``;
when it cannot be written, a folder in the system's temporary directory is used
with a warning, and when neither can, ``apply`` fails with MP410 (nothing is
installed).  Files are named by the hash of
their content and written atomically, so concurrent processes (DDP ranks) agree.
A written file gets the mode of the file it replaces, or else ``0o666`` less the
umask, as ``open()`` would give it (the temporary file's own mode is ``0o600``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from memoplan.codegen.emit import GeneratedCode
from memoplan.diagnostics import Diagnostic, PlanError


def cache_dir() -> Path:
    """Where generated plan modules go: ``$MEMOPLAN_CACHE_DIR``, else the XDG cache folder."""
    root = os.environ.get("MEMOPLAN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"  # XDG: relative paths are ignored
        root = str(base / "memoplan")
    return Path(root) / "generated"


def _fallback_dir() -> Path:
    """The temporary folder used when the cache cannot be written (one per user)."""
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"memoplan-{user}" / "generated"


def _writable_dir(digest: str) -> Path:
    """``cache_dir()/digest`` made, else the temporary fallback with a warning; MP410 if neither."""
    first = cache_dir() / digest
    try:
        first.mkdir(parents=True, exist_ok=True)
        if os.access(first, os.W_OK):
            return first
        problem = "not writable"
    except OSError as exc:
        problem = exc.strerror or str(exc)
    fallback = _fallback_dir() / digest
    try:
        fallback.mkdir(parents=True, exist_ok=True)
        if os.access(fallback, os.W_OK):
            warnings.warn(
                f"memoplan: the code cache {first.parent} cannot be used ({problem}); "
                f"writing generated code to {fallback.parent} instead (set MEMOPLAN_CACHE_DIR to choose)",
                RuntimeWarning,
                stacklevel=4,
            )
            return fallback
    except OSError:
        pass
    raise PlanError(
        (
            Diagnostic(
                "MP410",
                f"cannot write generated code: the cache {first.parent} is unusable ({problem}) "
                f"and so is {fallback.parent}",
                help="set MEMOPLAN_CACHE_DIR (or XDG_CACHE_HOME) to a writable folder",
            ),
        )
    )


def write_files(code: GeneratedCode, directory: Path, main_name: str | None = None) -> list[Path]:
    """Write every file of ``code`` into ``directory`` (the main file as ``main_name`` if given)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, file in enumerate(code.files):
        name = main_name if (i == 0 and main_name) else file.name
        written.append(_write_atomic(directory / name, file.text))
    return written


def _write_atomic(path: Path, text: str) -> Path:
    data = text.encode("utf-8")
    if path.exists() and path.read_bytes() == data:
        return path
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def import_generated(code: GeneratedCode) -> ModuleType:
    """Write ``code`` to the cache (once per content) and import its main module."""
    digest = hashlib.sha256("\0".join(f.name + "\0" + f.text for f in code.files).encode()).hexdigest()[:20]
    module_name = f"memoplan_generated_{digest}"
    cached = sys.modules.get(module_name)
    if cached is not None:
        return cached
    directory = _writable_dir(digest)
    try:
        path = write_files(code, directory)[0]
    except OSError as exc:
        raise PlanError(
            (Diagnostic("MP410", f"cannot write generated code to {directory}: {exc.strerror or exc}"),)
        ) from None
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None, "a .py file always has a spec and a loader"
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
