"""Syntax stage: the config blocks (dtr, sublinear, memory, memonger, step), their keys, types and ranges.

Each block has one typed, frozen config class.  The schema below is the single
source of truth for which keys exist, what type each takes, its range and its
default; ``check_block`` validates a parsed block against it (every problem, not
only the first) and ``config_of`` turns a valid block into its config object.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memoplan.diagnostics import Diagnostic, Severity, Span, did_you_mean
from memoplan.syntax.ast import BlockKind, ConfigBlock, Size, Text, Word


@dataclass(frozen=True)
class DtrConfig:
    """Dynamic eviction at run time (MegEngine DTRConfig semantics, threshold enforced)."""

    eviction_threshold: int  # bytes
    evictee_minimum_size: int = 1024**2  # bytes
    recomp_memory_factor: float = 1.0
    recomp_time_factor: float = 1.0
    modules: str | None = None  # a selector naming the candidates; None: the model's blocks


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
    peak_slack: float = 0.02  # a call's estimated peak may exceed eager's by this fraction, no more


#: The optimizers a step may keep state for, and how many tensors the size of a parameter each keeps.
OPTIMIZER_STATES = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}

#: The loss words of a `step` block (any other loss is a callable, `"file.py:callable"`).
LOSS_WORDS = ("auto", "sum", "model")


@dataclass(frozen=True)
class StepConfig:
    """The training step a plan is made for (``memoplan.step`` runs it): what ``plan``, ``verify``
    and ``report`` run, written once in the plan so that each runs the same step.

    ``loss``: ``auto`` (the model's own loss where its output carries one, an attribute or key
    ``loss``, else the sum of its floating outputs), ``sum``, ``model`` (the model's own, required)
    or ``path/file.py:callable`` / ``pkg.module:callable`` (called with the output);
    ``autocast``: the forward and loss under ``torch.autocast`` in that dtype; ``optimizer``: the
    optimizer whose state each rank keeps between steps, in the parameters' dtype (fp32 with
    ``master_weights``); ``master_weights``: ``fp32`` keeps an fp32 copy of every parameter that is
    not fp32 (and the state in fp32); ``shards``: the step of one of N FSDP2 ranks;
    ``mixed_precision``: FSDP2's ``MixedPrecisionPolicy`` — parameters gathered and computed in
    that dtype, gradients reduced (and kept, sharded) in fp32.
    """

    loss: str = "auto"
    autocast: str = "none"  # none | bf16 | fp16
    optimizer: str = "none"  # a key of OPTIMIZER_STATES
    master_weights: str = "none"  # none | fp32
    shards: int = 1
    mixed_precision: str = "none"  # none | bf16 | fp16


BlockConfig = DtrConfig | SublinearConfig | MemoryConfig | MemongerConfig | StepConfig


@dataclass(frozen=True)
class Key:
    """One key of a block: how to read its value and what values are allowed."""

    kind: str  # "size" | "int" | "float" | "choice"
    check: Callable[[Any], bool] = lambda v: True  # called with the parsed number
    rule: str = ""  # the allowed range, in words, for the diagnostic
    choices: tuple = ()  # for "choice": the allowed integers or words
    required: bool = False
    aliases: tuple[tuple[object, object], ...] = ()  # (accepted value, what it means), with a warning
    text: str = ""  # for "choice": a string is accepted too (a spec `file.py:name`); what it is, in words


SCHEMA: dict[BlockKind, tuple[type, dict[str, Key]]] = {
    BlockKind.DTR: (
        DtrConfig,
        {
            "eviction_threshold": Key("size", lambda v: v > 0, "> 0", required=True),
            "evictee_minimum_size": Key("size", lambda v: v >= 0, ">= 0"),
            "recomp_memory_factor": Key("float", lambda v: v >= 0, ">= 0"),
            "recomp_time_factor": Key("float", lambda v: v >= 0, ">= 0"),
            # Checked against the selector grammar and the model by the resolver (MP232).
            "modules": Key("selector", rule="a selector in quotes"),
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
            # Ascend accepts 1 as an alias of 2; so do we, with a warning (MP210).
            "static_memory_policy": Key("choice", choices=(0, 2, 3, 4), aliases=((1, 2),)),
            "atomic_clean_policy": Key("choice", choices=(0, 1)),
        },
    ),
    BlockKind.MEMONGER: (
        MemongerConfig,
        {
            "algo": Key("choice", choices=("greedy", "dp")),
            "ordering": Key("choice", choices=("topological", "longest_path")),
            "peak_slack": Key("float", lambda v: v >= 0, ">= 0"),
        },
    ),
    BlockKind.STEP: (
        StepConfig,
        {
            "loss": Key("choice", choices=LOSS_WORDS, text='a callable in quotes, `"losses.py:loss"`'),
            "autocast": Key("choice", choices=("none", "bf16", "fp16")),
            "optimizer": Key("choice", choices=tuple(OPTIMIZER_STATES)),
            "master_weights": Key("choice", choices=("none", "fp32")),
            "shards": Key("int", lambda v: v >= 1, ">= 1"),
            "mixed_precision": Key("choice", choices=("none", "bf16", "fp16")),
        },
    ),
}

_KIND_WORDS = {
    "size": "a size with a unit, e.g. `512 MiB`",
    "int": "an integer",
    "float": "a number",
    "selector": 'a selector in quotes, e.g. `"layers.*"`',
}


def _read(key: Key, value) -> tuple[object | None, str | None]:
    """Convert a parsed value to the key's Python type; return (value, None) or (None, problem).

    A problem is a wrong type (MP202); ranges and choices are checked by ``check_block``.
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key.kind == "size":
        if isinstance(value, Size):
            return value.bytes, None
        if number and value == 0:
            return 0, None
        return None, f"expects {_KIND_WORDS['size']}"
    if key.kind == "int":
        if number and isinstance(value, int):
            return value, None
        return None, f"expects {_KIND_WORDS['int']}"
    if key.kind == "float":
        if number:
            return float(value), None
        return None, f"expects {_KIND_WORDS['float']}"
    if key.kind == "selector":
        if isinstance(value, Text):
            return value.value, None
        return None, f"expects {_KIND_WORDS['selector']}"
    # choice: integers or words, as the choices are (and a spec `module:name` in quotes, where allowed)
    words = isinstance(key.choices[0], str)
    if key.text and isinstance(value, Text):
        if ":" in value.value.strip(":"):
            return value.value, None
        return None, f"expects one of {', '.join(key.choices)} or {key.text}"
    if words and isinstance(value, Word):
        return value.name, None
    if not words and number and isinstance(value, int):
        return value, None
    return None, "expects " + ("a word" if words else "an integer")


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
        if entry.value is None:  # a number out of range, already reported
            continue
        found = _value_diagnostic(block.kind, entry, key)
        if found is not None:
            diags.append(found)
    if block.kind is BlockKind.STEP and not diags:
        diags.extend(_step_diagnostics(block))
    unknown = [e.key for e in block.entries if e.key not in keys]
    for name, key in keys.items():
        misspelt = any(difflib.get_close_matches(u, [name], cutoff=0.6) for u in unknown)
        if key.required and name not in seen and not misspelt:  # a misspelling is reported already
            diags.append(
                Diagnostic(
                    "MP209",
                    f"`{block.kind.value}` block needs `{name}`",
                    block.span,
                    f"add `{name} = ...` ({_KIND_WORDS.get(key.kind, key.kind)}, {key.rule})",
                )
            )
    return diags


def _step_diagnostics(block: ConfigBlock) -> list[Diagnostic]:
    """A `step` block whose keys contradict each other: FSDP2's mixed precision on one rank."""
    config = config_of(block)
    assert isinstance(config, StepConfig)
    if config.mixed_precision != "none" and config.shards < 2:
        entry = next(e for e in block.entries if e.key == "mixed_precision")
        return [
            Diagnostic(
                "MP250",
                f"`mixed_precision = {config.mixed_precision}` is FSDP2's policy, and the step is not sharded",
                entry.span,
                "add `shards = N` (the FSDP2 ranks, at least 2), or leave out `mixed_precision`",
            )
        ]
    return []


def _value_diagnostic(kind: BlockKind, entry, key) -> Diagnostic | None:
    """What is wrong with one known key's value (mistyped, an alias, out of range), if anything."""
    value, problem = _read(key, entry.value)
    aliases = dict(key.aliases)
    if problem:
        return Diagnostic("MP202", f"`{entry.key}` {problem}", entry.span, _help_for(kind, entry.key))
    elif key.kind == "choice" and value in aliases:
        return Diagnostic(
            "MP210",
            f"`{entry.key} = {value}` is read as {aliases[value]}",
            entry.span,
            f"write `{entry.key} = {aliases[value]}`",
            severity=Severity.WARNING,
        )
    elif key.kind == "choice" and value not in key.choices and not isinstance(entry.value, Text):
        if isinstance(value, str):
            return Diagnostic(
                "MP204",
                f"unknown value `{value}` for `{entry.key}`",
                entry.span,
                did_you_mean(value, key.choices) or _help_for(kind, entry.key),
            )
        else:
            return Diagnostic(
                "MP203",
                f"`{entry.key} = {value}` is out of range",
                entry.span,
                _help_for(kind, entry.key),
            )
    elif not key.check(value):
        return Diagnostic("MP203", f"`{entry.key}` must be {key.rule}", entry.span, _help_for(kind, entry.key))
    return None


def _help_for(kind: BlockKind, name: str) -> str:
    key = SCHEMA[kind][1][name]
    if key.kind == "choice":
        return "allowed: " + ", ".join(str(c) for c in key.choices) + (f", or {key.text}" if key.text else "")
    return f"{_KIND_WORDS[key.kind]}, {key.rule}"


def config_of(block: ConfigBlock) -> BlockConfig:
    """The typed config of a block that ``check_block`` accepted."""
    cls, keys = SCHEMA[block.kind]
    values = {}
    for entry in block.entries:
        key = keys[entry.key]
        value, problem = _read(key, entry.value)
        assert problem is None, problem
        values[entry.key] = dict(key.aliases).get(value, value)
    return cls(**values)
