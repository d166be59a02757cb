"""Codegen stage: writes generated files and imports the plan module from the cache.

``memoplan.apply`` goes through here: the code it runs is exactly the code
``memoplan write-module`` would write into a user's repository.  The cache folder is
``$MEMOPLAN_CACHE_DIR``, else ``$XDG_CACHE_HOME/memoplan``, else ``~/.cache/memoplan``;
when it cannot be used, a folder in the system's temporary directory
(``memoplan-<uid>/generated``) is used with a warning, and when neither can, ``apply``
fails with MP410 (nothing is installed).  Files are named by the hash of their content
and replaced atomically (:func:`memoplan.targets.replace_file`), so concurrent processes
(DDP ranks) agree.  A written file gets the mode of the file it replaces, or else
``0o666`` less the umask, as ``open()`` would give it.

The cache trusts only what it can check (``docs/security.md``): each of its folders is
owned by this user and writable by no one else (one that belongs to another user is
refused; one of ours that others may write loses their permission), the module is
compared with the code's SHA-256 before it runs, and it runs from that checked source,
never from a ``.pyc``.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import linecache
import os
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from memoplan.codegen.emit import GeneratedCode
from memoplan.diagnostics import Diagnostic, PlanError
from memoplan.targets import replace_file


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
    user = _uid() if _uid() is not None else "user"
    return Path(tempfile.gettempdir()) / f"memoplan-{user}" / "generated"


def _uid() -> int | None:
    """This process's user id (the owner of every folder the cache trusts); None where there is none."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def _writable_dir(digest: str) -> Path:
    """``cache_dir()/digest`` made and trusted, else the temporary fallback with a warning; MP410 if neither."""
    first = cache_dir() / digest
    problem = _unusable(first.parent.parent, (first.parent, first))
    if problem is None:
        return first
    fallback = _fallback_dir() / digest
    again = _unusable(fallback.parent.parent.parent, (fallback.parent.parent, fallback.parent, fallback))
    if again is None:
        warnings.warn(
            f"memoplan: the code cache {first.parent} cannot be used ({problem}); "
            f"writing generated code to {fallback.parent} instead (set MEMOPLAN_CACHE_DIR to choose)",
            RuntimeWarning,
            stacklevel=4,
        )
        return fallback
    raise PlanError(
        (
            Diagnostic(
                "MP410",
                f"cannot write generated code: the cache {first.parent} is unusable ({problem}) "
                f"and so is {fallback.parent} ({again})",
                help="set MEMOPLAN_CACHE_DIR (or XDG_CACHE_HOME) to a folder of yours that only you can write",
            ),
        )
    )


def _unusable(base: Path, folders: tuple[Path, ...]) -> str | None:
    """Why code may not be cached in ``folders[-1]``, or None: ``base`` is made if missing, then
    each of ``folders`` in turn, and each must be one :func:`_trusted` accepts."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        for folder in folders:
            problem = _trusted(folder)
            if problem is not None:
                return f"{folder} {problem}"
        if not os.access(folders[-1], os.W_OK):
            return "not writable"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _trusted(folder: Path) -> str | None:
    """Make ``folder`` (mode 0o700) if missing; None when the cache may use it, else why not.

    A usable folder is a folder (not a link to one) owned by this user that no one else may
    write: another user who made it first, or may add files to it, would choose the code
    ``apply`` runs.  A folder of this user's that others may write is repaired (their write
    permission removed: what they may have put there is never run, see :func:`import_generated`).
    """
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    uid = _uid()
    if uid is None:  # no owners, no permission bits to check (Windows)
        return None
    if info.st_uid != uid:
        return f"belongs to another user (uid {info.st_uid}, not {uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.chmod(folder, stat.S_IMODE(info.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    return None


def write_files(
    code: GeneratedCode, directory: Path, main_name: str | None = None, *, follow_links: bool = True
) -> list[Path]:
    """Write every file of ``code`` into ``directory`` (the main file as ``main_name`` if given).

    Each file is replaced at once (:func:`memoplan.targets.replace_file`), keeping its mode; a
    file that already holds the same bytes is left untouched.  ``follow_links=False`` (the
    cache): a symbolic link in the way is replaced, never written through.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, file in enumerate(code.files):
        name = main_name if (i == 0 and main_name) else file.name
        path = directory / name
        data = file.text.encode("utf-8")
        if _read(path, follow_links) != data:
            replace_file(path, data, follow_links=follow_links)
        written.append(path)
    return written


def _read(path: Path, follow_links: bool) -> bytes | None:
    """The bytes of the regular file ``path`` (a link followed only with ``follow_links``), else None."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read()


def import_generated(code: GeneratedCode) -> ModuleType:
    """Write ``code`` to the cache (once per content) and import its main module.

    What runs is ``code`` itself, never what else the cache holds: the file is read back and
    its SHA-256 compared with the code's before anything runs (MP410 if another process
    changed it), and the module is executed from that checked source, never from bytecode
    (no ``__pycache__`` is read or written, so a planted ``.pyc`` is never loaded).
    """
    digest = hashlib.sha256("\0".join(f.name + "\0" + f.text for f in code.files).encode()).hexdigest()[:20]
    module_name = f"memoplan_generated_{digest}"
    cached = sys.modules.get(module_name)
    if cached is not None:
        return cached
    directory = _writable_dir(digest)
    try:
        path = write_files(code, directory, follow_links=False)[0]
    except OSError as exc:
        raise PlanError(
            (Diagnostic("MP410", f"cannot write generated code to {directory}: {exc.strerror or exc}"),)
        ) from None
    source = code.main.text
    found = _read(path, follow_links=False)
    if found is None or hashlib.sha256(found).digest() != hashlib.sha256(source.encode("utf-8")).digest():
        raise PlanError(
            (
                Diagnostic(
                    "MP410",
                    f"the generated code in {path} is not what memoplan wrote (changed by another process); nothing was run",
                    help="set MEMOPLAN_CACHE_DIR to a folder of yours that only you can write",
                ),
            )
        )
    return _execute(module_name, path, source)


class _CheckedSource(importlib.abc.Loader):
    """Runs a plan module from its checked source text (never from bytecode); gives the text to
    ``inspect``, tracebacks and :mod:`memoplan.runtime.pickling` as the module's source."""

    def __init__(self, path: Path, source: str) -> None:
        self.path = path
        self.source = source

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.source, str(self.path), "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.source


def _execute(module_name: str, path: Path, source: str) -> ModuleType:
    loader = _CheckedSource(path, source)
    spec = importlib.util.spec_from_loader(module_name, loader, origin=str(path))
    assert spec is not None, "a loader always gives a spec"
    spec.has_location = True  # __file__ is the cached file (its text is `source`, checked)
    module = importlib.util.module_from_spec(spec)
    linecache.cache[str(path)] = (len(source), None, source.splitlines(keepends=True), str(path))
    sys.modules[module_name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
