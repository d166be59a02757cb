"""Codegen stage: the one name allocator — every identifier in generated code comes from here.

Any string (module paths, class names, plan text) becomes a valid, unique Python
identifier that is never a keyword, a builtin or a name the template reserves.
Allocation is deterministic: the same requests in the same order give the same names.
"""

from __future__ import annotations

import builtins
import hashlib
import keyword
import re
import unicodedata

MAX_LENGTH = 48


class NameAllocator:
    def __init__(self, reserved=()):
        self._taken: set[str] = set(reserved) | set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)

    def allocate(self, hint: str) -> str:
        base = identifier(hint)
        name, n = base, 1
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name


def identifier(hint: str) -> str:
    """A valid ASCII identifier resembling ``hint``, never a keyword; a long one is cut and given a short hash."""
    text = unicodedata.normalize("NFKD", hint).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"\W+", "_", text).strip("_").lower()
    if not text or text[0].isdigit():
        text = ("n_" + text).rstrip("_")
    if len(text) > MAX_LENGTH:
        digest = hashlib.sha256(hint.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        text = text[: MAX_LENGTH - 9].rstrip("_") + "_" + digest
    if keyword.iskeyword(text) or keyword.issoftkeyword(text):
        text += "_"  # `__import__` -> `import_`, never the keyword itself
    return text
