"""Shared leaf: the words whose values cross stages, defined once.

The syntax builds them, the IR holds them, the code generator prints them and the runtime
takes them back: ``validate = sample`` is :attr:`Validate.SAMPLE` everywhere, not a string in
one stage and an enum in another.  This module imports nothing of memoplan (and no torch), so
``memoplan check --syntax-only`` stays torch-free.

**Codecs** are a registry rather than a fixed enum: each codec is one :class:`CodecSpec`
(its name, whether it is lossless, what it holds, its payload and size, its place in
``auto``'s order), registered with :func:`register_codec`.  The language's codec names, the
LSP's completions, ``auto``'s order and the reference tables (:func:`codec_table`) all come
from the registry; :class:`Codec` is the name of a registered codec as the AST and IR hold it.
The runtime's implementation of each codec (``memoplan.runtime.codecs``) is keyed by the same
name, and resolving a plan refuses a codec the runtime lacks (``MP214``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "Aspect",
    "Boundaries",
    "Codec",
    "CodecSpec",
    "Validate",
    "codec_block",
    "codec_specs",
    "codec_table",
    "register_codec",
    "unregister_codec",
    "widening_order",
]


class Validate(enum.Enum):
    """How much of a compressed input the runtime checks against its codec."""

    OFF = "off"
    SAMPLE = "sample"
    ALWAYS = "always"


class Boundaries(enum.Enum):
    """What `temporal_chunk` does with the state each chunk starts from, between forward and backward."""

    KEEP = "keep"
    RECOMPUTE = "recompute"


class Aspect(str, enum.Enum):
    """What about a module a policy decides; per module and aspect the most specific rule wins.

    A ``str`` enum: it compares and hashes as its value, so ``decisions["compress"]`` and
    ``decisions[Aspect.COMPRESS]`` are the same entry, and it prints as its value.
    """

    RECOMPUTE = "recompute"  # checkpoint or keep
    COMPRESS = "compress"
    CHUNK = "temporal_chunk"
    STATE = "state"
    BUFFERS = "buffers"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# ---------------------------------------------------------------- codecs


@dataclass(frozen=True)
class CodecSpec:
    """One codec as the language and its reference know it (the runtime adds encode/decode).

    ``holds``: the values it can hold (short); ``about``: the reference's description of it;
    ``stored``/``nbytes``: its payload and size (``docs/codecs.md``), empty for ``auto``.
    ``generality``: ``auto`` picks among the codecs that have one and widens a choice towards
    the larger (each holds everything the ones below it hold); ``None``: ``auto`` never picks
    it.  ``cost``: ``auto``'s tie-break between equal payloads, cheapest to encode first.
    ``chooses``: the codec is a choice among the others (``auto``), not a payload of its own.
    """

    name: str
    lossless: bool
    holds: str
    about: str
    stored: str = ""
    nbytes: str = ""
    generality: int | None = None
    cost: int = 0
    chooses: bool = False


class _CodecRegistry(type):
    """Makes :class:`Codec` iterable, like an enum: its members in registration order."""

    def __iter__(cls) -> Iterator[Codec]:
        return iter(tuple(_MEMBERS.values()))

    def __len__(cls) -> int:
        return len(_MEMBERS)

    def __contains__(cls, item: object) -> bool:
        return isinstance(item, Codec) and _MEMBERS.get(item.value) is item


class Codec(metaclass=_CodecRegistry):
    """A registered codec's name, interned: ``Codec("bit") is Codec.BIT``.

    It reads like an enum member (``.value``, ``.name``, ``repr``, iteration over ``Codec``),
    so plans' digests and generated code are those an enum gave; unlike an enum, a codec can
    be registered later (:func:`register_codec`).
    """

    __slots__ = ("spec",)
    spec: CodecSpec

    NONE: ClassVar[Codec]
    BOOL: ClassVar[Codec]
    UINT8: ClassVar[Codec]
    BIT: ClassVar[Codec]
    SPARSE: ClassVar[Codec]
    AUTO: ClassVar[Codec]
    INT8: ClassVar[Codec]

    def __new__(cls, value: str | Codec) -> Codec:
        name = value.value if isinstance(value, Codec) else value
        member = _MEMBERS.get(name)
        if member is None:
            raise ValueError(f"{value!r} is not a valid Codec")
        return member

    @classmethod
    def _make(cls, spec: CodecSpec) -> Codec:
        member = object.__new__(cls)
        object.__setattr__(member, "spec", spec)
        return member

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Codec is immutable")

    @property
    def value(self) -> str:
        return self.spec.name

    @property
    def name(self) -> str:
        return self.spec.name.upper()

    @property
    def lossy(self) -> bool:
        return not self.spec.lossless

    def __repr__(self) -> str:
        return f"<Codec.{self.name}: {self.value!r}>"

    def __str__(self) -> str:
        return f"Codec.{self.name}"

    def __reduce__(self):
        return (Codec, (self.value,))


_MEMBERS: dict[str, Codec] = {}


def register_codec(spec: CodecSpec) -> Codec:
    """Add a codec to the language (its runtime implementation is registered in
    ``memoplan.runtime.codecs`` under the same name); returns its :class:`Codec`."""
    if spec.name in _MEMBERS:
        raise ValueError(f"codec {spec.name!r} is already registered")
    if not spec.name.isidentifier() or spec.name != spec.name.lower():
        raise ValueError(f"a codec's name is a lower-case word, not {spec.name!r}")
    member = Codec._make(spec)
    _MEMBERS[spec.name] = member
    return member


def unregister_codec(name: str) -> None:
    """Remove a codec registered by :func:`register_codec` (for tests and plug-ins)."""
    _MEMBERS.pop(name, None)


def codec_specs() -> tuple[CodecSpec, ...]:
    """Every registered codec, in registration order (the reference's order)."""
    return tuple(member.spec for member in _MEMBERS.values())


def widening_order() -> tuple[str, ...]:
    """The codecs ``auto`` may pick, least general first: a choice only ever widens along it."""
    ranked = [s for s in codec_specs() if s.generality is not None]
    return tuple(s.name for s in sorted(ranked, key=lambda s: s.generality or 0))


def codec_table(columns: tuple[str, ...] = ("lossless", "holds")) -> str:
    """A Markdown table of the registered codecs (``columns`` of :class:`CodecSpec`).

    With ``stored`` or ``nbytes`` among the columns, codecs without a payload of their own
    (``auto``) are left out.
    """
    payload = "stored" in columns or "nbytes" in columns
    head = {
        "lossless": "lossless",
        "holds": "holds",
        "about": "holds",
        "stored": "stored (1-D, C order of `x.reshape(-1)`)",
        "nbytes": "bytes",
    }
    rows = ["| codec | " + " | ".join(head[c] for c in columns) + " |", "| --- |" + " --- |" * len(columns)]
    for spec in codec_specs():
        if payload and spec.chooses:
            continue
        cells = [_cell(spec, column) for column in columns]
        rows.append(f"| `{spec.name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


#: The codec tables of the reference (``grammar/README.md``) and of ``docs/codecs.md``.
CODEC_TABLES: dict[str, tuple[str, ...]] = {
    "grammar/README.md": ("lossless", "about"),
    "docs/codecs.md": ("lossless", "holds", "stored", "nbytes"),
}
BEGIN = "<!-- codec table, generated from memoplan/enums.py: begin -->"
END = "<!-- codec table, generated from memoplan/enums.py: end -->"


def codec_block(path: str) -> str:
    """The generated codec table of ``path`` (a key of :data:`CODEC_TABLES`), with its markers."""
    return f"{BEGIN}\n{codec_table(CODEC_TABLES[path])}{END}\n"


def _cell(spec: CodecSpec, column: str) -> str:
    if column == "lossless":
        return "yes" if spec.lossless else "**no**"
    text = getattr(spec, column)
    return text.replace("{widening}", " → ".join(f"`{name}`" for name in widening_order()))


_AUTO_ABOUT = (
    "the smallest lossless codec the first train-mode input allows (under DDP every rank takes the "
    "most general choice of any rank); every later input is checked in full, and one the codec "
    "cannot hold widens the choice ({widening}) instead of being stored wrongly"
)
_SPARSE_STORED = (
    "`int32` indices of elements that are not `+0` (`int64` from 2**31 elements), plus their values unless all are 1"
)
_BIT_STORED = "`uint8[ceil(numel/8)]`, element i = bit `i % 8` of byte `i // 8` (LSB first), tail bits 0"
_INT8_STORED = "`int8[numel]` and one `float32` scale (absmax/127) per 64 elements, round half to even"

# The built-in codecs, in the reference's order.  ``memoplan.runtime.codecs`` implements each.
Codec.NONE = register_codec(
    CodecSpec("none", True, "anything", "anything, kept as it is (overrides a broader rule)",
              "the input itself (no copy)", "`numel * itemsize`", generality=4, cost=0)
)  # fmt: skip
Codec.BOOL = register_codec(
    CodecSpec("bool", True, "0 and 1", "0 and 1, one byte each", "`bool[numel]`", "`numel`", generality=1, cost=2)
)
Codec.UINT8 = register_codec(
    CodecSpec("uint8", True, "integers 0..255", "integers 0..255", "`uint8[numel]`", "`numel`", generality=2, cost=3)
)
Codec.BIT = register_codec(
    CodecSpec("bit", True, "0 and 1", "0 and 1, one bit each (spikes, masks)", _BIT_STORED,
              "`ceil(numel/8)`", generality=0, cost=1)
)  # fmt: skip
Codec.SPARSE = register_codec(
    CodecSpec("sparse", True, "anything", "anything; only the non-zero positions (and values) are kept",
              _SPARSE_STORED, "`nnz * (4 [+ itemsize])`", generality=3, cost=4)
)  # fmt: skip
Codec.AUTO = register_codec(CodecSpec("auto", True, "", _AUTO_ABOUT, chooses=True))
Codec.INT8 = register_codec(
    CodecSpec("int8", False, "finite floats", "finite floats, as int8 per group of 64 with a float32 scale",
              _INT8_STORED, "`numel + 4 * ceil(numel/64)`")
)  # fmt: skip


if __name__ == "__main__":  # python -m memoplan.enums: rewrite the generated codec tables
    import sys
    from pathlib import Path

    from memoplan.targets import replace_file

    root = Path(__file__).resolve().parent.parent
    for relative in CODEC_TABLES:
        file = root / relative
        text = file.read_text(encoding="utf-8")
        begin, end = text.index(BEGIN), text.index(END) + len(END) + 1
        replace_file(file, text[:begin] + codec_block(relative) + text[end:])
        print(f"wrote {relative}", file=sys.stderr)
