"""Every request to the language server gets a response (issue 39, item 8).

pygls dropped a request whose params did not fit its method (a hover without a position) and
every request after ``shutdown``: the editor waited for ever.  Raw JSON-RPC over the server's
pipes, so the test sees exactly what the server sends (pygls's client would refuse to send
malformed params).  Hover, completion and formatting of a document the editor has not opened
answer nothing, without reading that path from disk.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest
from _paths import ROOT

INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND = -32602, -32600, -32601


class Raw:
    """The server over its pipes: send a message, read the next one with a deadline."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "memoplan.cli", "lsp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
        )
        self.buffer = b""

    def send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        self.process.stdin.flush()

    def _next(self, deadline: float) -> dict | None:
        assert self.process.stdout is not None
        while True:
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if found:
                length = next(
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                )
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    return json.loads(rest[:length])
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk

    def reply(self, msg_id: int, timeout: float = 30) -> dict | None:
        """The response to request ``msg_id`` (notifications the server sends meanwhile skipped)."""
        deadline = time.monotonic() + timeout
        while (message := self._next(deadline)) is not None:
            if message.get("id") == msg_id and "method" not in message:
                return message
        return None

    def request(self, msg_id: int, method: str, params=None) -> dict | None:
        self.send({"id": msg_id, "method": method, **({} if params is None else {"params": params})})
        return self.reply(msg_id)


@pytest.fixture
def raw():
    server = Raw()
    assert server.request(1, "initialize", {"capabilities": {}}) is not None
    server.send({"method": "initialized", "params": {}})
    yield server
    server.process.kill()
    server.process.wait()


def _error(reply: dict | None) -> int:
    assert reply is not None, "no response"
    assert "error" in reply, reply
    return reply["error"]["code"]


def _at(document: dict, line: int, character: int) -> dict:
    return {**document, "position": {"line": line, "character": character}}


def _result(reply: dict | None):
    assert reply is not None and "error" not in reply, reply
    return reply["result"]


@pytest.mark.slow  # a server's start: about 2 s
def test_every_request_gets_a_response(raw, tmp_path) -> None:
    # A document the editor has not opened: nothing, and its path is not read.
    unopened = tmp_path / "secret.memplan"
    unopened.write_text("memplan 1\nmodule a { checkpoint }\n", encoding="utf-8")
    document = {"textDocument": {"uri": unopened.as_uri()}}
    assert _result(raw.request(2, "textDocument/hover", _at(document, 1, 13))) is None
    options = {"tabSize": 4, "insertSpaces": True}
    assert _result(raw.request(3, "textDocument/formatting", {**document, "options": options})) is None
    missing = {"textDocument": {"uri": (tmp_path / "missing.memplan").as_uri()}}
    assert _result(raw.request(4, "textDocument/hover", _at(missing, 0, 0))) is None  # was InternalError
    # Params that do not fit the method, and a method that does not exist.
    document = {"textDocument": {"uri": (tmp_path / "p.memplan").as_uri()}}
    assert _error(raw.request(5, "textDocument/hover", document)) == INVALID_PARAMS  # no position
    bad = {**document, "position": {"line": -1, "character": "x"}}
    assert _error(raw.request(6, "textDocument/hover", bad)) == INVALID_PARAMS
    assert _error(raw.request(7, "textDocument/completion", {"position": 3})) == INVALID_PARAMS
    assert _error(raw.request(8, "no/such/method")) == METHOD_NOT_FOUND
    # A well-formed request still works after those.
    text = "memplan 1\nmodule a { checkpoint }\n"
    opened = {**document["textDocument"], "languageId": "memplan", "version": 1, "text": text}
    raw.send({"method": "textDocument/didOpen", "params": {"textDocument": opened}})
    assert "checkpoint" in json.dumps(_result(raw.request(9, "textDocument/hover", _at(document, 1, 13))))
    # After shutdown: InvalidRequest for every request, shutdown included; exit ends the process.
    assert _result(raw.request(10, "shutdown")) is None
    assert _error(raw.request(11, "textDocument/hover", _at(document, 1, 13))) == INVALID_REQUEST
    assert _error(raw.request(12, "shutdown")) == INVALID_REQUEST
    assert _error(raw.request(13, "no/such/method")) == INVALID_REQUEST
    raw.send({"method": "exit"})
    assert raw.process.wait(timeout=30) == 0
