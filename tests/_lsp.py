"""A language-server session for tests: `memoplan lsp` in a subprocess, driven by pygls's client.

The client's event loop runs in a thread of its own, so tests stay plain functions: each call
sends a message and waits for its answer; diagnostics the server publishes are collected per
document.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

from _paths import ROOT
from lsprotocol import types as lsp
from pygls.lsp.client import LanguageClient


class Session:
    def __init__(
        self,
        options: dict | None = None,
        cwd: Path = ROOT,
        watch_files: bool = False,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``command``: how to start the server (default: this Python's ``-m memoplan.cli lsp``)."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.published: dict[str, list[list[lsp.Diagnostic]]] = {}
        self.versions: dict[str, int] = {}
        self.texts: dict[str, str] = {}
        self.registrations: list[lsp.Registration] = []
        self.messages: list[lsp.ShowMessageParams] = []  # window/showMessage, in order
        self.command = command or [sys.executable, "-m", "memoplan.cli", "lsp"]
        self.env = env
        self.client = self.run(self._start(options or {}, cwd, watch_files))

    async def _start(self, options: dict, cwd: Path, watch_files: bool) -> LanguageClient:
        client = LanguageClient("memoplan-tests", "1")

        @client.feature(lsp.CLIENT_REGISTER_CAPABILITY)
        def _register(params: lsp.RegistrationParams) -> None:
            self.registrations.extend(params.registrations)

        @client.feature(lsp.WINDOW_SHOW_MESSAGE)
        def _message(params: lsp.ShowMessageParams) -> None:
            self.messages.append(params)

        @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def _published(params: lsp.PublishDiagnosticsParams) -> None:
            self.published.setdefault(params.uri, []).append(params.diagnostics)

        await client.start_io(*self.command, cwd=str(cwd), env=self.env)
        self.initialized = await client.initialize_async(
            lsp.InitializeParams(
                capabilities=lsp.ClientCapabilities(
                    workspace=lsp.WorkspaceClientCapabilities(
                        did_change_watched_files=lsp.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)
                    )
                    if watch_files
                    else None
                ),
                root_uri=cwd.as_uri(),
                initialization_options=options,
            )
        )
        client.initialized(lsp.InitializedParams())
        return client

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def notify(self, send, params) -> None:
        async def call():
            send(params)

        self.run(call())

    # ------------------------------------------------------------ documents

    def open(self, uri: str, text: str) -> int:
        """Open (or reopen) a document; returns how many publishes came before, for ``diagnostics``."""
        before = len(self.published.get(uri, []))
        self.versions[uri] = 1
        self.texts[uri] = text
        self.notify(
            self.client.text_document_did_open,
            lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="memplan", version=1, text=text)),
        )
        return before

    def change(self, uri: str, text: str) -> int:
        before = len(self.published.get(uri, []))
        self.versions[uri] += 1
        self.texts[uri] = text
        self.notify(
            self.client.text_document_did_change,
            lsp.DidChangeTextDocumentParams(
                lsp.VersionedTextDocumentIdentifier(version=self.versions[uri], uri=uri),
                [lsp.TextDocumentContentChangeWholeDocument(text=text)],
            ),
        )
        return before

    def save(self, uri: str) -> int:
        before = len(self.published.get(uri, []))
        self.notify(self.client.text_document_did_save, lsp.DidSaveTextDocumentParams(lsp.TextDocumentIdentifier(uri)))
        return before

    def files_changed(self, *uris: str) -> None:
        changes = [lsp.FileEvent(uri=uri, type=lsp.FileChangeType.Changed) for uri in uris]
        self.notify(self.client.workspace_did_change_watched_files, lsp.DidChangeWatchedFilesParams(changes=changes))

    def close_document(self, uri: str) -> None:
        self.notify(
            self.client.text_document_did_close, lsp.DidCloseTextDocumentParams(lsp.TextDocumentIdentifier(uri))
        )

    def diagnostics(self, uri: str, after: int, until=None, timeout: float = 60) -> list[lsp.Diagnostic]:
        """The first diagnostics published for ``uri`` after publish number ``after`` that satisfy
        ``until`` (default: any)."""
        deadline = time.monotonic() + timeout
        seen = after
        while time.monotonic() < deadline:
            found = self.published.get(uri, [])
            while seen < len(found):
                diagnostics = found[seen]
                seen += 1
                if until is None or until(diagnostics):
                    return diagnostics
            time.sleep(0.02)
        raise TimeoutError(f"no diagnostics for {uri} after publish {after}: {self.published.get(uri, [])[after:]}")

    # ------------------------------------------------------------ requests

    def hover(self, uri: str, line: int, character: int) -> lsp.Hover | None:
        params = lsp.HoverParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=line, character=character)
        )
        return self.run(self.client.text_document_hover_async(params))

    def complete(self, uri: str, line: int, character: int) -> list[lsp.CompletionItem]:
        return list(self.completion_list(uri, line, character).items)

    def completion_list(self, uri: str, line: int, character: int) -> lsp.CompletionList:
        params = lsp.CompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri), position=lsp.Position(line=line, character=character)
        )
        found = self.run(self.client.text_document_completion_async(params))
        if isinstance(found, lsp.CompletionList):
            return found
        return lsp.CompletionList(is_incomplete=False, items=list(found or []))

    def format(self, uri: str) -> list[lsp.TextEdit] | None:
        params = lsp.DocumentFormattingParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            options=lsp.FormattingOptions(tab_size=4, insert_spaces=True),
        )
        return self.run(self.client.text_document_formatting_async(params))

    def stop(self) -> int | None:
        async def finish():
            await self.client.shutdown_async(None)
            self.client.exit(None)
            await self.client.stop()
            return self.client._server.returncode if self.client._server else None

        try:
            return self.run(finish(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)


def apply_edits(text: str, edits: list[lsp.TextEdit]) -> str:
    """``text`` with whole-line-range edits applied (positions in UTF-16, as the server sends them)."""
    lines = text.split("\n")
    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        start, end = edit.range.start, edit.range.end
        head = _offset(lines, start.line, start.character)
        tail = _offset(lines, end.line, end.character)
        joined = "\n".join(lines)
        joined = joined[:head] + edit.new_text + joined[tail:]
        lines = joined.split("\n")
    return "\n".join(lines)


def _offset(lines: list[str], line: int, units: int) -> int:
    text = lines[line]
    count = 0
    column = 0
    while column < len(text) and count < units:
        count += 2 if ord(text[column]) > 0xFFFF else 1
        column += 1
    return sum(len(t) + 1 for t in lines[:line]) + column
