"""Report stage: one self-contained HTML page from finished sections.

The page is the Jinja template ``memoplan/codegen/templates/report/page.html.j2`` (autoescaped); the
pieces below build a section's body.  Every string from the model or the plan goes through
:func:`esc`; plots
arrive as inline SVG from :mod:`memoplan.report.draw`.  No script, no stylesheet or
font from elsewhere, so the page opens offline and prints as it shows.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache

import jinja2
import markupsafe

from memoplan._resources import templates_dir
from memoplan.diagnostics import printable

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; background: #fff; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; font-size: .9em; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: .85em; }
figure.plot { margin: 1em 0; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { font-size: .9em; color: #444; }
.verdict { font-weight: bold; padding: .1em .5em; border-radius: .3em; }
.ok { background: #dff0d8; color: #235a23; } .bad { background: #f2dede; color: #8a1f1f; }
.note { color: #555; font-size: .9em; }
"""


def esc(text: object) -> str:
    """Escaped for HTML, with control characters, lone surrogates and bidirectional overrides
    (from module names) written as Python-style escapes, line by line."""
    return html.escape("\n".join(printable(line) for line in str(text).split("\n")), quote=True)


@dataclass
class Section:
    """One ``<section>``: an id, a heading and its body (HTML already escaped)."""

    id: str
    title: str
    body: list[str] = field(default_factory=list)

    def add(self, html_text: str) -> Section:
        self.body.append(html_text)
        return self


def table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    """A table; cells are escaped; columns in ``numeric`` are right-aligned."""
    num = set(numeric)
    head = "".join(f"<th{' class=num' if i in num else ''}>{esc(h)}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if i in num else ''}>{esc(c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(plot_id: str, svg: str, caption: str) -> str:
    """A plot: inline SVG (from matplotlib) and an escaped caption."""
    return f'<figure class="plot" id="plot-{esc(plot_id)}">{svg}<figcaption>{esc(caption)}</figcaption></figure>'


def paragraph(text: str, css: str = "") -> str:
    return f"<p{f' class={esc(css)}' if css else ''}>{esc(text)}</p>"


def preformatted(text: str) -> str:
    return f"<pre>{esc(text)}</pre>"


def verdict(text: str, good: bool) -> str:
    return f'<span class="verdict {"ok" if good else "bad"}">{esc(text)}</span>'


def render(title: str, intro: Sequence[str], sections: Sequence[Section]) -> str:
    """The page (``report/page.html.j2``): title, an introduction (HTML), a table of contents
    and the sections.  ``intro`` and the sections' bodies are HTML built by the helpers above."""
    safe = markupsafe.Markup
    return (
        _environment()
        .get_template("report/page.html.j2")
        .render(
            title=title,
            style=safe(STYLE),
            intro=[safe(part) for part in intro],
            sections=[Section(s.id, s.title, [safe(part) for part in s.body]) for s in sections],
        )
    )


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["esc"] = lambda text: markupsafe.Markup(esc(text))
    return env
