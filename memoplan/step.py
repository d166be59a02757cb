"""Step stage: the training step a plan is made for — its loss, precision, optimizer and sharding.

The step is data: a :class:`~memoplan.syntax.blocks.StepConfig`, read once from a plan's
``step { ... }`` block, from the command line (``--loss``, ``--autocast``, ``--optimizer``,
``--master-weights``, ``--shards``, ``--mixed-precision``: :func:`merged`, which refuses a
disagreement with the plan's block, ``MP254``) or from the Python API (``step=``).  This module
runs it: :func:`make_step` turns the config into a :class:`Step` (the loss callable loaded,
the dtypes as torch dtypes), and :func:`running` makes it the step that
:func:`memoplan.measure.training_step` runs — for the profile, the estimate, every trial of the
planner, ``verify`` and ``report`` alike — until the block ends.

* **The loss.**  ``auto``: the model's own loss where its output carries one (an attribute or
  key ``loss`` holding a tensor: a Hugging Face model given ``labels``), else ``sum``;
  ``sum``: ``t.float().sum()`` over every floating-point tensor of the output (what a step
  without a loss of its own allocates least for, and what memoplan ran before steps were
  declared); ``model``: the model's own, and ``MP252`` where the output has none;
  ``FILE.py:callable`` (or ``pkg.module:callable``): called with the output, returning a
  one-element floating-point tensor; one that raises or returns anything else is ``MP251``.
* **Autocast.**  The forward and the loss run under ``torch.autocast(device, dtype)``, the
  backward outside it, as the PyTorch AMP recipe writes a step.
* **Parameters** keep the dtypes they were built with.  **Optimizer state** is counted in the
  dtype the optimizer keeps it in: ``torch.optim``'s Adam, AdamW and SGD-with-momentum make
  their state with ``zeros_like(param)`` (bf16 parameters, bf16 state); with
  ``master_weights = fp32`` each parameter that is not fp32 has an fp32 copy and its state is
  fp32 (:func:`optimizer_state_bytes`).
* **FSDP2 mixed precision** (``mixed_precision``, with ``shards``): ``MixedPrecisionPolicy(
  param_dtype=..., reduce_dtype=torch.float32)`` — the gathered parameters, the compute and the
  gradients autograd makes are in that dtype, and each gradient is reduce-scattered into an
  fp32 shard of the parameter as built (:mod:`memoplan.planner.profiling.estimate` counts both).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memoplan.diagnostics import Diagnostic, PlanError, Span
from memoplan.syntax import ast
from memoplan.syntax.blocks import OPTIMIZER_STATES, StepConfig, config_of

__all__ = [
    "DTYPES",
    "STEP",
    "Step",
    "StepConfig",
    "as_written",
    "check_precision",
    "current",
    "make_step",
    "merged",
    "optimizer_state_bytes",
    "running",
    "step_block",
    "sum_loss",
]

LossFn = Callable[[Any], torch.Tensor]

#: The dtype words of a `step` block and the command line.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sum_loss(output: Any) -> torch.Tensor:
    """Sum of ``t.float().sum()`` over every floating-point tensor in ``output`` (``loss = sum``)."""
    import torch.utils._pytree as pytree

    terms = [
        leaf.float().sum()
        for leaf in pytree.tree_leaves(output)
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
    ]
    if not terms:
        raise ValueError("the model's output holds no floating-point tensor to take a loss of")
    loss = terms[0]
    for term in terms[1:]:
        loss = loss + term
    return loss


def own_loss(output: Any) -> torch.Tensor | None:
    """The loss the model's output carries (an attribute or key ``loss`` holding a tensor), or None."""
    if isinstance(output, Mapping):
        found = output.get("loss")
    else:
        found = getattr(output, "loss", None)
    return found if isinstance(found, torch.Tensor) else None


def auto_loss(output: Any) -> torch.Tensor:
    """``loss = auto``: the model's own loss where its output carries one, else :func:`sum_loss`."""
    found = own_loss(output)
    return found if found is not None else sum_loss(output)


@dataclass(frozen=True)
class _ModelLoss:
    """``loss = model``: the model's own loss, MP252 where the output carries none."""

    span: Span | None

    def __call__(self, output: Any) -> torch.Tensor:
        found = own_loss(output)
        if found is None:
            raise PlanError(
                (
                    Diagnostic(
                        "MP252",
                        f"`loss = model`: the model's output ({type(output).__name__}) carries no `loss`",
                        self.span,
                        "give the example the labels the model takes its loss of (e.g. `labels`), "
                        "or write `loss = auto` (the sum where there is none) or `loss = sum`",
                    ),
                )
            )
        return found


@dataclass(frozen=True)
class _UserLoss:
    """``loss = "file.py:callable"``: the user's callable, MP251 where it raises or returns no loss."""

    spec: str
    fn: Callable[[Any], Any]
    span: Span | None

    def __call__(self, output: Any) -> torch.Tensor:
        from memoplan.planner.profiling.shrink import is_out_of_memory
        from memoplan.specs import describe_exception

        try:
            loss = self.fn(output)
        except (PlanError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if is_out_of_memory(exc) or _data_dependent(exc):
                raise  # the step's own outcome: an estimate retries, `auto` switches to one
            message = describe_exception(exc).split("\n", 1)[0]
            raise PlanError((self._refused(f"raised {message}"),)) from None
        if not (isinstance(loss, torch.Tensor) and loss.is_floating_point() and loss.numel() == 1):
            what = (
                f"a tensor of shape {tuple(loss.shape)} and dtype {loss.dtype}"
                if isinstance(loss, torch.Tensor)
                else type(loss).__name__
            )
            raise PlanError((self._refused(f"returned {what}"),))
        return loss

    def _refused(self, what: str) -> Diagnostic:
        return Diagnostic(
            "MP251",
            f"the step's loss `{self.spec}` {what}",
            self.span,
            "it is called with the model's output and returns the loss: a one-element floating-point tensor",
        )


def as_written(loss: LossFn) -> LossFn:
    """The function ``loss`` calls: a user's callable itself, without the wrapper that turns its
    failures into MP251 (for code that compiles the step: ``memoplan report --peers``)."""
    return loss.fn if isinstance(loss, _UserLoss) else loss


def _data_dependent(exc: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException

    return isinstance(exc, DataDependentOutputException)


@dataclass(frozen=True)
class Step:
    """A :class:`StepConfig` ready to run: its loss callable and its dtypes."""

    config: StepConfig
    loss: LossFn
    autocast: torch.dtype | None = None
    mixed_precision: torch.dtype | None = None

    @property
    def master_weights(self) -> bool:
        return self.config.master_weights == "fp32"

    def forward_context(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """Where the forward and the loss run: under autocast when the step asks for it."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)

    def describe(self) -> str:
        """The step in words, for headers and progress lines: only what differs from the default."""
        return describe(self.config)


def describe(config: StepConfig) -> str:
    """``config`` as ``key value`` pairs, what differs from the default step only (``default`` if none)."""
    default = StepConfig()
    parts = [
        f"{f.name} {getattr(config, f.name)}"
        for f in fields(config)
        if getattr(config, f.name) != getattr(default, f.name)
    ]
    return ", ".join(parts) or "default (loss auto)"


def make_step(
    config: StepConfig | None = None, *, base_dir: Path | str | None = None, spans: Mapping[str, Span] | None = None
) -> Step:
    """The step ``config`` describes: its loss loaded (a file spec relative to ``base_dir``, the
    plan's folder), its dtypes looked up.  ``spans``: where each key is written (the `step`
    block's entries), for the diagnostics of a loss that cannot load or run."""
    from memoplan.specs import load_callable

    config = config or StepConfig()
    span = (spans or {}).get("loss")
    loss: LossFn
    if config.loss == "auto":
        loss = auto_loss
    elif config.loss == "sum":
        loss = sum_loss
    elif config.loss == "model":
        loss = _ModelLoss(span)
    else:
        loss = _UserLoss(config.loss, load_callable(config.loss, base_dir=base_dir, span=span), span)
    return Step(
        config,
        loss,
        autocast=DTYPES.get(config.autocast),
        mixed_precision=DTYPES.get(config.mixed_precision),
    )


#: The step :func:`memoplan.measure.training_step` runs (None: the default step, ``loss = auto``).
STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar("memoplan_step", default=None)


def current() -> Step | None:
    """The step set by :func:`running`, if any."""
    return STEP.get()


@contextlib.contextmanager
def running(step: Step | None) -> Iterator[Step | None]:
    """Make ``step`` the one every training step memoplan runs takes, until the block ends."""
    token = STEP.set(step)
    try:
        yield step
    finally:
        STEP.reset(token)


# ---------------------------------------------------------------- the step block and the command line

#: The command line's option for each key of the `step` block (its ``argparse`` dest is the key).
OPTIONS = {
    "loss": "--loss",
    "autocast": "--autocast",
    "optimizer": "--optimizer",
    "master_weights": "--master-weights",
    "shards": "--shards",
    "mixed_precision": "--mixed-precision",
}


def step_block(plan: ast.Plan | None) -> tuple[StepConfig | None, dict[str, Span]]:
    """The plan's `step` block as a config and where each key is written (None: no block)."""
    block = None if plan is None else plan.block(ast.BlockKind.STEP)
    if block is None:
        return None, {}
    config = config_of(block)
    assert isinstance(config, StepConfig)
    return config, {entry.key: entry.span for entry in block.entries}


def merged(
    written: StepConfig | None, spans: Mapping[str, Span], given: Mapping[str, Any], source: str | None = None
) -> StepConfig:
    """The step a command runs: the plan's block (``written``), with each option ``given`` (not
    None) over it; an option that contradicts a key the block writes is ``MP254`` at that key.
    ``source`` is the plan's text, for the diagnostic's source line."""
    config = written or StepConfig()
    found = []
    changes = {}
    for key, value in given.items():
        if value is None:
            continue
        if written is not None and key in spans and getattr(written, key) != value:
            found.append(
                Diagnostic(
                    "MP254",
                    f"`{OPTIONS[key]} {value}` contradicts the plan's step: `{key} = {_shown(getattr(written, key))}`",
                    spans[key],
                    f"leave out `{OPTIONS[key]}` (the plan's step is run), or change the `step` block",
                )
            )
        changes[key] = value
    if found:
        raise PlanError(tuple(found), source)
    config = replace(config, **changes)
    if config.mixed_precision != "none" and config.shards < 2:
        raise PlanError(
            (
                Diagnostic(
                    "MP250",
                    f"`--mixed-precision {config.mixed_precision}` is FSDP2's policy, and the step is not sharded",
                    spans.get("mixed_precision"),
                    "give `--shards N` (the FSDP2 ranks, at least 2), or leave out `--mixed-precision`",
                ),
            ),
            source,
        )
    return config


def _shown(value: Any) -> str:
    """A key's value as the block writes it: a spec in quotes."""
    return f'"{value}"' if isinstance(value, str) and ":" in value else str(value)


def as_block(config: StepConfig) -> ast.ConfigBlock:
    """``config`` as a `step` block: the keys that differ from the default, in the schema's order."""
    default = StepConfig()
    entries = []
    for f in fields(config):
        value = getattr(config, f.name)
        if value == getattr(default, f.name) and f.name != "loss":
            continue
        if isinstance(value, int):
            written: ast.Value = value
        elif f.name == "loss" and ":" in value:
            written = ast.Text(value)
        else:
            written = ast.Word(value)
        entries.append(ast.ConfigEntry(f.name, written))
    return ast.ConfigBlock(ast.BlockKind.STEP, tuple(entries))


# ---------------------------------------------------------------- what the device can do and what the optimizer keeps


def check_precision(
    step: Step, model: nn.Module, device: torch.device, spans: Mapping[str, Span] | None = None
) -> None:
    """MP253 where ``device`` cannot run the step's precision: autocast there, or in that dtype;
    parameters (as built, or FSDP2's compute dtype) in bfloat16 on a CUDA device without it."""
    spans = spans or {}
    problems = []
    if step.autocast is not None and not torch.amp.is_autocast_available(device.type):
        problems.append(("autocast", f"`autocast = {step.config.autocast}`: torch has no autocast on {device.type}"))
    dtypes = {p.dtype for p in model.parameters()} | ({step.mixed_precision} if step.mixed_precision else set())
    dtypes |= {step.autocast} if step.autocast is not None else set()
    if torch.bfloat16 in dtypes and device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index < torch.cuda.device_count() and not _cuda_bf16(index):
            key = "autocast" if step.autocast is torch.bfloat16 else "mixed_precision"
            problems.append((key, f"bfloat16 on {torch.cuda.get_device_name(index)}, which cannot compute in it"))
    if problems:
        raise PlanError(
            tuple(
                Diagnostic(
                    "MP253",
                    f"the step asks for a precision {device} cannot run: {what}",
                    spans.get(key),
                    "plan for a device that has it (`--device`), or change `--autocast` / `--mixed-precision`",
                )
                for key, what in problems
            )
        )


def _cuda_bf16(index: int) -> bool:
    with torch.cuda.device(index):
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def optimizer_state_bytes(model: nn.Module, optimizer: str, shards: int = 1, *, master_weights: bool = False) -> int:
    """What the optimizer keeps per rank between steps, sharded ``1/shards``: ``OPTIMIZER_STATES``
    tensors the size of each trainable parameter, in the parameter's dtype (``torch.optim`` makes
    them with ``zeros_like``); with ``master_weights``, an fp32 copy of each parameter that is not
    fp32 and the state in fp32.  (Adam's step counters, one scalar a parameter, live on the CPU.)"""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATES)}, not {optimizer!r}")
    states = OPTIMIZER_STATES[optimizer]
    total = 0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        size = p.element_size()
        if master_weights and p.is_floating_point() and p.dtype != torch.float32:
            total += p.numel() * 4 * (states + 1)
        else:
            total += p.numel() * size * states
    return -(-total // shards)
