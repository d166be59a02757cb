"""The TextMate grammar (editors/memplan.tmLanguage.json): written from the Lark grammar, and it
scopes what the parser reads as keywords, numbers with units, strings and comments.

Every plan in plans/ and every syntax fixture is tokenized with the TextMate grammar (the
Python tokenizer in memoplan.lsp.textmate) and compared, token by token, with what the Lark
lexer makes of the same text while parsing it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _clients import require
from _paths import ROOT
from lark import Lark
from lark.exceptions import UnexpectedInput

from memoplan._resources import grammar_text
from memoplan.lsp import textmate

FILES = sorted(ROOT.glob("plans/*.memplan")) + sorted((ROOT / "tests" / "fixtures" / "syntax").rglob("*.memplan"))
GRAMMAR = json.loads(textmate.OUTPUT.read_text(encoding="utf-8"))
TOKENIZER = textmate.Tokenizer(GRAMMAR)
VOCAB = textmate.vocabulary(grammar_text())
KEYWORD_TYPES = {f"_{w.upper()}" for w in VOCAB.keywords} | {w.upper() for w in VOCAB.keywords}


def _lark() -> tuple[Lark, list]:
    comments: list = []
    parser = Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"COMMENT": comments.append},
    )
    return parser, comments


PARSER, COMMENTS = _lark()


def _tokens(text: str):
    """The tokens the parser reads (comments too), or None when the text does not parse."""
    COMMENTS.clear()
    tokens = []
    try:
        interactive = PARSER.parse_interactive(text)
        for token in interactive.iter_parse():
            tokens.append(token)
        interactive.resume_parse()
    except UnexpectedInput:
        return None
    return tokens + list(COMMENTS)


def _normal(text: str) -> str:
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _scopes_of(scopes, token) -> set[str]:
    """Every scope on every character of a one-line token."""
    line = scopes[token.line - 1]
    found = set()
    for column in range(token.column - 1, token.end_column - 1):
        found.update(line[column])
    return found


def test_grammar_file_is_generated_from_the_lark_grammar() -> None:
    assert textmate.main(["--check"]) == 0
    assert textmate.OUTPUT.read_text(encoding="utf-8") == textmate.render()


def test_every_lark_keyword_is_highlighted() -> None:
    keywords = re.findall(r"/(\w+)\(\?!\\w\)/", grammar_text())
    assert sorted(keywords) == sorted(VOCAB.keywords)
    assert len(keywords) == 21
    text = json.dumps(GRAMMAR)
    for word in keywords:
        assert re.search(rf"(?<![\w]){word}(?![\w])", text), word
    assert set(VOCAB.units) == {"B", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB"}
    assert set(VOCAB.durations) == {"ms", "s"}


def test_the_vocabulary_drives_the_grammar() -> None:
    # A keyword added to the Lark grammar appears in the TextMate grammar by itself.
    more = grammar_text() + "\n_OFFLOAD.4: /offload(?!\\w)/\n"
    vocab = textmate.vocabulary(more)
    assert "offload" in vocab.others
    tokens = textmate.Tokenizer(json.loads(textmate.render(vocab))).tokenize("memplan 1\nmodule a { keep offload }")
    assert tokens[1][-3][-1] == "keyword.other.memplan"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_file_is_scoped_as_the_parser_reads_it(path: Path) -> None:
    text = _normal(path.read_text(encoding="utf-8", errors="replace"))
    scopes = TOKENIZER.tokenize(text)  # never raises, whatever the file holds
    assert len(scopes) == text.count("\n") + 1
    tokens = _tokens(text)
    if tokens is None:
        return  # a fixture with a syntax error: tokenizing it is the test
    checked = 0
    for token in tokens:
        if token.line != token.end_line:
            continue
        found = _scopes_of(scopes, token)
        kind = token.type
        if kind in KEYWORD_TYPES:
            assert any(s.startswith("keyword.") for s in found), (token, found)
        elif kind == "SIZE":
            assert "constant.numeric.size.memplan" in found, (token, found)
            unit = re.search(r"[A-Za-z]+$", str(token))
            unit_scopes = set(scopes[token.line - 1][token.end_column - 2])
            assert "keyword.other.unit.memplan" in unit_scopes, (token, unit.group())
        elif kind in ("NUMBER", "PERCENT", "DURATION", "INT") and token.type != "INT":
            assert any(s.startswith("constant.numeric") for s in found), (token, found)
        elif kind == "STRING":
            assert "string.quoted.double.memplan" in found, (token, found)
        elif kind == "COMMENT":
            assert found == {"source.memplan", "comment.line.number-sign.memplan"} or (
                "comment.line.number-sign.memplan" in found
            ), (token, found)
        elif kind in ("NAME", "GLOB"):
            # A name is never shown as a keyword: `a.module.keep` is a path, `args = [state]` a word.
            assert not any(s.startswith("keyword.control") or s.startswith("keyword.other.policy") for s in found), (
                token,
                found,
            )
        else:
            continue
        checked += 1
    assert checked > 0


def test_scopes_of_a_plan() -> None:
    text = (
        "memplan 1  # header\n"
        'model "pkg.mod:build"\n'
        "module layer1.* : Block not class X { checkpoint segments = 2; compress input = bit }\n"
        "dtr { eviction_threshold = 1.5 GiB }\n"
        "budget 60% hint\n"
    )
    scopes = TOKENIZER.tokenize(text)

    def at(line: int, word: str, nth: int = 0) -> tuple[str, ...]:
        row = text.split("\n")[line]
        column = [m.start() for m in re.finditer(re.escape(word), row)][nth]
        return scopes[line][column]

    assert at(0, "memplan")[-1] == "keyword.control.statement.memplan"
    assert at(0, "1")[-1] == "constant.numeric.memplan"
    assert at(0, "# header")[-1] == "comment.line.number-sign.memplan"
    assert at(1, '"pkg')[-1] == "string.quoted.double.memplan"
    assert at(2, "module")[-1] == "keyword.control.statement.memplan"
    assert at(2, "layer1")[-1] == "entity.name.tag.path.memplan"
    assert at(2, "*")[-1] == "keyword.operator.glob.memplan"
    assert at(2, "Block")[-1] == "entity.name.type.class.memplan"
    assert at(2, "not")[-1] == "keyword.operator.word.memplan"
    assert at(2, "checkpoint")[-1] == "keyword.other.policy.memplan"
    assert at(2, "segments")[-1] == "variable.other.key.memplan"
    assert at(2, "compress")[-1] == "keyword.other.policy.memplan"
    assert at(2, "input")[-1] == "keyword.other.memplan"
    assert at(2, "bit")[-1] == "constant.language.memplan"
    assert at(3, "dtr")[-1] == "keyword.control.block.memplan"
    assert at(3, "1.5")[-1] == "constant.numeric.size.memplan"
    assert at(3, "GiB")[-1] == "keyword.other.unit.memplan"
    assert at(4, "60%")[-1] == "constant.numeric.percent.memplan"
    assert at(4, "hint")[-1] == "constant.language.memplan"


def test_vscode_extension_uses_the_grammar() -> None:
    editors = ROOT / "editors"
    package = json.loads((editors / "package.json").read_text(encoding="utf-8"))
    (language,) = package["contributes"]["languages"]
    assert language["id"] == "memplan" and ".memplan" in language["extensions"]
    (tm,) = package["contributes"]["grammars"]
    assert tm["scopeName"] == GRAMMAR["scopeName"]
    assert (editors / tm["path"]).resolve() == textmate.OUTPUT
    assert (editors / language["configuration"]).is_file()
    json.loads((editors / language["configuration"]).read_text(encoding="utf-8"))
    assert package["main"] == "./dist/extension.js"  # the bundle `npm run bundle` writes
    source = (editors / "extension.js").read_text(encoding="utf-8")
    assert '"lsp"' in source  # starts `memoplan lsp`


def test_vscode_extension_is_valid_javascript() -> None:
    require(shutil.which("node") is not None, "Node.js", "apt-get install nodejs npm")
    subprocess.run(["node", "--check", str(ROOT / "editors" / "extension.js")], check=True)


NODE_MODULES = ROOT / "editors" / "node_modules"


def test_python_tokenizer_agrees_with_vscode_textmate() -> None:
    """The same scopes, character by character, as vscode-textmate with Oniguruma gives."""
    require(shutil.which("node") is not None, "Node.js", "apt-get install nodejs npm")
    require(
        (NODE_MODULES / "vscode-textmate").is_dir(),
        "VS Code's tokenizer (vscode-textmate)",
        "`make editors` (npm ci in editors/)",
    )
    paths = [str(p) for p in FILES]
    run = subprocess.run(
        ["node", str(ROOT / "editors" / "tokenize.js"), str(textmate.OUTPUT), *paths],
        check=True,
        capture_output=True,
        text=True,
    )
    theirs = json.loads(run.stdout)
    compared = 0
    for path in paths:
        text = _normal(Path(path).read_text(encoding="utf-8", errors="replace"))
        ours = TOKENIZER.tokenize(text)
        for number, (line, tokens) in enumerate(zip(text.split("\n"), theirs[path])):
            columns = [i for i, ch in enumerate(line) for _ in range(2 if ord(ch) > 0xFFFF else 1)]
            for start, end, scopes in tokens:
                for unit in range(start, min(end, len(columns))):
                    assert tuple(scopes) == ours[number][columns[unit]], (path, number + 1, columns[unit])
                    compared += 1
    assert compared > 1000
