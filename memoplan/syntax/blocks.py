"""Syntax stage: the config blocks (dtr, sublinear, memory, memonger), their keys, types and ranges.

Each block has one typed, frozen config class.  The schema below is the single
source of truth for which keys exist, what type each takes, its range and its
default; ``check_block`` validates a parsed block against it (every problem, not
only the first) and ``config_of`` turns a valid block into its config object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from memoplan.diagnostics import Diagnostic, Severity, Span, did_you_mean
from memoplan.syntax.ast import BlockKind, ConfigBlock, Size, Word


@dataclass(frozen=True)
class DtrConfig:
    """Dynamic eviction at run time (MegEngine DTRConfig semantics, threshold enforced)."""

    eviction_threshold: int  # bytes
    evictee_minimum_size: int = 1024**2  # bytes
    recomp_memory_factor: float = 1.0
    recomp_time_factor: float = 1.0


@dataclass(frozen=True)
class SublinearConfig:
    """Checkpoint search (Chen et al. thresholds, then a genetic algorithm)."""

    thresh_nr_try: int = 10
    genetic_nr_iter: int = 0
    genetic_pool_size: int = 20
    lb_memory: int = 0  # bytes
    num_worker: int | None = None  # None: half the CPUs, at least 1

    @property
    def workers(self) -> int:
        return self.num_worker or max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class MemoryConfig:
    """Allocator and gradient-buffer settings (Ascend MemoryConfig semantics)."""

    static_memory_policy: int = 0  # 0 dynamic | 2 reserve planned peak | 3 expandable | 4 both
    atomic_clean_policy: int = 0  # 0 one fused zeroing of all grads | 1 per parameter


@dataclass(frozen=True)
class MemongerConfig:
    """Static buffer sharing by live ranges (Caffe2 memonger semantics)."""

    algo: str = "greedy"  # greedy | dp
    ordering: str = "topological"  # topological | longest_path


BlockConfig = DtrConfig | SublinearConfig | MemoryConfig | MemongerConfig


@dataclass(frozen=True)
class Key:
    """One key of a block: how to read its value and what values are allowed."""

    kind: str  # "size" | "int" | "float" | "choice"
    check: Callable[[object], bool] = lambda v: True
    rule: str = ""  # the allowed range, in words, for the diagnostic
    choices: tuple = ()
    required: bool = False


SCHEMA: dict[BlockKind, tuple[type, dict[str, Key]]] = {
    BlockKind.DTR: (
        DtrConfig,
        {
            "eviction_threshold": Key("size", lambda v: v > 0, "> 0", required=True),
            "evictee_minimum_size": Key("size", lambda v: v >= 0, ">= 0"),
            "recomp_memory_factor": Key("float", lambda v: v >= 0, ">= 0"),
            "recomp_time_factor": Key("float", lambda v: v >= 0, ">= 0"),
        },
    ),
    BlockKind.SUBLINEAR: (
        SublinearConfig,
        {
            "thresh_nr_try": Key("int", lambda v: v >= 1, ">= 1"),
            "genetic_nr_iter": Key("int", lambda v: v >= 0, ">= 0"),
            "genetic_pool_size": Key("int", lambda v: v >= 2, ">= 2"),
            "lb_memory": Key("size", lambda v: v >= 0, ">= 0"),
            "num_worker": Key("int", lambda v: v >= 1, ">= 1"),
        },
    ),
    BlockKind.MEMORY: (
        MemoryConfig,
        {
            "static_memory_policy": Key("choice", choices=(0, 1, 2, 3, 4)),
            "atomic_clean_policy": Key("choice", choices=(0, 1)),
        },
    ),
    BlockKind.MEMONGER: (
        MemongerConfig,
        {
            "algo": Key("choice", choices=("greedy", "dp")),
            "ordering": Key("choice", choices=("topological", "longest_path")),
        },
    ),
}

_KIND_WORDS = {
    "size": "a size with a unit, e.g. `512 MiB`",
    "int": "an integer",
    "float": "a number",
}


def _read(key: Key, value) -> tuple[object | None, str | None]:
    """Convert a parsed value to the key's Python type; return (value, None) or (None, problem)."""
    if key.kind == "size":
        if isinstance(value, Size):
            return value.bytes, None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            return 0, None
        return None, f"expects {_KIND_WORDS['size']}"
    if key.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        return None, f"expects {_KIND_WORDS['int']}"
    if key.kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return None, f"expects {_KIND_WORDS['float']}"
    # choice: integers or words
    raw = value.name if isinstance(value, Word) else value
    if raw in key.choices:
        return raw, None
    return None, "expects one of " + " | ".join(str(c) for c in key.choices)


def check_block(block: ConfigBlock) -> list[Diagnostic]:
    """Every problem of one config block: unknown, repeated, mistyped, out-of-range or missing keys."""
    keys = SCHEMA[block.kind][1]
    diags: list[Diagnostic] = []
    seen: dict[str, Span] = {}
    for entry in block.entries:
        key = keys.get(entry.key)
        if key is None:
            diags.append(
                Diagnostic(
                    "MP201",
                    f"unknown key `{entry.key}` in `{block.kind.value}` block",
                    entry.span,
                    did_you_mean(entry.key, keys) or f"keys: {', '.join(keys)}",
                )
            )
            continue
        if entry.key in seen:
            diags.append(
                Diagnostic(
                    "MP208",
                    f"`{entry.key}` is set twice in `{block.kind.value}` block",
                    entry.span,
                    "remove one of them",
                    notes=(("first set", seen[entry.key]),),
                )
            )
            continue
        seen[entry.key] = entry.span
        value, problem = _read(key, entry.value)
        if problem:
            diags.append(
                Diagnostic("MP202", f"`{entry.key}` {problem}", entry.span, _help_for(block.kind, entry.key))
            )
        elif not key.check(value):
            diags.append(
                Diagnostic("MP203", f"`{entry.key}` must be {key.rule}", entry.span, _help_for(block.kind, entry.key))
            )
        elif block.kind is BlockKind.MEMORY and entry.key == "static_memory_policy" and value == 1:
            diags.append(
                Diagnostic(
                    "MP210",
                    "`static_memory_policy = 1` behaves as 2 (reserve the planned peak)",
                    entry.span,
                    "write `static_memory_policy = 2`",
                    severity=Severity.WARNING,
                )
            )
    for name, key in keys.items():
        if key.required and name not in seen:
            diags.append(
                Diagnostic(
                    "MP209",
                    f"`{block.kind.value}` block needs `{name}`",
                    block.span,
                    f"add `{name} = ...` ({_KIND_WORDS.get(key.kind, key.kind)}, {key.rule})",
                )
            )
    return diags


def _help_for(kind: BlockKind, name: str) -> str:
    key = SCHEMA[kind][1][name]
    if key.kind == "choice":
        return "allowed: " + ", ".join(str(c) for c in key.choices)
    return f"{_KIND_WORDS[key.kind]}, {key.rule}"


def config_of(block: ConfigBlock) -> BlockConfig:
    """The typed config of a block that ``check_block`` accepted."""
    cls, keys = SCHEMA[block.kind]
    values = {}
    for entry in block.entries:
        value, problem = _read(keys[entry.key], entry.value)
        assert problem is None, problem
        if block.kind is BlockKind.MEMORY and entry.key == "static_memory_policy" and value == 1:
            value = 2
        values[entry.key] = value
    return cls(**values)
