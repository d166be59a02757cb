"""Output targets (``-o PATH`` and ``memoplan.write_module``'s ``output``): checked before any work,
and replaced all at once.

A target is written only when it is absent or a regular file, its folder exists, and it is
none of the command's inputs (the plan, a profile, the model's file).  Anything else is
``MP508`` and the target is left alone: never replaced, never read (``/dev/null`` stays a
device, ``/dev/full`` is not read to compare it), no folder is created.

Every file memoplan writes for a user (``fmt``, ``plan -o``, ``profile -o``, ``report``,
``compile``, ``demo``, the code cache of ``apply``) is written by :func:`replace_file`: a
temporary file in the same folder, flushed to disk, renamed over the target.  A failed write
(a full disk, a quota, a file-size limit, Ctrl-C) leaves the old file whole.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from memoplan.diagnostics import Diagnostic, PlanError


def check_target(path: Path | str, inputs: Iterable[Path | str | None] = ()) -> Path:
    """``path`` if it may be written; PlanError (MP508) saying why not otherwise."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        _refuse(path, exc.strerror or str(exc), "give -o the path of a file you can write")
    if info is not None and stat.S_ISDIR(info.st_mode):
        _refuse(path, "it is a directory", "give -o the path of a file")
    if info is not None and not stat.S_ISREG(info.st_mode):
        _refuse(
            path,
            "it is not a regular file (a device, a pipe or a socket): it is never replaced",
            "give -o the path of a regular file, or leave it absent",
        )
    parent = path.parent
    if not parent.is_dir():
        _refuse(
            path, f"the folder `{parent}` does not exist (it is not created)", f"create it first: mkdir -p {parent}"
        )
    for given in inputs:
        if given is not None and info is not None and _same_file(path, Path(given)):
            _refuse(
                path,
                f"it is an input of this command (`{given}`): an input is never a target",
                "write the output to another path",
            )
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _refuse(path: Path, reason: str, help_: str) -> None:
    raise PlanError((Diagnostic("MP508", f"cannot write `{path}`: {reason}", help=help_),))


def check_output(path: Path, *inputs: Path | str | None) -> Path:
    """A command's ``-o PATH`` (:func:`check_target`) before any work; ``-`` is standard output."""
    if str(path) == "-":
        return path
    return check_target(path, [p for p in inputs if p is not None and str(p) != "-"])


def model_file(spec: str | None, base: Path | None = None) -> Path | None:
    """The file a ``path/file.py:factory`` spec names (an input no ``-o`` may overwrite), else None."""
    module = spec.rpartition(":")[0] if spec else ""
    if not module.endswith(".py"):
        return None
    return (base or Path(".")) / module


def plan_inputs(plan, path: Path, spec: str | None) -> tuple[Path | None, ...]:
    """A plan command's inputs: the plan's file and its model's file (``--model``, else its own)."""
    own = plan.model.spec if plan is not None and plan.model is not None else None
    return (path, model_file(spec) if spec else model_file(own, path.parent))


@contextlib.contextmanager
def writing(path: Path):
    """Writing ``path`` (with :func:`replace_file`): an OSError becomes MP508 instead of a traceback."""
    try:
        yield
    except OSError as exc:
        _refuse(path, exc.strerror or str(exc), "the file is left as it was; give -o the path of a file you can write")


def replace_file(path: Path | str, data: str | bytes, *, follow_links: bool = True) -> Path:
    """Replace the file at ``path`` with ``data`` (``str``: UTF-8) at once; return ``path``.

    The bytes go to a temporary file in the same folder, which is flushed to disk (``fsync``)
    and renamed over ``path``, and the folder is flushed too: a reader, or a crash, a full
    disk or a file-size limit at any moment, sees the old file whole or the new one, never a
    part of it.  The new file keeps the mode of the file it replaces (and its owner and group
    where this process may set them); a new file gets ``0o666`` less the umask, as ``open()``
    gives it.  A file this process may not write (read-only) is not replaced, although its
    folder would allow the rename: ``PermissionError``, as ``open(path, "w")`` raises.  A
    symbolic link is followed (the file it names is replaced; the link stays) unless
    ``follow_links`` is false, when the link itself is replaced.  Errors are ``OSError``;
    the temporary file is removed whatever happens.
    """
    path = Path(path)
    target = Path(os.path.realpath(path)) if follow_links and path.is_symlink() else path
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        info: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        info = None
    keep = info is not None and stat.S_ISREG(info.st_mode)
    if info is not None and not keep and not stat.S_ISLNK(info.st_mode):  # a folder, a device: never replaced
        raise OSError(errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL, "not a regular file", str(path))
    if keep and not _may_write(target):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    mode = stat.S_IMODE(info.st_mode) if keep and info is not None else 0o666 & ~umask()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:64]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        if keep and info is not None:
            _same_owner(tmp, info)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sync_folder(target.parent)
    return path


def _may_write(path: Path) -> bool:
    """Whether this process may write ``path`` itself (as ``open(path, "w")`` would be allowed)."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK, effective_ids=effective)


def _same_owner(tmp: str, info: os.stat_result) -> None:
    """Give ``tmp`` the owner and group of the file it replaces, where this process may."""
    if not hasattr(os, "chown"):
        return
    mine = os.stat(tmp)
    if (mine.st_uid, mine.st_gid) != (info.st_uid, info.st_gid):
        with contextlib.suppress(OSError):
            os.chown(tmp, info.st_uid, info.st_gid)


def _sync_folder(folder: Path) -> None:
    """Flush the rename to disk (where folders can be opened: not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
