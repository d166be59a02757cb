"""Editor stage: hover text from the language reference, ``grammar/README.md`` (one source).

The reference's tables say what every key and option means, its type, range and
default; its section headings and first paragraphs say what each statement and
policy does.  The editor shows exactly those rows and paragraphs: nothing here
restates them, so the hover and the reference cannot disagree.

A table belongs to the section it stands in, named by the first word in backticks
of the section's heading (``### `dtr` — ...`` -> ``dtr``; ``### `checkpoint [...]```
-> ``checkpoint``); a row is named by its first cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from memoplan._resources import grammar_reference


@dataclass(frozen=True)
class Row:
    """One row of a reference table: its name, the section it is in, and its cells by column."""

    owner: str
    name: str
    cells: tuple[tuple[str, str], ...]  # (column header, cell), the name's column left out


@dataclass(frozen=True)
class Section:
    owners: tuple[str, ...]
    heading: str  # the heading's text, without the leading #s
    summary: str  # the first paragraph under it


@dataclass(frozen=True)
class Reference:
    rows: dict[tuple[str, str], Row]
    sections: tuple[Section, ...]

    def row(self, owner: str, name: str) -> Row | None:
        return self.rows.get((owner, name))

    def section(self, word: str) -> Section | None:
        return next((s for s in self.sections if word in s.owners), None)


_HEADING = re.compile(r"^(#{2,4})\s+(.*)$")
_TICKED = re.compile(r"`([^`]+)`")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")


def _owners(heading: str) -> tuple[str, ...]:
    """The words a heading is about: the first word of each backticked part (``model``, ``example``)."""
    words = []
    for ticked in _TICKED.findall(heading):
        word = re.match(r"\w+", ticked)
        if word and word.group() not in words:
            words.append(word.group())
    return tuple(words)


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip().replace("\\|", "|") for cell in _CELL_SPLIT.split(inner)]


def _name(cell: str) -> str:
    ticked = _TICKED.fullmatch(cell.strip())
    return ticked.group(1) if ticked else cell.strip()


def parse_reference(text: str) -> Reference:
    """Read the tables and section summaries of a reference written like ``grammar/README.md``."""
    lines = text.split("\n")
    rows: dict[tuple[str, str], Row] = {}
    sections: list[Section] = []
    owners: tuple[str, ...] = ()
    in_code = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_code = not in_code
            i += 1
            continue
        if in_code:
            i += 1
            continue
        heading = _HEADING.match(line)
        if heading:
            owners = _owners(heading.group(2))
            paragraph = []
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(("|", "#", "```")):
                paragraph.append(lines[j].strip())
                j += 1
            sections.append(Section(owners, heading.group(2).strip(), " ".join(paragraph)))
            i += 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s\-|:]+\|?\s*$", lines[i + 1]):
            header = _cells(line)
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                name = _name(cells[0])
                pairs = tuple(zip(header[1:], cells[1:]))
                owner = owners[0] if owners else ""  # a table under a heading about no one word
                rows.setdefault((owner, name), Row(owner, name, pairs))
                i += 1
            continue
        i += 1
    return Reference(rows, tuple(sections))


@cache
def reference() -> Reference:
    """The reference of this installation's language (``grammar/README.md``)."""
    return parse_reference(grammar_reference())


def row_markdown(row: Row, title: str) -> str:
    """A hover for one row: its title, the short cells as ``column: value``, then its meaning."""
    facts = [f"{header}: {cell}" for header, cell in row.cells if header != "meaning" and cell]
    meaning = dict(row.cells).get("meaning", "")
    parts = [title]
    if facts:
        parts.append(" · ".join(facts))
    if meaning:
        parts.append(meaning)
    return "\n\n".join(parts)


def section_markdown(section: Section) -> str:
    return f"**{section.heading}**" + (f"\n\n{section.summary}" if section.summary else "")
