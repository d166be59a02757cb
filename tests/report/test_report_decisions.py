"""One list of a module's decisions (memoplan.ir.ModulePlan.decisions) for the compiled header
and the report, and the report's page from its Jinja template."""

from __future__ import annotations

from _paths import ROOT

from memoplan import load, resolve
from memoplan.codegen.emit import plan_table
from memoplan.examples import transformer
from memoplan.report import command, page


def test_the_report_lists_the_dtr_rows_the_compiled_header_shows():
    resolved = resolve(load(ROOT / "plans" / "transformer_dtr.memplan"), transformer.build())
    rows = command.plan_rows(resolved)
    dtr = [row for row in rows if row[2] == "dtr (may be evicted)"]
    assert dtr, rows
    header = "\n".join(plan_table(resolved))
    assert header.count("dtr (may be evicted)") == len(dtr)
    assert len(header.splitlines()) == len(rows) + 1  # the same rows, under one header line


def test_the_page_escapes_what_it_is_given_and_keeps_section_html():
    sections = [page.Section("plan", "Plan <&>", [page.paragraph("a < b")]), page.Section("x", "X")]
    html = page.render('Report "\u202e"', ["<p>intro</p>"], sections)
    assert html.startswith("<!DOCTYPE html>\n") and html.endswith("</body></html>\n")
    assert "<title>Report &quot;\\u202e&quot;</title>" in html
    assert '<section id="plan"><h2>Plan &lt;&amp;&gt;</h2>\n<p>a &lt; b</p>\n</section>' in html
    assert '<li><a href="#x">X</a></li>' in html and "<p>intro</p>\n<nav>" in html
