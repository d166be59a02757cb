"""The command line's inputs and outputs: several plans, folders and standard input; the
``text``, ``json`` and ``github`` output formats; ``-q`` and ``-v``; ``-o -``.

``memoplan.cli`` runs the commands; this module decides where what they say goes.  In
``text`` format diagnostics go to stderr as they are found and results to stdout.  In
``json`` format nothing but one JSON document is printed to stdout, at the end (schema:
``docs/reference/cli.md``).  In ``github`` format every diagnostic is one GitHub Actions
workflow command (``::error file=...,line=...::message``) on stdout, which GitHub shows
as an annotation on the line of the pull request.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memoplan import isolate
from memoplan.diagnostics import Diagnostic, PlanError, Severity, printable
from memoplan.progress import REPORTER
from memoplan.targets import replace_file

FORMATS = ("text", "json", "github")
STDIN = "-"
SCHEMA_VERSION = 1


@dataclass
class FileResult:
    """What one command said about one plan."""

    path: str
    status: str = "ok"  # ok, error, reformat (fmt --check), reformatted (fmt)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    summary: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Output:
    """The settings of this run (``--format``, ``-q``, ``-v``) and what it has found so far."""

    format: str = "text"
    verbosity: int = 0  # -1 quiet, 0 normal, 1+ verbose
    command: str = ""
    files: list[FileResult] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def collecting(self) -> bool:
        return self.format != "text"

    def begin(self, path: str) -> FileResult:
        result = FileResult(path)
        self.files.append(result)
        return result

    @property
    def current(self) -> FileResult | None:
        return self.files[-1] if self.files else None

    def diagnostic(self, diagnostic: Diagnostic, source: str | None) -> None:
        """A warning or note found on the way: printed now (text) or kept for the end."""
        if self.collecting and self.current is not None:
            self.current.diagnostics.append(diagnostic)
            return
        if diagnostic.severity is Severity.NOTE and self.verbosity < 0:
            return
        print(diagnostic.render(source), file=sys.stderr)

    def failed(self, error: PlanError) -> bool:
        """A plan's errors: kept (json, github) or left to the caller to print (text, returns False)."""
        if not self.collecting:
            if self.current is not None:
                self.current.status = "error"
            return False
        current = self.current if self.current is not None else self.begin("")
        current.status = "error"
        current.diagnostics.extend(error.diagnostics)
        return True

    def progress(self, message: str) -> None:
        REPORTER.say(printable(message))  # specs come from the plan; -q and --format json: nothing

    def result(self, line: str) -> None:
        """A one-line outcome (``plan.memplan: ok, 3 rules``): stdout in text format, unless -q."""
        if self.current is not None:
            self.current.summary = line
        if self.format == "text" and self.verbosity >= 0:
            print(printable(line))  # holds the plan's file name: a folder's files may be named anything

    def finish(self, code: int) -> int:
        """Print the collected document (json) or annotations (github); return ``code``."""
        if self.format == "json":
            document = {
                "version": SCHEMA_VERSION,
                "command": self.command,
                "exit_code": code,
                "files": [_file_json(f) for f in self.files],
            }
            print(json.dumps(json_safe(document), indent=2, ensure_ascii=False, allow_nan=False))
        elif self.format == "github":
            out = unguarded(sys.stdout)  # the one place a line starts with `::`, memoplan's own
            for result in self.files:
                for diagnostic in result.diagnostics:
                    print(github_annotation(diagnostic, result.path), file=out)
                if result.status == "reformat":
                    print(
                        f"::error file={_escape_property(result.path)},title=memoplan fmt::would reformat (run memoplan fmt)",
                        file=out,
                    )
        return code


OUTPUT = Output()


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_safe(value: Any) -> Any:
    """``value`` with nothing that would make its JSON text invalid or not UTF-8.

    A file name with bytes that are not UTF-8 (``0xff``) reaches Python as lone surrogates,
    which would be written to stdout as those raw bytes: they become the escape the text
    format prints (``\\udcff``, as ``printable`` writes it).  A float that is not finite
    (JSON has no NaN or Infinity) becomes ``null``; the options refuse them first."""
    if isinstance(value, str):
        return _SURROGATE.sub(lambda m: printable(m.group()), value) if _SURROGATE.search(value) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def configure(args: Any) -> Output:
    """Set this run's output from the parsed arguments (``--format``, ``-q``, ``-v``)."""
    OUTPUT.format = getattr(args, "format", None) or "text"
    OUTPUT.verbosity = -1 if getattr(args, "quiet", False) else int(getattr(args, "verbose", 0) or 0)
    OUTPUT.command = getattr(args, "command", "") or ""
    OUTPUT.files = []
    OUTPUT.started = time.monotonic()
    REPORTER.configure(verbosity=OUTPUT.verbosity, enabled=OUTPUT.format != "json")
    return OUTPUT


def diagnostic_json(diagnostic: Diagnostic) -> dict[str, Any]:
    """One diagnostic as JSON: code, severity, message, help, span (1-based), notes."""
    span = diagnostic.span
    return {
        "code": diagnostic.code,
        "severity": diagnostic.severity.value,
        "message": diagnostic.message,
        "help": diagnostic.help,
        "span": None if span is None else _span_json(span),
        "notes": [{"label": label, "span": _span_json(note)} for label, note in diagnostic.notes],
    }


def _span_json(span: Any) -> dict[str, Any]:
    return {
        "file": span.file,
        "line": span.line,
        "column": span.column,
        "end_line": span.end_line,
        "end_column": span.end_column,
    }


def _file_json(result: FileResult) -> dict[str, Any]:
    found = {
        "path": result.path,
        "status": result.status,
        "diagnostics": [diagnostic_json(d) for d in result.diagnostics],
    }
    if result.summary is not None:
        found["summary"] = result.summary
    found.update(result.details)
    return found


_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "notice"}


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(diagnostic: Diagnostic, path: str) -> str:
    """``::error file=F,line=L,col=C,endLine=..,endColumn=..,title=MP101::message`` (GitHub Actions)."""
    span = diagnostic.span
    properties = [f"file={_escape_property(span.file if span is not None else path)}"]
    if span is not None:
        properties += [f"line={span.line}", f"col={span.column}", f"endLine={span.end_line}"]
        if span.end_line == span.line:
            properties.append(f"endColumn={span.end_column}")
    properties.append(f"title={_escape_property('memoplan ' + diagnostic.code)}")
    message = printable(diagnostic.message) + (f"\nhelp: {printable(diagnostic.help)}" if diagnostic.help else "")
    return f"::{_GITHUB_LEVEL[diagnostic.severity]} {','.join(properties)}::{_escape_data(message)}"


# ---------------------------------------------------------------- no workflow commands


class LineGuard:
    """A text stream that writes to ``stream`` what it is given, except that no line starts
    (after white space) with ``::``: GitHub Actions reads such a line, on standard output or
    error, as a workflow command (``::add-mask::``, ``::error ...::``), and memoplan's lines
    hold names from the user (a plan's file name, a module's name).  The first colon of such
    a line is written ``\\x3a``, as :func:`memoplan.diagnostics.printable` writes a control
    character.  ``--format github``'s own annotations go around it (:func:`unguarded`).
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._held = ""  # the start of the current line while it could still become `::`
        self._decided = False  # the current line's start was written: the rest goes through

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            ended = len(piece.splitlines()[0]) < len(piece)
            if self._decided:
                self.stream.write(piece)
            else:
                line = self._held + piece
                if ended or line.lstrip() not in ("", ":"):
                    self.stream.write(defuse(line))
                    self._held, self._decided = "", not ended
                else:
                    self._held = line
            if ended:
                self._decided = False
        return len(text)

    def release(self) -> None:
        """Write what is held (white space and a colon, the start of a line not finished), its
        colon written ``\\x3a``: what comes after it on the line can no longer make a command."""
        if self._held:
            self.stream.write(self._held.replace(":", "\\x3a"))
            self._held = ""

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, buffer, fileno, isatty, ...
        return getattr(self.stream, name)


def defuse(line: str) -> str:
    """``line`` with the first colon of a leading ``::`` (after white space) written ``\\x3a``."""
    stripped = line.lstrip()
    if not stripped.startswith("::"):
        return line
    start = len(line) - len(stripped)
    return line[:start] + "\\x3a" + line[start + 1 :]


def unguarded(stream: Any) -> Any:
    """The stream under a :class:`LineGuard` (what it held written first), else ``stream``."""
    if isinstance(stream, LineGuard):
        stream.release()
        return stream.stream
    return stream


@contextlib.contextmanager
def guarded_output():
    """``sys.stdout`` and ``sys.stderr`` through a :class:`LineGuard` while a command runs."""
    saved = sys.stdout, sys.stderr
    guards = LineGuard(sys.stdout), LineGuard(sys.stderr)
    sys.stdout, sys.stderr = guards
    try:
        yield
    finally:
        for guard in guards:
            with contextlib.suppress(Exception):  # a closed pipe: nothing more to say
                guard.release()
        if sys.stdout is guards[0]:  # not replaced meanwhile (a closed pipe sets it to None)
            sys.stdout = saved[0]
        if sys.stderr is guards[1]:
            sys.stderr = saved[1]


# ---------------------------------------------------------------- inputs


def expand_plans(names: list[Path]) -> list[Path]:
    """Plans named on the command line: files as given, folders as their ``*.memplan`` files
    (recursively, sorted, hidden folders skipped, links out of the folder skipped), ``-`` as
    standard input (once)."""
    found: list[Path] = []
    for name in names:
        if str(name) != STDIN and name.is_dir():
            found.extend(_plans_in(name))
        else:
            found.append(name)
    return list(dict.fromkeys(found))


def _plans_in(folder: Path) -> list[Path]:
    """The ``*.memplan`` files under ``folder``; a link to a file outside it is not followed
    (a plan from elsewhere could point at ``/proc/self/environ``): skipped, with a note."""
    root = folder.resolve()
    inside = []
    for path in sorted(folder.rglob("*.memplan")):
        if any(part.startswith(".") for part in path.relative_to(folder).parts) or not path.is_file():
            continue
        if not path.resolve().is_relative_to(root):
            OUTPUT.progress(f"skipped {path}: a link to a file outside {folder} (name the file itself to read it)")
            continue
        inside.append(path)
    return inside


def is_stdin(path: Path | None) -> bool:
    return path is not None and str(path) == STDIN


def read_stdin() -> str:
    """Standard input as plan text: UTF-8, else MP107 (as for a file)."""
    from memoplan.syntax.reading import MAX_PLAN_BYTES, not_a_plan, too_large

    data = sys.stdin.buffer.read(MAX_PLAN_BYTES + 1)  # never more than the limit: stdin may be endless
    if len(data) > MAX_PLAN_BYTES:
        raise PlanError((too_large("<stdin>", len(data), "bytes or more"),))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(
            (
                Diagnostic(
                    "MP107",
                    f"standard input is not UTF-8 text: byte 0x{data[exc.start]:02x} ({exc.reason})",
                    help="send UTF-8 text",
                ),
            )
        ) from None
    refused = not_a_plan(text, "<stdin>")  # binary, or no header: refused without quoting it
    if refused is not None:
        raise PlanError((refused,))
    return text


def display_name(path: Path) -> str:
    """How diagnostics name a plan: its path, or ``<stdin>``."""
    return "<stdin>" if is_stdin(path) else str(path)


def to_stdout(path: Path | None) -> bool:
    """``-o -``: the output goes to standard output."""
    return is_stdin(path)


# ---------------------------------------------------------------- memoplan demo


def copy_demo(folder: Path) -> list[Path]:
    """Copy the bundled example plans into ``folder`` (made if missing; existing files kept)."""
    from memoplan._resources import plans_dir

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for plan in sorted(plans_dir().glob("*.memplan")):
        target = folder / plan.name
        if not target.exists():
            replace_file(target, plan.read_bytes())
        written.append(target)
    return written


# ---------------------------------------------------------------- exit codes and shared commands

EXIT_OK = 0  # clean
EXIT_FINDINGS = 1  # diagnostics, not equivalent, a missed hard budget, `fmt --check`: would reformat
EXIT_USAGE = 2  # the command line is wrong (argparse's own code)
EXIT_UNREADABLE = 3  # `fmt`: a plan could not be read, parsed or written, so it was not formatted
EXIT_INTERRUPTED = 130  # Ctrl-C


def add_common_options(parser: Any, formats: bool = False) -> None:
    """``-q``/``-v`` on every command; ``--format`` on those with machine-readable output."""
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument("-q", "--quiet", action="store_true", help="print only errors, warnings and requested output")
    loudness.add_argument(
        "-v", "--verbose", action="count", default=0, help="progress with elapsed time, and every note"
    )
    if formats:
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="text",
            help="text (default), json (one document on stdout) or github (Actions annotations on stdout)",
        )


def load_plan(path: Path) -> Any:
    """Read (``-``: standard input) and parse a plan; PlanError with every error, warnings printed."""
    from memoplan.syntax import parse_with_diagnostics, read_plan

    text = read_stdin() if is_stdin(path) else read_plan(path)  # as `memoplan.load`: MP107, BOM, line ends
    plan, diagnostics = parse_with_diagnostics(text, display_name(path))
    if plan is None or any(d.is_error for d in diagnostics):
        raise PlanError(tuple(diagnostics), text)
    for warning in diagnostics:
        OUTPUT.diagnostic(warning, text)
    return plan


def run_fmt(args: Any, report: Any) -> int:
    """``memoplan fmt``: rewrite plans (``-``: standard input to standard output), or with
    ``--check`` change nothing and print a diff.  Exit 1 only when a file would be
    reformatted, 3 when a plan could not be read, parsed or written (``report`` prints its
    errors); the other plans are formatted all the same."""
    import difflib

    from memoplan.syntax import format_plan

    not_formatted = would_change = False
    for path in expand_plans(args.plans):
        result = OUTPUT.begin(display_name(path))
        try:
            plan = load_plan(path)
        except PlanError as error:
            if not OUTPUT.failed(error):
                report(error)
            not_formatted = True
            continue
        text = format_plan(plan)
        if is_stdin(path) and not args.check:
            sys.stdout.write(text)
            continue
        if text == plan.source:
            continue
        would_change = True
        if not args.check:
            try:
                _rewrite(path, text)  # at once: a failed write leaves the plan as it was
            except PlanError as error:
                if not OUTPUT.failed(error):
                    report(error)
                not_formatted = True
                continue
        result.status = "reformat" if args.check else "reformatted"
        if OUTPUT.format == "text":
            print(f"{'would reformat' if args.check else 'reformatted'} {printable(result.path)}")
        if args.check:
            diff = difflib.unified_diff(
                plan.source.splitlines(keepends=True),
                text.splitlines(keepends=True),
                result.path,
                f"{result.path} (formatted)",
            )
            shown = "".join(printable(line.rstrip("\n")) + "\n" for line in diff)
            result.details["diff"] = shown
            if OUTPUT.format == "text":
                sys.stdout.write(shown)
    if not_formatted:
        return EXIT_UNREADABLE
    return EXIT_FINDINGS if (args.check and would_change) else EXIT_OK


def compare_compiled(output: Path, fresh: bytes) -> int:
    """``write-module --check``: 0 when ``output`` (a regular file or absent: checked before) holds
    ``fresh`` byte for byte; else 1, saying so, with a unified diff of the two."""
    current = output.read_bytes() if output.exists() else None
    if current == fresh:
        print(f"{printable(str(output))} is up to date")
        return EXIT_OK
    print(f"{printable(str(output))} {'is missing' if current is None else 'is out of date'}; run without --check")
    if current is not None:
        sys.stdout.write(unified_diff(current, fresh, str(output), f"{output} (generated now)"))
    return EXIT_FINDINGS


def unified_diff(old: bytes, new: bytes, old_name: str, new_name: str) -> str:
    """``diff -u`` of two files' bytes, each line through ``printable`` (``write-module --check``).

    Bytes that are not UTF-8 show as U+FFFD; a line-ending change shows as a changed line.
    """
    import difflib

    before = old.decode("utf-8", "replace").splitlines(keepends=True)
    after = new.decode("utf-8", "replace").splitlines(keepends=True)
    diff = difflib.unified_diff(before, after, printable(old_name), printable(new_name))
    return "".join(printable(line.rstrip("\n")) + "\n" for line in diff)


def _rewrite(path: Path, text: str) -> None:
    try:
        replace_file(path, text)
    except OSError as exc:
        raise PlanError(
            (Diagnostic("MP508", f"cannot write `{path}`: {exc.strerror or exc}", help="the plan is left as it was"),)
        ) from None


def write_output(path: Path, text: str) -> bool:
    """Write ``text`` to ``-o PATH``; ``-o -`` prints it instead.  True when it went to stdout."""
    if to_stdout(path):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return True
    try:
        replace_file(path, text)
    except OSError as exc:
        raise PlanError(
            (Diagnostic("MP508", f"cannot write `{path}`: {exc.strerror or exc}", help="the file is left as it was"),)
        ) from None
    return False


def verify_details(report: Any) -> dict[str, Any]:
    """``memoplan verify --format json``: the measured peaks and times, each comparison, the verdict."""
    return {
        "equivalent": report.equivalent,
        "peak_bytes": {"unplanned": report.unplanned.peak_bytes, "planned": report.planned.peak_bytes},
        "meter": {"method": report.unplanned.method, "device": str(report.unplanned.device)},
        "step_seconds": {"unplanned": report.unplanned_seconds, "planned": report.planned_seconds},
        "rtol": report.rtol,
        # When the unplanned step did not fit: the peaks are of the full example (the unplanned one
        # estimated on fake tensors), the checks of the smaller one.
        "examples": {"peaks": report.full_example, "checks": report.compared_on},
        "compile": None
        if report.captures is None
        else {
            "backend": report.backend,
            **{
                name: {"graphs": c.graphs, "ops": c.ops, "graph_breaks": dict(c.breaks)}
                for name, c in zip(("unplanned", "planned"), report.captures)
            },
        },
        "checks": [
            {
                "name": c.name,
                "equal": c.equal,
                "compared": c.compared,
                "differences": [str(d) for d in c.differences[:10]],
            }
            for c in report.checks
        ],
        **({} if getattr(report, "arena", None) is None else {"memonger": _arena_details(report.arena)}),
    }


def _arena_details(check: Any) -> dict[str, Any]:
    """The ``memonger`` block's arena inference against eager (``memoplan.verification.ArenaCheck``)."""
    return {
        "ran": check.ran,
        "equal": check.equal,
        "compared": check.outputs.compared,
        "differences": [str(d) for d in check.outputs.differences[:10]],
        "peak_bytes": {"eager": check.eager_peak, "arena": check.arena_peak + check.arena_bytes},
        "arena_bytes": check.arena_bytes,
        "allocations": {
            "eager": {"count": check.eager_allocations.count, "bytes": check.eager_allocations.bytes},
            "arena": {"count": check.arena_allocations.count, "bytes": check.arena_allocations.bytes},
        },
    }


def progress(message: str) -> None:
    """A progress line on stderr (``-q`` silences it, ``-v`` times it; between a stage's bar
    and its lines, :mod:`memoplan.progress`), also the step an ``--isolate`` parent names if the
    model's code crashes after it."""
    OUTPUT.progress(message)
    isolate.note(message)
