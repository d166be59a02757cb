"""How long `memoplan lsp` takes to answer an edit with diagnostics, hover and completion.

    .venv/bin/python tools/lsp_latency.py [--rules N] [--edits K]
    .venv/bin/python tools/lsp_latency.py --first [--runs R] [--busy B]

Starts the server over stdio with pygls's client, opens plans/spiking.memplan and a generated
plan of N rules (default 1000), and for each makes K edits (default 20), each one character
that breaks or fixes the last policy, timing every edit until its diagnostics are published, and
then K hovers and completions.  Prints the median and the largest time of each, in ms.  Model
loading is off: this is the typing path.

``--first``: R times (default 5), start a fresh server, initialize it and open a plan with a
syntax error, timing from the open until its diagnostics are published (what an editor shows
first; the server answers it with the parser alone while torch is still being imported), and
from the process's start.  Prints the median and the largest of each.

``--busy B``: B processes spinning on a core each for the whole measurement (an editor beside a
test run or a training job), and the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]


WARM_UP = "memplan 1\nmodule fc { keep }\nbudget 50%\n"


def generated(rules: int) -> str:
    lines = ["memplan 1", ""]
    for i in range(rules):
        lines.append(f"module blocks.{i}.layer[0:4] : Block not class Identity {{ checkpoint segments = 2 }}")
    return "\n".join(lines) + "\n"


async def measure(name: str, text: str, edits: int) -> None:
    client = LanguageClient("latency", "1")
    published: asyncio.Queue = asyncio.Queue()

    warm = (ROOT / "build" / "latency-warm-up.memplan").as_uri()
    noted = asyncio.Event()

    @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def _published(params: lsp.PublishDiagnosticsParams) -> None:
        if params.uri != warm:
            published.put_nowait(time.perf_counter())
        elif any(d.code == "MP224" for d in params.diagnostics):
            noted.set()

    await client.start_io(sys.executable, "-m", "memoplan.cli", "lsp", cwd=str(ROOT))
    await client.initialize_async(lsp.InitializeParams(capabilities=lsp.ClientCapabilities()))
    client.initialized(lsp.InitializedParams())
    # Wait until the statement checks are loaded (a budget's MP224 note comes from them), so that
    # each edit below is answered by one publication (before that, a plan without errors is
    # published twice: first as the parser sees it).
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=warm, language_id="memplan", version=1, text=WARM_UP))
    )
    await asyncio.wait_for(noted.wait(), 300)
    uri = (ROOT / "build" / f"latency-{name}.memplan").as_uri()
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="memplan", version=1, text=text))
    )
    await published.get()  # the first check of this document: not counted
    lines = text.rstrip("\n").split("\n")
    # the last line with a policy: each edit misspells its policy, or puts it back
    last = max(i for i, line in enumerate(lines) if any(w in line for w in ("checkpoint", "compress", "keep")))
    word = next(w for w in ("checkpoint", "compress", "keep") if w in lines[last])
    original = lines[last]
    times = []
    for version in range(2, edits + 2):
        broken = version % 2 == 0
        change = original.replace(word, word[:-1] + "x") if broken else original
        started = time.perf_counter()
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                text_document=lsp.VersionedTextDocumentIdentifier(version=version, uri=uri),
                content_changes=[
                    lsp.TextDocumentContentChangePartial(
                        range=lsp.Range(
                            start=lsp.Position(line=last, character=0),
                            end=lsp.Position(line=last, character=len(lines[last])),
                        ),
                        text=change,
                    )
                ],
            )
        )
        finished = await published.get()
        times.append((finished - started) * 1000)
        lines[last] = change
    hovers, completions = [], []
    selector = max(i for i, line in enumerate(lines) if line.startswith("module "))
    position = lsp.Position(line=selector, character=len("module ") + 1)  # on the last rule's selector
    for _ in range(edits):
        started = time.perf_counter()
        await client.text_document_hover_async(
            lsp.HoverParams(text_document=lsp.TextDocumentIdentifier(uri=uri), position=position)
        )
        hovers.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await client.text_document_completion_async(
            lsp.CompletionParams(text_document=lsp.TextDocumentIdentifier(uri=uri), position=position)
        )
        completions.append((time.perf_counter() - started) * 1000)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    for what, found in (("edit -> diagnostics", times), ("hover", hovers), ("completion", completions)):
        print(f"{name:>24}  {what:<20} median {statistics.median(found):7.1f} ms   max {max(found):7.1f} ms")


BROKEN = "memplan 1\n\nmodule blocks.* {\n    checkpoint\n"  # the closing brace not typed yet


async def first_diagnostics(command: list[str] | None = None, env: dict | None = None) -> tuple[float, float]:
    """(seconds from didOpen, seconds from starting the process) until the first diagnostics."""
    client = LanguageClient("latency", "1")
    published: asyncio.Queue = asyncio.Queue()

    @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def _published(params: lsp.PublishDiagnosticsParams) -> None:
        published.put_nowait((time.perf_counter(), params.diagnostics))

    command = command or [sys.executable, "-m", "memoplan.cli", "lsp"]
    launched = time.perf_counter()
    await client.start_io(*command, cwd=str(ROOT), env=env)
    await client.initialize_async(lsp.InitializeParams(capabilities=lsp.ClientCapabilities()))
    client.initialized(lsp.InitializedParams())
    uri = (ROOT / "build" / "latency-first.memplan").as_uri()
    opened = time.perf_counter()
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri=uri, language_id="memplan", version=1, text=BROKEN))
    )
    finished, diagnostics = await asyncio.wait_for(published.get(), 60)
    assert diagnostics and diagnostics[0].code == "MP106", diagnostics
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return finished - opened, finished - launched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--first", action="store_true", help="time the first diagnostics of fresh servers")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core each meanwhile")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        for _ in range(args.busy):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            stack.callback(spinner.wait)
            stack.callback(spinner.kill)
        print(f"load average before: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores, {args.busy} busy processes)")
        code = _run(args)
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    return code


def _run(args: argparse.Namespace) -> int:
    if args.first:
        runs = [asyncio.run(first_diagnostics()) for _ in range(args.runs)]
        for what, found in (
            ("didOpen -> diagnostics", [r[0] for r in runs]),
            ("start -> diagnostics", [r[1] for r in runs]),
        ):
            found_ms = [t * 1000 for t in found]
            print(
                f"first diagnostics  {what:<24} median {statistics.median(found_ms):7.1f} ms   max {max(found_ms):7.1f} ms   ({args.runs} fresh servers)"
            )
        return 0
    spiking = (ROOT / "plans" / "spiking.memplan").read_text(encoding="utf-8")
    asyncio.run(measure("plans/spiking.memplan", spiking, args.edits))
    asyncio.run(measure(f"{args.rules} rules", generated(args.rules), args.edits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
