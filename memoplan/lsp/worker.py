"""Editor stage: the model process — resolves a plan against its model, away from the editor's server.

Loading a model runs the user's code and can take seconds, so the language server
never does it itself: when the user turns it on, it starts this module as a separate
process (``python -m memoplan.lsp.worker``) and sends it each plan that parses, one
JSON line per request.  The process builds the plan's model once per spec (seeded as
``memoplan check`` seeds it), resolves every plan sent against it, and answers with
what ``check`` would print with that model (``MP3xx``, ``MP50x`` at the ``model`` line,
``MP324`` with the example), what each rule selects and which rule wins for each
module (``memoplan.resolver.explain``), the model's paths and classes for completion,
and the source files the model came from.  When one of those files changes, the
server starts a fresh process: Python cannot unload a module, a new interpreter can.
A model that hangs or crashes takes this process down, never the editor's server.

The user's code may print: the protocol has the process's original stdout to itself,
and whatever the user prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from memoplan.diagnostics import Diagnostic, PlanError, Severity, Span

SHOWN_PER_RULE = 12  # modules listed in a selector's hover; the count covers them all
MAX_PATHS = 20000  # module paths offered for completion


# ---------------------------------------------------------------- diagnostics as JSON


def span_to_json(span: Span | None) -> list | None:
    if span is None:
        return None
    return [span.file, span.line, span.column, span.end_line, span.end_column]


def span_from_json(data: list | None) -> Span | None:
    return None if data is None else Span(*data)


def diagnostic_to_json(diagnostic: Diagnostic) -> dict:
    return {
        "code": diagnostic.code,
        "message": diagnostic.message,
        "span": span_to_json(diagnostic.span),
        "help": diagnostic.help,
        "severity": diagnostic.severity.value,
        "notes": [[label, span_to_json(span)] for label, span in diagnostic.notes],
    }


def diagnostic_from_json(data: dict) -> Diagnostic:
    return Diagnostic(
        data["code"],
        data["message"],
        span_from_json(data["span"]),
        data["help"],
        Severity(data["severity"]),
        tuple((label, Span(*span)) for label, span in data["notes"]),  # a note always has a span
    )


# ---------------------------------------------------------------- the process


class _Session:
    """The models and examples this process has built, by spec and folder."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], Any] = {}  # (spec, base_dir) -> model or PlanError
        self.examples: dict[tuple[str, str], Any] = {}
        self.watched: dict[str, float] = {}

    def model(self, plan, base_dir: str):
        import torch

        from memoplan import specs

        key = (plan.model.spec, base_dir)
        if key not in self.models:
            before = set(sys.modules)
            torch.manual_seed(0)  # as `memoplan check` builds it
            try:
                self.models[key] = specs.load_model(plan.model.spec, base_dir=base_dir, span=plan.model.span)
            except PlanError as error:
                self.models[key] = error
            self._watch(set(sys.modules) - before, plan.model.spec, base_dir)
        found = self.models[key]
        if isinstance(found, PlanError):
            raise PlanError(_moved(found.diagnostics, plan.model.span), found.source)
        return found

    def example(self, plan, base_dir: str):
        from memoplan import specs
        from memoplan.syntax.formatter import format_example

        key = (format_example(plan.example), base_dir)
        if key not in self.examples:
            before = set(sys.modules)
            try:
                self.examples[key] = specs.make_example(plan.example, base_dir=base_dir)
            except PlanError as error:
                self.examples[key] = error
            self._watch(set(sys.modules) - before, plan.example.spec, base_dir)
        found = self.examples[key]
        if isinstance(found, PlanError):
            raise PlanError(_moved(found.diagnostics, plan.example.span), found.source)
        return found

    def _watch(self, names: set[str], spec: str | None, base_dir: str) -> None:
        """Remember the source files that came with a model: the user's, not the installed packages'."""
        files = [getattr(sys.modules.get(name), "__file__", None) for name in names]
        if spec and ":" in spec:
            location = spec.rsplit(":", 1)[0]
            if location.endswith(".py") or os.sep in location or "/" in location:
                files.append(str(Path(base_dir, location).expanduser()))
        installed = tuple({sys.base_prefix, sys.prefix, sys.exec_prefix})
        for file in files:
            if not file or "site-packages" in file or "dist-packages" in file:
                continue
            path = os.path.abspath(file)
            if path.startswith(installed) and not path.startswith(os.path.abspath(base_dir)):
                continue
            try:
                self.watched[path] = os.stat(path).st_mtime_ns
            except OSError:
                self.watched[path] = -1


def _moved(diagnostics, span: Span | None) -> tuple[Diagnostic, ...]:
    """A cached load error, its span at the statement where the current text has it."""
    from dataclasses import replace

    if span is None:
        return tuple(diagnostics)
    return tuple(replace(d, span=span) if d.span is not None and d.span.file == span.file else d for d in diagnostics)


def analyse_request(session: _Session, request: dict) -> dict:
    """One plan against its model: diagnostics, what each rule selects, the model's paths and classes."""
    from memoplan.lsp.analysis import check_text
    from memoplan.resolver import explain
    from memoplan.resolver.bind import analyse
    from memoplan.resolver.effects import statement_effects
    from memoplan.resolver.selectors import select
    from memoplan.resolver.shapes import check_example

    checked = check_text(request["text"], request["file"])
    reply: dict = {"diagnostics": [], "rules": [], "modules": [], "classes": [], "watch": {}}
    plan = checked.plan
    if not checked.clean or plan is None or plan.model is None:
        return reply
    base_dir = request["base_dir"]
    try:
        model = session.model(plan, base_dir)
    except PlanError as error:
        reply["diagnostics"] = [diagnostic_to_json(d) for d in error.diagnostics]
        reply["watch"] = session.watched
        return reply
    resolution = analyse(plan, model)
    found = list(resolution.diagnostics)
    printed = statement_effects(plan)  # the server reports these already, from the text alone
    found = [d for d in found if d not in printed]
    if not any(d.is_error for d in found) and plan.example is not None:
        try:
            example = session.example(plan, base_dir)
            found.extend(check_example(plan, model, example.args, example.kwargs))
        except PlanError as error:
            found.extend(error.diagnostics)
    reply["diagnostics"] = [diagnostic_to_json(d) for d in found]
    index = resolution.index
    why = {row.path: row.decisions for row in explain(plan, model)}
    for rule in plan.rules:
        paths = select(index, rule.selector)
        shown = []
        for path in paths[:SHOWN_PER_RULE]:
            decisions = []
            for aspect, decision in sorted(resolution.decisions.get(path, {}).items()):
                decisions.append([aspect, decision.winner.line, decision.winner.rule is rule])
            shown.append(
                {
                    "path": path,
                    "class": type(index.modules[path]).__qualname__,
                    "wins": decisions,
                    "why": [list(pair) for pair in why.get(path, ())],
                }
            )
        classes = Counter(type(index.modules[p]).__qualname__ for p in paths)
        reply["rules"].append(
            {"line": rule.span.line, "count": len(paths), "shown": shown, "classes": sorted(classes.items())}
        )
    reply["modules"] = [[p, type(index.modules[p]).__qualname__] for p in index.paths[:MAX_PATHS]]
    reply["classes"] = index.all_class_names
    reply["watch"] = session.watched
    return reply


def main() -> int:
    """Serve requests on stdin, one JSON object a line; answer each on the original stdout."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the user's prints (and native writes to fd 1) go to stderr
    sys.stdout = sys.stderr
    session = _Session()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply = analyse_request(session, request)
        except BaseException as exc:  # noqa: BLE001 — a bug here is reported, not fatal
            if isinstance(exc, KeyboardInterrupt):
                raise
            reply = {"error": f"{type(exc).__name__}: {exc}", "watch": session.watched}
        reply["id"] = request.get("id")
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
    return 0


# ---------------------------------------------------------------- the server's side


class ModelWorker:
    """The server's handle on the model process: started on first use, restarted when a
    source file of the model changes, killed on timeout or shutdown."""

    def __init__(self, timeout: float = 120.0, python: str = sys.executable) -> None:
        self.timeout = timeout
        self.python = python
        self._process: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()
        self._watched: dict[str, float] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self.starts = 0  # processes started so far (a restart is one more)

    def analyse(self, text: str, file: str, base_dir: str) -> dict:
        """The model process's reply for one plan; ``{"error": ...}`` when it failed or timed out."""
        with self._lock:
            if self._changed():
                self.close()
            if self._process is None or self._process.poll() is not None:
                self._start()
            self._next_id += 1
            request = {"id": self._next_id, "text": text, "file": file, "base_dir": base_dir}
            process = self._process
            assert process is not None and process.stdin is not None  # started just above, with a pipe
            try:
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
            except OSError:
                return self._failed("the model process exited")
            while True:
                try:
                    reply = self._replies.get(timeout=self.timeout)
                except queue.Empty:
                    return self._failed(f"loading the model took longer than {self.timeout:g} s")
                if reply is None:
                    return self._failed(f"the model process exited (code {process.wait()})")
                if reply.get("id") == self._next_id:
                    self._watched = dict(reply.get("watch") or {})
                    return reply

    def _failed(self, message: str) -> dict:
        self.close()
        return {"error": message}

    def _changed(self) -> bool:
        for path, stamp in self._watched.items():
            try:
                now = os.stat(path).st_mtime_ns
            except OSError:
                now = -1
            if now != stamp:
                return True
        return False

    def _start(self) -> None:
        self._replies = queue.Queue()
        self._watched = {}
        self._process = subprocess.Popen(
            [self.python, "-m", "memoplan.lsp.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="utf-8",
        )
        self.starts += 1
        threading.Thread(target=self._read, args=(self._process, self._replies), daemon=True).start()

    @staticmethod
    def _read(process: subprocess.Popen, replies: queue.Queue) -> None:
        assert process.stdout is not None  # started with stdout=PIPE
        for line in process.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(None)

    def close(self) -> None:
        process, self._process = self._process, None
        self._watched = {}
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
