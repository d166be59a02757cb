"""`memoplan lsp` over stdio, driven by pygls's client: diagnostics with the ranges and codes of
`memoplan check`, hover, completion and formatting; broken documents never take the server down.

One server for the whole module (model loading off, the default); tests/lsp/test_lsp_model.py
runs one with the model loaded.
"""

from __future__ import annotations

import pytest
from lsprotocol import types as lsp

from memoplan.lsp.analysis import check_text, lines_of, span_range
from memoplan.lsp.reference import reference
from memoplan.syntax import format_plan, parse
from tests._lsp import ROOT, Session, apply_edits

URI = (ROOT / "build" / "lsp-test.memplan").as_uri()
FILE = str(ROOT / "build" / "lsp-test.memplan")


@pytest.fixture(scope="module")
def server():
    session = Session()
    yield session
    assert session.stop() == 0  # shut down cleanly when asked, after everything below


def _open(server: Session, text: str, uri: str = URI) -> list[lsp.Diagnostic]:
    return server.diagnostics(uri, server.open(uri, text))


def _simple(diagnostics) -> list[tuple]:
    return [
        (d.code, d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character)
        for d in diagnostics
    ]


BROKEN = """memplan 1
module layer1.* {
    checkpointing
}
dtr { evicton_threshold = 1 GiB }
module fc { checkpoint segments = 0 }
budget 4 gib
"""


def test_server_announces_its_features(server) -> None:
    capabilities = server.initialized.capabilities
    assert capabilities.hover_provider
    assert capabilities.document_formatting_provider
    assert capabilities.completion_provider is not None
    assert server.initialized.server_info.name == "memoplan"


def test_every_check_diagnostic_with_its_range_and_code(server) -> None:
    found = _open(server, BROKEN)
    assert _simple(found) == [
        ("MP102", 2, 4, 2, 17),  # `checkpointing`
        ("MP201", 4, 6, 4, 31),  # `evicton_threshold = 1 GiB`
        ("MP203", 5, 23, 5, 35),  # `segments = 0`
        ("MP100", 6, 9, 6, 12),  # `gib`
    ]
    # The same diagnostics, in the same places, as `memoplan check` reports them.
    expected = check_text(BROKEN, FILE).diagnostics
    lines = lines_of(BROKEN)
    assert [(d.code, span_range(d.span, lines)) for d in expected] == [
        (d.code, ((d.range.start.line, d.range.start.character), (d.range.end.line, d.range.end.character)))
        for d in found
    ]
    first = found[0]
    assert first.severity == lsp.DiagnosticSeverity.Error
    assert first.source == "memoplan"
    assert first.message.startswith("unknown policy `checkpointing`")
    assert "help: did you mean `checkpoint`?" in first.message
    assert "did you mean `GiB`" in found[3].message or "`GiB`" in found[3].message


@pytest.mark.slow
def test_notes_and_refusals_of_a_clean_plan(server) -> None:
    text = "memplan 1\nmodule fc { keep }\nbudget 50%\nmemory {\n    static_memory_policy = 2\n}\n"
    expected = check_text(text, FILE).diagnostics  # what `memoplan check` prints about this plan
    # The parser's diagnostics (none here) may come first, while torch is still being imported;
    # the statement checks' follow.
    found = server.diagnostics(URI, server.open(URI, text), until=lambda found: found)
    assert [d.code for d in found] == [d.code for d in expected]
    severities = {d.code: d.severity for d in found}
    assert severities["MP224"] == lsp.DiagnosticSeverity.Information  # a note: where the budget is measured
    assert severities["MP227"] == lsp.DiagnosticSeverity.Error  # policy 2 needs a budget in bytes
    (mp227,) = [d for d in found if d.code == "MP227"]
    assert (mp227.range.start.line, mp227.range.start.character) == (4, 4)


def test_related_locations_of_a_diagnostic(server) -> None:
    text = 'memplan 1\nmodule fc { keep }\nmodel "a:b"\nmodel "c:d"\n'
    (found,) = _open(server, text)
    assert found.code == "MP208"
    (note,) = found.related_information
    assert note.message == "first given"
    assert note.location.uri == URI
    assert note.location.range.start.line == 2


def test_columns_count_utf16_code_units(server) -> None:
    # `😀` is one character and two UTF-16 units: the range after it moves by two.
    text = 'memplan 1\nmodule "😀".a { checkpointing }\n'
    (found,) = _open(server, text)
    assert found.code == "MP102"
    start = text.split("\n")[1].index("checkpointing")
    assert (found.range.start.character, found.range.end.character) == (start + 1, start + 1 + len("checkpointing"))


def test_fixing_the_document_clears_its_diagnostics(server) -> None:
    uri = URI.replace("lsp-test", "lsp-fix")
    assert _open(server, "memplan 1\nmodule fc { kep }\n", uri)[0].code == "MP102"
    assert list(server.diagnostics(uri, server.change(uri, "memplan 1\nmodule fc { keep }\n"))) == []
    server.close_document(uri)


HOSTILE = [
    "",
    "\ufeff",
    "memplan",
    "memplan 1\nmodule {",
    "memplan 1\nmodule a { checkpoint segments = \n",
    "memplan 1\n" + "module a { " * 200,
    "memplan 1\n" + "[" * 500 + "\n",
    'memplan 1\nmodel "\\x"\nexample randn(99999999999, 99999999999)\n',
    "memplan 1\nmodule a\x00b { keep }\n\x1b[31m",
    "memplan 1\r\nmodule a { keep }\rmodule b { keep }\n",
    "memplan 1\nbudget 1e999 GiB\ndtr { eviction_threshold = -1 GiB; x = [[1]] }\n",
    "memplan 1\nmodule \ud800 { keep }\n",
    "memplan 2\n}}}}\n{{{{",
    "\n\n\n# only comments\n",
]


@pytest.mark.parametrize("text", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_broken_document_never_crashes_the_server(server, text: str) -> None:
    uri = URI.replace("lsp-test", "lsp-hostile")
    found = _open(server, text, uri)
    assert all(d.code and d.code.startswith("MP") for d in found)
    assert not any(d.code == "MP521" for d in found)  # no internal error either
    lines = text.split("\n")
    for line in range(len(lines) + 1):
        for character in (0, 1, 5, 10_000):
            server.hover(uri, line, character)
            server.complete(uri, line, character)
    edits = server.format(uri)
    assert edits is None or all(isinstance(edit, lsp.TextEdit) for edit in edits)
    # still serving, and the document is read afresh
    assert list(server.diagnostics(uri, server.change(uri, "memplan 1\nmodule fc { keep }\n"))) == []
    assert "Never recompute" in server.hover(uri, 1, 13).contents.value


def test_hover_on_a_key_shows_its_row_of_the_reference(server) -> None:
    text = "memplan 1\ndtr {\n    evictee_minimum_size = 1 MiB\n}\n"
    _open(server, text)
    hover = server.hover(URI, 2, 8)
    value = hover.contents.value
    row = dict(reference().row("dtr", "evictee_minimum_size").cells)
    assert "`evictee_minimum_size`" in value and "`dtr` block" in value
    assert row["meaning"] in value
    assert (
        f"type: {row['type']}" in value and f"range: {row['range']}" in value and f"default: {row['default']}" in value
    )
    assert (hover.range.start.line, hover.range.start.character, hover.range.end.character) == (2, 4, 24)


def test_the_step_block_is_completed_and_hovered(server) -> None:
    text = "memplan 1\nstep {\n    shards = 2\n    mixed_precision = bf16\n    autocast = \n    \n}\n"
    _open(server, text)
    assert _labels(server.complete(URI, 4, 15)) == ["none", "bf16", "fp16"]
    assert _labels(server.complete(URI, 5, 4)) == ["loss", "optimizer", "master_weights"]
    value = server.hover(URI, 3, 8).contents.value
    assert "`mixed_precision`" in value and "`step` block" in value
    assert dict(reference().row("step", "mixed_precision").cells)["meaning"] in value


def test_hover_on_policies_options_codecs_and_statements(server) -> None:
    text = "memplan 1\nmodule a {\n    checkpoint segments = 2\n    compress input = bit\n}\nbudget 50%\n"
    _open(server, text)
    assert server.hover(URI, 2, 6).contents.value.startswith("**`checkpoint [segments = N")
    segments = server.hover(URI, 2, 16).contents.value
    assert dict(reference().row("checkpoint", "segments").cells)["meaning"] in segments
    bit = server.hover(URI, 3, 22).contents.value
    assert dict(reference().row("compress", "bit").cells)["holds"] in bit
    assert "budget" in server.hover(URI, 5, 2).contents.value
    assert server.hover(URI, 5, 9) is None  # a number has nothing to say


def test_hover_on_a_selector_without_the_model(server) -> None:
    text = "memplan 1\nmodule layer1.* : Block { checkpoint }\n"
    _open(server, text)
    value = server.hover(URI, 1, 10).contents.value
    assert "`module layer1.* : Block`" in value
    assert "specificity (1, 0, 0, 1, 1)" in value
    assert "loadModel" in value  # says how to see the modules


def test_hover_on_a_selector_while_the_plan_has_a_syntax_error(server) -> None:
    good = "memplan 1\nmodule layer1.* : Block { checkpoint }\nmodule fc { keep }\n"
    _open(server, good)
    # A line typed above the rule and left half-written: the text no longer parses.
    broken = "memplan 1\nmodule head {\nmodule layer1.* : Block { checkpoint }\nmodule fc { keep }\n"
    found = server.diagnostics(URI, server.change(URI, broken))
    assert any(d.severity == lsp.DiagnosticSeverity.Error for d in found)
    hover = server.hover(URI, 2, 10)  # the selector, one line lower than where it parsed
    assert hover is not None
    assert "`module layer1.* : Block`" in hover.contents.value
    assert "specificity (1, 0, 0, 1, 1)" in hover.contents.value
    assert "last version of this plan that parsed" in hover.contents.value
    assert (hover.range.start.line, hover.range.start.character) == (2, 7)
    # The new line never parsed: its selector is read from the line alone.
    alone = server.hover(URI, 1, 8).contents.value
    assert "**`module head`** (line 2)" in alone and "this line alone" in alone


def test_hover_on_a_selector_of_a_plan_that_never_parsed(server) -> None:
    uri = (ROOT / "build" / "lsp-never-parsed.memplan").as_uri()
    found = _open(server, "memplan 1\n\nmodule blocks.*.attn[0:2] : Block {\n    checkpointing\n}\n", uri)
    assert [d.code for d in found] == ["MP102"]  # an unknown policy: the plan does not parse
    value = server.hover(uri, 2, 10).contents.value
    assert "**`module blocks.*.attn[0:2] : Block`** (line 3)" in value
    assert "specificity (2, 1, 0, 1, 1)" in value
    assert server.hover(uri, 3, 6) is None  # the misspelt policy: nothing parsed says what it is
    one_line = "memplan 1\nmodule fc { checkpointx }\n"
    _open(server, one_line, uri)
    assert server.hover(uri, 1, 15) is None  # past the `{`: not answered from the rule's head
    assert "**`module fc`**" in server.hover(uri, 1, 8).contents.value


def _labels(items) -> list[str]:
    return [item.label for item in items]


def test_completion_in_context(server) -> None:
    text = (
        "memplan 1\n"
        "\n"  # 1: a statement
        "module a {\n"
        "    checkpoint segments = 2 \n"  # 3: more options of checkpoint
        "    compress input = \n"  # 4: codecs
        "    \n"  # 5: policies not yet in this rule
        "}\n"
        "memonger {\n"
        "    algo = greedy\n"
        "    \n"  # 9: keys not yet set
        "}\n"
        "budget 4 GiB \n"  # 11: modes
    )
    _open(server, text)
    assert _labels(server.complete(URI, 1, 0)) == [
        "model",
        "example",
        "module",
        "budget",
        "dtr",
        "sublinear",
        "memory",
        "memonger",
        "step",
    ]
    assert _labels(server.complete(URI, 3, 28)) == ["split", "rng", "impl", "nested", "save"]
    assert _labels(server.complete(URI, 4, 21)) == ["none", "bool", "uint8", "bit", "sparse", "auto", "int8"]
    assert _labels(server.complete(URI, 5, 4)) == ["temporal_chunk", "keep", "state", "buffers"]
    assert _labels(server.complete(URI, 9, 4)) == ["ordering", "peak_slack"]
    assert _labels(server.complete(URI, 11, 13)) == ["hard", "hint"]


def test_completion_replaces_the_word_being_typed(server) -> None:
    text = "memplan 1\nmodule a {\n    checkpoint r\n}\n"
    _open(server, text)
    (item,) = server.complete(URI, 2, 16)
    assert item.label == "rng"
    edit = item.text_edit
    assert (edit.range.start.line, edit.range.start.character, edit.range.end.character) == (2, 15, 16)
    assert edit.new_text == "rng = "


def test_formatting_is_the_canonical_form(server) -> None:
    text = "memplan 1\nmodule   a{checkpoint;compress input=bit}   # why\ndtr{eviction_threshold=1 GiB}\n"
    _open(server, text)
    edits = server.format(URI)
    assert apply_edits(text, edits) == format_plan(parse(text))
    canonical = format_plan(parse(text))
    _open(server, canonical)
    assert list(server.format(URI)) == []
    _open(server, BROKEN)
    assert server.format(URI) is None  # a plan with errors is not touched


def test_positions_with_a_byte_order_mark_and_crlf_line_ends(server) -> None:
    # The parser drops the mark; the editor counts it: the `2` of the header is at character 9.
    (found,) = _open(server, "\ufeffmemplan 2\nmodule a { keep }\n")
    assert _simple([found]) == [("MP103", 0, 9, 0, 10)]
    (found,) = _open(server, "memplan 1\r\nmodule a { kep }\r\n")
    assert _simple([found]) == [("MP102", 1, 11, 1, 14)]


def test_incremental_changes_are_applied(server) -> None:
    uri = URI.replace("lsp-test", "lsp-incremental")
    assert _open(server, "memplan 1\nmodule fc { kep }\n", uri)[0].code == "MP102"
    before = len(server.published.get(uri, []))
    server.versions[uri] += 1
    edit = lsp.TextDocumentContentChangePartial(
        range=lsp.Range(start=lsp.Position(line=1, character=12), end=lsp.Position(line=1, character=15)),
        text="keep",
    )
    server.notify(
        server.client.text_document_did_change,
        lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(version=server.versions[uri], uri=uri),
            content_changes=[edit],
        ),
    )
    assert list(server.diagnostics(uri, before)) == []
    server.close_document(uri)


def test_without_pygls_the_command_says_what_to_install(monkeypatch, capsys) -> None:
    import sys

    from memoplan import cli

    monkeypatch.setitem(sys.modules, "pygls", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "memoplan.lsp.server", raising=False)
    monkeypatch.delitem(sys.modules, "pygls.lsp.server", raising=False)
    assert cli.main(["lsp"]) == 2
    assert "pip install 'memoplan[lsp]'" in capsys.readouterr().err


def test_model_resolution_is_off_by_default(server) -> None:
    # A selector that matches nothing in the bundled CNN: without `loadModel`, no MP301 and no model process.
    text = (ROOT / "plans" / "cnn_bn_dropout.memplan").read_text(encoding="utf-8").replace("features.0", "featurez.0")
    uri = URI.replace("lsp-test", "lsp-nomodel")
    assert list(_open(server, text, uri)) == []
    import time

    time.sleep(1.0)
    assert all(list(published) == [] for published in server.published[uri])
    assert "loadModel" in server.hover(uri, 12, 9).contents.value


def test_a_file_name_that_needs_escaping_in_its_uri(server) -> None:
    uri = (ROOT / "build" / "my plan #1 ü.memplan").as_uri()
    assert "%20" in uri
    (found,) = _open(server, "memplan 1\nmodule fc { kep }\n", uri)
    assert found.code == "MP102"
    assert list(server.diagnostics(uri, server.change(uri, "memplan 1\nmodule fc { keep }\n"))) == []
    server.close_document(uri)


def test_a_document_over_the_size_limit_is_mp522_and_left_alone(server) -> None:
    from memoplan.lsp.server import MAX_DOCUMENT

    uri = URI.replace("lsp-test", "lsp-huge")
    text = "memplan 1\nmodule a { bogus }\n" + "#" * MAX_DOCUMENT + "\n"
    (found,) = _open(server, text, uri)
    assert found.code == "MP522" and found.severity == lsp.DiagnosticSeverity.Error
    assert f"{len(text):,} characters" in found.message
    assert server.hover(uri, 1, 12) is None
    assert server.complete(uri, 1, 12) == []
    assert server.format(uri) is None
    small = "memplan 1\nmodule a { bogus }\n"
    assert [d.code for d in server.diagnostics(uri, server.change(uri, small))] == ["MP102"]
    server.close_document(uri)
