"""Codegen stage: the Jinja environment — strict, and with the only two ways user text enters code.

User text reaches generated code solely through ``pyrepr`` (a Python literal via
``repr``), ``docstring`` (a triple-quoted string only when the text is printable and
has no quote or backslash, else ``repr``) and ``comment`` (a single comment line with
every line break and control character escaped).  Templates never paste raw strings.
"""

from __future__ import annotations

import unicodedata
from functools import cache

import jinja2

from memoplan._resources import templates_dir


def comment_safe(text: str) -> str:
    """Text that stays on one comment line: breaks, controls and surrogates become ``\\uXXXX``."""
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") and ch != "\t":
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out).replace("\t", " ")


def pyrepr(value) -> str:
    """A Python literal for a str/int/float/bool/None/tuple value."""
    if isinstance(value, tuple):
        inner = ", ".join(pyrepr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, (str, int, float, bool)) or value is None:
        return repr(value)
    raise TypeError(f"cannot write {type(value).__name__} into generated code")


def docstring(text: str) -> str:
    """A triple-quoted docstring when ``text`` is plain printable text, else a ``repr`` literal."""
    plain = all(ch.isprintable() for ch in text) and "\\" not in text and '"' not in text
    return f'"""{text}"""' if plain else repr(text)


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pyrepr"] = pyrepr
    env.filters["comment"] = comment_safe
    env.filters["docstring"] = docstring
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)
