"""The language's literals as Python values: numbers (an integer unless written with a point or
an exponent), JSON strings and their escapes, sizes and durations split into amount and unit."""

from __future__ import annotations

import json
import math
import re

_UNIT_RE = re.compile(r"(.*?)[ \t]*([A-Za-z]+)")  # "6 GiB" -> ("6", "GiB"), "10ms" -> ("10", "ms")


def unit_parts(text: str) -> tuple[str, str]:
    """A SIZE or DURATION token's amount and unit (the grammar's token always has both)."""
    match = _UNIT_RE.fullmatch(text)
    assert match is not None, text
    return match.group(1), match.group(2)


_INT_RE = re.compile(r"[+-]?\d+")
# One JSON string escape, or a backslash that does not start one.
_ESCAPE_RE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})|(\\)')


#: The largest size, in bytes, the language accepts anywhere (a budget, a block's sizes).
MAX_SIZE_BYTES = 2**63 - 1


def number(text: str) -> int | float:
    """An integer if written without a point or an exponent, else a float."""
    if _INT_RE.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than Python converts; out of range anyway
            pass
    return float(text)


def unquote(text: str) -> str:
    """The value of a STRING token (JSON escapes); assumes ``bad_escape(text)`` is None."""
    return json.loads(text, strict=False)


def bad_escape(text: str) -> int | None:
    """Offset of the first invalid escape in a STRING token, or None."""
    for match in _ESCAPE_RE.finditer(text):
        if match.group(1) is not None:
            return match.start()
    return None


def is_finite(value) -> bool:
    """True if ``value`` is a number that converts to a finite float."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def unit_help(written: str, symbol: str) -> str:
    if written != symbol:
        return f"units are case-sensitive: write `{symbol}`"
    return f"a unit follows a number directly, e.g. `4 {symbol}`"
