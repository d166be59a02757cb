"""Syntax stage: parse ``.memplan`` text into a typed AST and print it back canonically."""

from memoplan.syntax.formatter import format_plan
from memoplan.syntax.parser import load, parse, parse_example_spec, parse_with_diagnostics
from memoplan.syntax.reading import read_plan

__all__ = ["format_plan", "load", "parse", "parse_example_spec", "parse_with_diagnostics", "read_plan"]
