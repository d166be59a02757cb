"""``memoplan docs [TOPIC]``: the documentation, printed from the installed package.

A message that sends the user to the docs names a topic (``see `memoplan docs security```),
never a file of the repository: a pip user has no checkout.  The pages are in the wheel
(``memoplan/_data``: ``pyproject.toml`` force-includes ``docs/``, ``README.md`` and
``grammar/``), and in a checkout they are read where they are.  :data:`TOPICS` is the one
place that maps a topic to its page (and, for some, one section of it); :func:`pointer` is what
messages call, so a topic that does not exist fails at once, and ``tests/test_doc_pages.py``
checks that every message's pointer prints a page and that no message names a file instead.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from memoplan._resources import doc_text
from memoplan.diagnostics import did_you_mean


@dataclass(frozen=True)
class Topic:
    path: str  # the page, relative to the repository's root (and to memoplan/_data in the wheel)
    section: str | None = None  # the heading (without its #s) of the one section shown


TOPICS: dict[str, Topic] = {
    "overview": Topic("README.md"),
    "install": Topic("docs/install.md"),
    "tutorial": Topic("docs/tutorial.md"),
    "how-to": Topic("docs/how-to.md"),
    "cli": Topic("docs/reference/cli.md"),
    "api": Topic("docs/reference/api.md"),
    "language": Topic("grammar/README.md"),
    "errors": Topic("grammar/README.md", "7. Errors"),
    "huggingface": Topic("docs/huggingface.md"),
    "planner": Topic("docs/planner.md"),
    "fit": Topic("docs/fit.md"),
    "meta": Topic("docs/meta.md"),
    "step": Topic("docs/step.md"),
    "llama-fsdp": Topic("docs/llama-fsdp.md"),
    "compile": Topic("docs/compile.md"),
    "state": Topic("docs/state.md"),
    "codecs": Topic("docs/codecs.md"),
    "kernels": Topic("docs/kernels.md"),
    "editors": Topic("docs/editors.md"),
    "security": Topic("docs/security.md"),
    "faults": Topic("docs/faults.md"),
    "guarantees": Topic("docs/guarantees.md"),
    "how-it-works": Topic("docs/how-it-works.md"),
    "upgrades": Topic("docs/upgrades.md"),
}


def pointer(topic: str) -> str:
    """What a message writes to send the user to ``topic``: ``memoplan docs TOPIC`` (in backticks)."""
    if topic not in TOPICS:
        raise KeyError(f"no documentation topic {topic!r}: add it to memoplan.doc_pages.TOPICS")
    return f"`memoplan docs {topic}`"


def page(topic: str) -> str:
    """The text of ``topic``'s page (or of its section)."""
    entry = TOPICS[topic]
    text = doc_text(entry.path)
    if entry.section is None:
        return text
    return _section(text, entry.section)


def _section(text: str, heading: str) -> str:
    """From the heading ``heading`` to the next heading of its level or above."""
    found = re.search(rf"^(#+) {re.escape(heading)}[ \t]*$", text, re.MULTILINE)
    if found is None:
        raise LookupError(f"no section {heading!r} in the page")
    level = len(found.group(1))
    after = re.search(rf"^#{{1,{level}}} ", text[found.end() :], re.MULTILINE)
    end = found.end() + after.start() if after else len(text)
    return text[found.start() : end].rstrip() + "\n"


def title(topic: str) -> str:
    entry = TOPICS[topic]
    if entry.section is not None:
        return entry.section.split(". ", 1)[-1] + " (" + _first_heading(doc_text(entry.path)) + ")"
    return _first_heading(doc_text(entry.path))


def _first_heading(text: str) -> str:
    return next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("# ")), "")


def print_docs(topic: str | None) -> int:
    """``memoplan docs [TOPIC]``: the list of topics, or one page; 2 for no such topic."""
    if topic is None:
        width = max(map(len, TOPICS))
        for name in TOPICS:
            print(f"{name:<{width}}  {title(name)}")
        print("\nmemoplan docs TOPIC prints a page (Markdown), e.g. `memoplan docs tutorial | less`")
        return 0
    key = topic.strip().lower()
    if key not in TOPICS:
        hint = did_you_mean(key, TOPICS) or "`memoplan docs` lists every topic"
        print(f"error: no documentation topic `{topic}`; {hint}", file=sys.stderr)
        return 2
    sys.stdout.write(page(key))
    return 0
