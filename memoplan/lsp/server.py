"""Editor stage: the language server, ``memoplan lsp`` (stdio, built on pygls) — a thin adapter.

Every answer comes from the modules that answer the command line: diagnostics from
the parser and the statement checks as ``memoplan check`` prints them
(``memoplan.lsp.analysis``), formatting from ``memoplan.syntax.format_plan``, hover
text from the language reference, completion from the parser's own types.  What this
module adds is the protocol: positions as the editor counts them, diagnostics as the
protocol's records, and the model process.

With the initialization option ``{"loadModel": true}`` the server also resolves each
plan that parses against the model its ``model`` line names, as ``memoplan check``
does with a model: in a separate process (``memoplan.lsp.worker``), from a background
thread, so typing never waits for it; the model is built once and rebuilt only when
one of its source files changes.  ``modelTimeout`` (seconds, default 120) bounds one
answer of that process.  Off by default: loading a model runs its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import importlib
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lsprotocol import types as lsp
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest, JsonRpcMethodNotFound
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import RPCRequest
from pygls.uris import to_fs_path

from memoplan.diagnostics import Diagnostic, Severity
from memoplan.lsp.analysis import (
    BOM,
    Checked,
    from_units,
    lines_of,
    parse_text,
    span_range,
    to_units,
    units,
    with_effects,
)
from memoplan.lsp.completion import completions
from memoplan.lsp.hover import hover_at
from memoplan.lsp.worker import ModelWorker, diagnostic_from_json
from memoplan.syntax import ast
from memoplan.syntax.reading import MAX_PLAN_BYTES
from memoplan.version import __version__

_SEVERITY = {
    Severity.ERROR: lsp.DiagnosticSeverity.Error,
    Severity.WARNING: lsp.DiagnosticSeverity.Warning,
    Severity.NOTE: lsp.DiagnosticSeverity.Information,
}
SETTLE = 0.05  # seconds without an edit before a document is checked
MAX_COMPLETIONS = 1000  # items in one answer; more (a model's paths) and the list is marked incomplete
_KINDS = {
    "keyword": lsp.CompletionItemKind.Keyword,
    "property": lsp.CompletionItemKind.Property,
    "value": lsp.CompletionItemKind.EnumMember,
    "module": lsp.CompletionItemKind.Module,
    "class": lsp.CompletionItemKind.Class,
    "function": lsp.CompletionItemKind.Function,
}


class _Answered:
    """A request already answered with an error (its params could not be read): nothing more to do."""

    jsonrpc = None


class PlanProtocol(LanguageServerProtocol):
    """pygls's protocol, with an answer to every request.

    pygls drops a request whose params do not fit the method's type (a hover without a position)
    and every request after ``shutdown``, so the editor waits for an answer that never comes.
    Here the first gets ``InvalidParams`` (or ``InternalError``) and the second ``InvalidRequest``,
    as the protocol says; notifications still get nothing."""

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if not (isinstance(data, dict) and "id" in data and "method" in data):
                raise  # a notification or a response: there is no one to answer
            error: JsonRpcException = exc
            method = str(data["method"])
            if self._shutdown and method != lsp.EXIT:
                error = _shut_down(method)
            elif self.get_message_type(method) is None and method not in self.fm.features:
                error = JsonRpcMethodNotFound.of(method)
            self._send_response(data["id"], None, error.to_response_error())
            return _Answered()

    def handle_message(self, message):
        if isinstance(message, _Answered):
            return None
        if self._shutdown and isinstance(message, RPCRequest) and message.method != lsp.EXIT:
            error = _shut_down(message.method)
            self._send_response(message.id, None, error.to_response_error())
            return None
        return super().handle_message(message)


def _shut_down(method: str) -> JsonRpcException:
    return JsonRpcInvalidRequest(message=f"the server is shut down: `{method}` is not answered")


class PlanServer(LanguageServer):
    """The documents' last checks, the model process and its last answers."""

    def __init__(self) -> None:
        super().__init__("memoplan", __version__, protocol_cls=PlanProtocol)
        self.load_model = False
        self.model_timeout = 120.0
        self.worker: ModelWorker | None = None
        self.checked: dict[str, tuple[str, Checked]] = {}  # uri -> (text, check of it)
        self.last_parsed: dict[str, tuple[str, ast.Plan]] = {}  # uri -> the last text that parsed, its tree
        self.model_replies: dict[str, tuple[str, dict]] = {}  # uri -> (text analysed, reply)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wanted: dict[str, tuple[str, str, str]] = {}  # uri -> (text, file, folder) to analyse
        self._running: set[str] = set()
        self._again: set[str] = set()  # resolve these even if their text was resolved before
        self._lock = threading.Lock()
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memoplan-model")
        self._checking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memoplan-check")
        # The statement checks wait for torch's import at first: in a thread of their own, so that
        # parsing the next edit never queues behind them.
        self._effects = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memoplan-effects")
        self._settling: dict[str, asyncio.TimerHandle] = {}  # uri -> the check waiting for edits to settle
        self._again_after_check: dict[str, bool] = {}
        self.open_documents: set[str] = set()  # as the editor names them (pygls keys its own by another spelling)

    # ------------------------------------------------------------ documents

    @property
    def encoding(self) -> str:
        return str(self.workspace.position_encoding or "utf-16")

    def refresh(self, uri: str, again: bool = False) -> None:
        """Check the document soon, publish, and (model loading on) queue its resolution.

        Edits that come within ``SETTLE`` seconds of each other are checked once, as the last
        of them left the text, in a thread of its own: typing in a long plan never queues up
        checks of texts that are already gone, and hover and completion answer meanwhile.
        ``again``: resolve it even if its text was resolved before (a file was saved, which
        may be one the model is built from: the model process checks, and rebuilds the model
        only if one of its files changed).
        """
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        waiting = self._settling.pop(uri, None)
        if waiting is not None:
            waiting.cancel()
        self._again_after_check[uri] = again or self._again_after_check.get(uri, False)
        self._settling[uri] = self.loop.call_later(SETTLE, self._check, uri)

    def _check(self, uri: str) -> None:
        """Parse in the checking thread and publish; then the statement checks, which import torch.

        The syntax and value diagnostics never wait for torch: while its import (started at
        ``initialized``) is under way, a plan without errors is published first as the parser
        sees it, and again with the statement checks' notes once they are ready.
        """
        self._settling.pop(uri, None)
        if uri not in self.open_documents:
            return  # closed meanwhile
        text = self.workspace.get_text_document(uri).source
        file, folder = _file_and_folder(uri, self.workspace.root_path)
        again = self._again_after_check.pop(uri, False)
        if len(text) > MAX_DOCUMENT:  # never parsed, split or analysed: MP522, and nothing else
            self._after_check(uri, text, file, folder, False, Checked(None, (_too_large(len(text)),)))
            return
        future = self._loop().run_in_executor(self._checking, _safely, parse_text, text, file)
        future.add_done_callback(lambda done: self._after_parse(uri, text, file, folder, again, done.result()))

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The server's loop: set by the first change, before any check is scheduled on it."""
        assert self.loop is not None
        return self.loop

    def _current(self, uri: str, text: str) -> bool:
        return uri in self.open_documents and self.workspace.get_text_document(uri).source == text

    def _after_parse(self, uri: str, text: str, file: str, folder: str, again: bool, parsed: Checked) -> None:
        if not self._current(uri, text):
            return  # edited meanwhile: the check of the newer text is on its way
        if parsed.parsed is not None:
            self.last_parsed[uri] = (text, parsed.parsed)
        if not parsed.clean:
            self._after_check(uri, text, file, folder, again, parsed)
            return
        if not _effects_ready():
            self.checked[uri] = (text, parsed)
            self.publish(uri)  # now, without waiting for torch; the statement checks follow
        future = self._loop().run_in_executor(self._effects, _safely, with_effects, parsed)
        future.add_done_callback(lambda done: self._after_check(uri, text, file, folder, again, done.result()))

    def _after_check(self, uri: str, text: str, file: str, folder: str, again: bool, checked: Checked) -> None:
        if not self._current(uri, text):
            return  # edited meanwhile: the check of the newer text is on its way
        self.checked[uri] = (text, checked)
        self.publish(uri)
        if self.load_model and checked.clean and checked.plan is not None and checked.plan.model is not None:
            self._queue(uri, text, file, folder, again)

    def forget(self, uri: str) -> None:
        self.open_documents.discard(uri)
        waiting = self._settling.pop(uri, None)
        if waiting is not None:
            waiting.cancel()
        self.checked.pop(uri, None)
        self.last_parsed.pop(uri, None)
        self.model_replies.pop(uri, None)
        with self._lock:
            self._wanted.pop(uri, None)
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    def publish(self, uri: str) -> None:
        if uri not in self.checked:
            return
        text, checked = self.checked[uri]
        found = list(checked.diagnostics)
        reply = self.model_reply(uri, text)
        if reply is not None:
            found.extend(d for d in self._model_diagnostics(checked, reply) if d not in found)
        lines = lines_of(text)
        diagnostics = [self._to_lsp(d, uri, lines) for d in found]
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics))

    def model_reply(self, uri: str, text: str) -> dict | None:
        """The model process's reply for exactly this text, if there is one."""
        found = self.model_replies.get(uri)
        return found[1] if found is not None and found[0] == text else None

    def _model_diagnostics(self, checked: Checked, reply: dict) -> list[Diagnostic]:
        if "error" in reply:
            span = checked.plan.model.span if checked.plan is not None and checked.plan.model else None
            return [
                Diagnostic(
                    "MP520",
                    f"the model could not be loaded for the editor: {reply['error']}",
                    span,
                    "`memoplan check` on this plan shows what loading it does from the command line",
                    Severity.WARNING,
                )
            ]
        return [diagnostic_from_json(d) for d in reply.get("diagnostics", [])]

    def _to_lsp(self, diagnostic: Diagnostic, uri: str, lines: list[str]) -> lsp.Diagnostic:
        start, end = span_range(diagnostic.span, lines, self.encoding)
        related = []
        for label, span in diagnostic.notes:
            if span is not None and diagnostic.span is not None and span.file == diagnostic.span.file:
                note_start, note_end = span_range(span, lines, self.encoding)
                related.append(
                    lsp.DiagnosticRelatedInformation(
                        location=lsp.Location(uri=uri, range=_range(note_start, note_end)), message=label
                    )
                )
        message = diagnostic.message + (f"\nhelp: {diagnostic.help}" if diagnostic.help else "")
        return lsp.Diagnostic(
            range=_range(start, end),
            message=message,
            severity=_SEVERITY[diagnostic.severity],
            code=diagnostic.code,
            source="memoplan",
            related_information=related or None,
        )

    # ------------------------------------------------------------ the model, off the typing path

    def _queue(self, uri: str, text: str, file: str, folder: str, again: bool = False) -> None:
        with self._lock:
            self._wanted[uri] = (text, file, folder)
            if again:
                self._again.add(uri)
            if uri in self._running:
                return  # the running loop picks the newest text up when it is done
            self._running.add(uri)
        self._background.submit(self._resolve_loop, uri)

    def _resolve_loop(self, uri: str) -> None:
        while True:
            with self._lock:
                wanted = self._wanted.get(uri)
                done = self.model_replies.get(uri)
                if wanted is None or (done is not None and done[0] == wanted[0] and uri not in self._again):
                    self._running.discard(uri)
                    return
                self._again.discard(uri)
            text, file, folder = wanted
            if self.worker is None:
                self.worker = ModelWorker(self.model_timeout)
            try:
                reply = self.worker.analyse(text, file, folder)
            except Exception as exc:  # the process could not be started, or a bug: said, not fatal
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            with self._lock:
                self.model_replies[uri] = (text, reply)
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.publish, uri)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        self._background.shutdown(wait=False, cancel_futures=True)
        self._checking.shutdown(wait=False, cancel_futures=True)
        self._effects.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ positions

    def lines(self, uri: str) -> tuple[str, list[str]]:
        text = self.workspace.get_text_document(uri).source
        return text, lines_of(text)

    def too_large(self, uri: str) -> bool:
        """A document over MAX_DOCUMENT, or one the editor has not opened: hover, completion and
        formatting leave it alone (an unopened one is not read from disk: it may be anything)."""
        if uri not in self.open_documents:
            return True
        return len(self.workspace.get_text_document(uri).source) > MAX_DOCUMENT


def _file_and_folder(uri: str, root: str | None) -> tuple[str, str]:
    """The file name diagnostics carry and the folder a model spec is relative to."""
    path = to_fs_path(uri) if uri.startswith("file:") else None
    if path:
        return path, str(Path(path).parent)
    return uri, root or os.getcwd()


def _range(start: tuple[int, int], end: tuple[int, int]) -> lsp.Range:
    return lsp.Range(
        start=lsp.Position(line=start[0], character=start[1]), end=lsp.Position(line=end[0], character=end[1])
    )


def _safely(check, *args) -> Checked:
    """A check of the document, and a bug in memoplan said in the editor rather than taking the server down."""
    try:
        return check(*args)
    except Exception as exc:
        return Checked(None, (_internal(exc),))


def _warm_up(ls: PlanServer, loop: asyncio.AbstractEventLoop) -> None:
    parse_text("memplan 1\n", "<warm-up>")
    try:
        importlib.import_module("memoplan.resolver.effects")
    except ModuleNotFoundError as exc:
        from memoplan.needs_torch import hint, is_missing_torch

        if not is_missing_torch(exc):
            raise
        # Installed without torch: syntax and value diagnostics, hover, completion and
        # formatting work; the editor says once what the rest needs.
        text = "memoplan lsp: " + hint("checking plan-wide statements and loading the model")
        message = lsp.ShowMessageParams(type=lsp.MessageType.Info, message=text)
        loop.call_soon_threadsafe(ls.window_show_message, message)


def _effects_ready() -> bool:
    """Whether the statement checks (and torch) are imported, so that they answer at once."""
    return "memoplan.resolver.effects" in sys.modules


# The largest document the server checks, in characters: `memoplan check`'s limit (MP109).
MAX_DOCUMENT = MAX_PLAN_BYTES


def _too_large(size: int) -> Diagnostic:
    return Diagnostic(
        "MP522",
        f"this document is too large for memoplan: {size:,} characters, over the limit of {MAX_DOCUMENT:,} "
        "(the limit of `memoplan check`); it is not checked, and hover, completion and formatting are off",
        None,
        "split the plan, or cover many modules with one wildcard rule",
        Severity.ERROR,
    )


def _internal(exc: BaseException) -> Diagnostic:
    return Diagnostic(
        "MP521",
        f"memoplan could not check this document: {type(exc).__name__}: {exc}",
        None,
        "this is a bug in memoplan; `memoplan check` on the file may say more",
        Severity.WARNING,
    )


def _editor_text(lines: list[str]) -> str:
    """The document as the hover and completion code reads it: ``\\n`` line ends, no BOM
    (replaced by a space so that columns stay where they are)."""
    text = "\n".join(lines)
    return " " + text[1:] if text.startswith(BOM) else text


server = PlanServer()


@server.feature(lsp.INITIALIZE)
def _initialize(ls: PlanServer, params: lsp.InitializeParams) -> None:
    options = params.initialization_options if isinstance(params.initialization_options, dict) else {}
    ls.load_model = bool(options.get("loadModel", False))
    timeout = options.get("modelTimeout")
    if isinstance(timeout, (int, float)) and timeout > 0:
        ls.model_timeout = float(timeout)


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def _did_open(ls: PlanServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.open_documents.add(params.text_document.uri)
    ls.refresh(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def _did_change(ls: PlanServer, params: lsp.DidChangeTextDocumentParams) -> None:
    ls.refresh(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def _did_save(ls: PlanServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.refresh(params.text_document.uri, again=True)  # a model file saved meanwhile is picked up here


@server.feature(lsp.INITIALIZED)
async def _initialized(ls: PlanServer, params: lsp.InitializedParams) -> None:
    """With the model loaded, ask the editor to say when a Python file changes (where it can)."""
    # Build the parser, then import the statement checks (and torch), while the editor opens
    # its first document: the first diagnostics need only the parser.
    loop = asyncio.get_running_loop()
    threading.Thread(target=_warm_up, args=(ls, loop), daemon=True, name="memoplan-warm-up").start()
    workspace = ls.client_capabilities.workspace
    watching = workspace.did_change_watched_files if workspace is not None else None
    if not ls.load_model or watching is None or not watching.dynamic_registration:
        return
    watcher = lsp.FileSystemWatcher(glob_pattern="**/*.py")
    registration = lsp.Registration(
        id="memoplan-model-files",
        method=lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES,
        register_options=lsp.DidChangeWatchedFilesRegistrationOptions(watchers=[watcher]),
    )
    try:
        await ls.client_register_capability_async(lsp.RegistrationParams(registrations=[registration]))
    except Exception:  # an editor that refuses: saving the plan still picks a changed model up
        pass


@server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def _watched_files_changed(ls: PlanServer, params: lsp.DidChangeWatchedFilesParams) -> None:
    for uri in list(ls.checked):
        ls.refresh(uri, again=True)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def _did_close(ls: PlanServer, params: lsp.DidCloseTextDocumentParams) -> None:
    ls.forget(params.text_document.uri)


@server.feature(lsp.SHUTDOWN)
def _shutdown(ls: PlanServer, params) -> None:
    ls.close()


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def _hover(ls: PlanServer, params: lsp.HoverParams) -> lsp.Hover | None:
    """Hover from this text's parse.  While the text does not parse: from the last text that did
    (the line under the cursor found there unchanged), else from a rule's first line parsed on
    its own, so that selectors still answer mid-edit."""
    uri = params.text_document.uri
    if ls.too_large(uri):
        return None
    text, lines = ls.lines(uri)
    line = params.position.line
    if not 0 <= line < len(lines):
        return None
    column = from_units(lines[line], params.position.character, ls.encoding)
    checked = ls.checked.get(uri)
    plan = checked[1].parsed if checked is not None and checked[0] == text else None
    shown_text, shown_line, source = text, line, ""
    if plan is None and uri in ls.last_parsed and ls.last_parsed[uri][0] != text:
        old_text, old_plan = ls.last_parsed[uri]
        old_line = _same_line(lines_of(old_text), lines, line)
        if old_line is not None:
            shown_text, shown_line, plan = old_text, old_line, old_plan
            checked = checked if checked is not None and checked[0] == old_text else None
            source = "the last version of this plan that parsed"
    if plan is None and (alone := _rule_line_alone(lines[line], line, column)) is not None:
        shown_text, shown_line, plan, checked = alone, line, _parsed(alone), None
        source = "this line alone: the plan does not parse"
    reply = ls.model_reply(uri, shown_text)
    state = _hover_state(ls, plan, checked, reply)
    if source:
        state = f"(From {source}.) {state}"
    try:
        found = hover_at(_editor_text(lines_of(shown_text)), shown_line, column, plan, reply, state)
    except Exception:  # never let a hover take the server down
        return None
    if found is None:
        return None
    start = to_units(lines[line], found.start, ls.encoding)
    end = to_units(lines[line], found.end, ls.encoding)
    return lsp.Hover(
        contents=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=found.markdown),
        range=_range((line, start), (line, end)),
    )


def _hover_state(ls: PlanServer, plan: ast.Plan | None, checked: tuple[str, Checked] | None, reply: dict | None) -> str:
    """What a selector's hover says instead of its modules, when it cannot show them."""
    if not ls.load_model:
        return "The model is not loaded: start the server with the initialization option `loadModel` to see the modules this selects."
    if plan is None or plan.model is None:
        return 'The plan names no model (`model "pkg.module:factory"`).'
    if checked is None or not checked[1].clean:
        return "The plan has errors: once they are fixed, the modules this selects are shown here."
    if reply is None:
        return "The model is loading…"
    if "error" in reply:
        return f"The model could not be loaded: {reply['error']}"
    if not reply.get("modules"):
        return "The model could not be built: see the diagnostic at the `model` line."
    return ""


_RULE_HEAD = re.compile(r"\s*module\s[^{#]*\{")


def _rule_line_alone(line: str, index: int, column: int) -> str | None:
    """A rule's first line on its own (``module SELECTOR {``, at its line and columns) as a plan
    that parses, for a hover on its selector when the document does not parse and never did
    (``None`` when ``column`` is past the ``{``: the rest of the line is not this text's)."""
    head = _RULE_HEAD.match(line)
    if head is None or index < 1 or column >= head.end():
        return None
    text = "memplan 1" + "\n" * index + f"{head.group(0)} keep }}\n"
    plan = _parsed(text)
    return text if plan is not None and plan.rules else None


def _parsed(text: str) -> ast.Plan | None:
    from memoplan.syntax import parse_with_diagnostics

    return parse_with_diagnostics(text, "<hover>")[0]


def _same_line(old: list[str], new: list[str], line: int) -> int | None:
    """The line of ``old`` that line ``line`` of ``new`` was, if the edit left it unchanged."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for old_start, new_start, size in matcher.get_matching_blocks():
        if new_start <= line < new_start + size:
            return old_start + line - new_start
    return None


@server.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=[".", ":", "="]))
def _completion(ls: PlanServer, params: lsp.CompletionParams) -> lsp.CompletionList:
    uri = params.text_document.uri
    if ls.too_large(uri):
        return lsp.CompletionList(is_incomplete=False, items=[])
    text, lines = ls.lines(uri)
    line = min(max(params.position.line, 0), len(lines) - 1)
    column = from_units(lines[line], params.position.character, ls.encoding)
    offset = sum(len(t) + 1 for t in lines[:line]) + column
    reply = ls.model_replies.get(uri)  # the last one: paths and classes of the model do not change with typing
    model = reply[1] if reply is not None and "error" not in reply[1] else None
    try:
        found = completions(_editor_text(lines), offset, model)
    except Exception:
        found = []
    items = []
    incomplete = len(found) > MAX_COMPLETIONS  # a big model: the editor asks again as the word grows
    for item in found[:MAX_COMPLETIONS]:
        start = to_units(lines[line], column - item.replace, ls.encoding)
        edit = lsp.TextEdit(
            range=_range((line, start), (line, to_units(lines[line], column, ls.encoding))),
            new_text=item.insert or item.label,
        )
        items.append(
            lsp.CompletionItem(
                label=item.label,
                kind=_KINDS.get(item.kind),
                detail=item.detail or None,
                documentation=lsp.MarkupContent(kind=lsp.MarkupKind.Markdown, value=item.documentation)
                if item.documentation
                else None,
                text_edit=edit,
                filter_text=item.label,
            )
        )
    return lsp.CompletionList(is_incomplete=incomplete, items=items)


@server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
def _formatting(ls: PlanServer, params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit] | None:
    """The canonical form (``memoplan fmt``) as one edit; nothing for a plan with errors."""
    from memoplan.syntax import format_plan, parse_with_diagnostics

    if ls.too_large(params.text_document.uri):
        return None
    text, lines = ls.lines(params.text_document.uri)
    try:
        plan, diagnostics = parse_with_diagnostics(text)
        if plan is None or any(d.is_error for d in diagnostics):
            return None
        formatted = format_plan(plan)
    except Exception:
        return None
    if text.startswith(BOM):
        formatted = BOM + formatted
    if formatted == text:
        return []
    end = (len(lines) - 1, units(lines[-1], ls.encoding))
    return [lsp.TextEdit(range=_range((0, 0), end), new_text=formatted)]


def serve() -> int:
    """Run the server on stdin and stdout until the editor ends it.

    The process then ends at once, with the protocol's exit code (0 after a shutdown request):
    a background import of torch, or a check waiting for it, must not hold the editor up.
    """
    code = 0
    try:
        server.start_io()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # the protocol may have closed standard output
            stream.flush()
    os._exit(code)
