"""Codegen stage: writes generated files and imports the plan module from the cache.

``memoplan.apply`` goes through here: the code it runs is exactly the code
``memoplan compile`` would write into a user's repository.  The cache folder is
``$MEMOPLAN_CACHE_DIR`` or ``~/.cache/memoplan``; files are named by the hash of
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
from pathlib import Path
from types import ModuleType

from memoplan.codegen.emit import GeneratedCode


def cache_dir() -> Path:
    root = os.environ.get("MEMOPLAN_CACHE_DIR") or Path.home() / ".cache" / "memoplan"
    return Path(root) / "generated"


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
    directory = cache_dir() / digest
    path = write_files(code, directory)[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
