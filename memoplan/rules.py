"""Every diagnostic code memoplan emits, once: its stage, severity, summary and what to do.

The call sites keep writing their code as a literal (``Diagnostic("MP301", ...)``) next to the
message they build; this table is where a code is explained.  ``memoplan rule MP301`` prints
an entry, ``grammar/README.md``'s code table is generated from it (:func:`markdown_table`,
checked by ``tests/test_rules.py``), and that test fails on any ``MPnnn`` in the package's
source that has no entry here.

Codes are grouped by the hundreds, as :data:`RANGES` says; a group names what a code is about
(a value, a model's structure, running the plan), and :attr:`Rule.stage` says which stage
raises it.  Codes are never renumbered: scripts and CI logs match on them.  A new code takes
the next free number of its group.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

from memoplan.diagnostics import Severity, did_you_mean, printable


class Stage(enum.Enum):
    """The stage that raises a code (where in the pipeline a user sees it)."""

    SYNTAX = "syntax"  # parse and value checks: `memoplan check`, `parse`, `load`
    RESOLVE = "resolve"  # binding a plan to a model: `apply`, `explain`, `check --model`
    CHECK = "check"  # `memoplan check` with an example input
    VERIFY = "verify"  # `memoplan verify`: a measured step
    RUNTIME = "runtime"  # installing the plan, or a planned step running
    SPECS = "specs"  # loading `model` and `example` specs
    CLI = "CLI"  # the command line's own arguments
    PLANNER = "planner"  # `memoplan plan`
    REPORT = "report"  # `memoplan report`
    EDITOR = "editor"  # `memoplan lsp`


@dataclass(frozen=True)
class Range:
    first: int
    last: int
    topic: str
    stages: frozenset[Stage]

    def __contains__(self, number: int) -> bool:
        return self.first <= number <= self.last


_S = Stage
# What each group of codes is about, and the stages that may raise one of its codes.
RANGES: tuple[Range, ...] = (
    Range(100, 199, "lexical and grammar: the text is not a plan", frozenset({_S.SYNTAX})),
    Range(200, 219, "values: an option, key or argument that is wrong in itself", frozenset({_S.SYNTAX, _S.RESOLVE})),
    Range(
        220,
        239,
        "plan-wide statements (`budget`, `dtr`, `memory`, `sublinear`): where they act, whether they were met",
        frozenset({_S.SYNTAX, _S.RESOLVE, _S.VERIFY}),
    ),
    Range(240, 249, "the `memonger` block", frozenset({_S.SYNTAX, _S.RESOLVE})),
    Range(
        250,
        259,
        "the `step` block and `--loss`, `--autocast`, ...: the training step a plan is for",
        frozenset({_S.SYNTAX, _S.SPECS, _S.CLI}),
    ),
    Range(300, 399, "the plan against a model's structure", frozenset({_S.RESOLVE, _S.CHECK})),
    Range(400, 499, "installing a plan and running a planned step", frozenset({_S.RUNTIME})),
    Range(500, 509, "loading models and examples; the command line", frozenset({_S.SPECS, _S.CLI})),
    Range(510, 519, "`memoplan report`", frozenset({_S.REPORT})),
    Range(520, 529, "the language server", frozenset({_S.EDITOR})),
    Range(530, 539, "running a model's code in a child process", frozenset({_S.SPECS})),
    Range(540, 549, "renamed commands and words, still accepted for a release", frozenset({_S.CLI})),
    Range(550, 559, "what a command needs installed", frozenset({_S.CLI})),
    Range(600, 699, "the planner", frozenset({_S.PLANNER})),
)


@dataclass(frozen=True)
class Rule:
    code: str
    stage: Stage
    severity: Severity
    summary: str
    help: str

    def explain(self) -> str:
        """What ``memoplan rule CODE`` prints."""
        group = range_of(self.code)
        lines = [
            f"{self.code} ({self.severity.value}, raised by {self.stage.value})",
            "",
            _plain(self.summary),
            "",
            f"What to do: {_plain(self.help)}",
        ]
        if group is not None:
            lines += ["", f"MP{group.first}-MP{group.last}: {_plain(group.topic)}."]
        lines += ["", "Reference: `memoplan docs errors` (the language reference, section 7)."]
        return "\n".join(lines)


def _plain(text: str) -> str:
    return text.replace("`", "")


E, W, N = Severity.ERROR, Severity.WARNING, Severity.NOTE

# One row per code, one line per row (a table to read down): the formatter leaves it as written.
# fmt: off
_TABLE: tuple[tuple[str, Stage, Severity, str, str], ...] = (
    # ---- lexical and grammar
    ("MP100", _S.SYNTAX, E, "syntax error: an unexpected character or token (with what was expected), a unit in the wrong case, a single-quoted string", "write the construct the message expects; units are `B`, `KiB`, `MiB`, `GiB`, strings use double quotes"),
    ("MP101", _S.SYNTAX, E, "unknown statement, with a did-you-mean (`modle` -> `module`); a policy written outside a rule", "use a statement of the language's section 2 (`memoplan docs language`); policies go inside `module SELECTOR { ... }`"),
    ("MP102", _S.SYNTAX, E, "unknown policy in a rule, with a did-you-mean (`checkpointing` -> `checkpoint`)", "use one of the policies of the language's section 4 (`memoplan docs language`)"),
    ("MP103", _S.SYNTAX, E, "unsupported version in the header", "write `memplan 1`"),
    ("MP104", _S.SYNTAX, E, "no `memplan 1` header (or an empty file); a file read as a plan whose first statement is not the header is not shown in the diagnostic", "start the file with `memplan 1`"),
    ("MP105", _S.SYNTAX, E, "a quoted path segment that contains `.`, or is empty inside a longer path (`\"\"` alone is the root)", "quote one segment at a time: `\"a\".\"b\"`"),
    ("MP106", _S.SYNTAX, E, "a block not closed: at the end of the file, or before the next statement", "close the block with `}` before the next statement"),
    ("MP107", _S.SYNTAX, E, "the plan file cannot be read, is not a regular file (a folder, a device, a pipe), is not UTF-8, or holds NUL bytes (a binary file: none of it is shown)", "check the path and save the file as UTF-8"),
    ("MP108", _S.SYNTAX, E, "an invalid escape in a string", "use one of `\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX`"),
    ("MP109", _S.SYNTAX, E, "a plan over the size limit of 128 KiB (a file, standard input or text given to `parse`); nothing of it is parsed", "split the plan, or cover many modules with one wildcard rule"),
    # ---- values
    ("MP201", _S.SYNTAX, E, "unknown option, key or example argument, with a did-you-mean; an option that does not apply (`tolerance` on a lossless codec, `low`/`high` on a function other than `randint`)", "use an option the policy, block or function lists in the reference, or remove it"),
    ("MP202", _S.SYNTAX, E, "a value of the wrong type (an integer where a size is needed, a string where a word is, ...)", "write the value in the type the reference lists (a size with a unit, a bare word, ...)"),
    ("MP203", _S.SYNTAX, E, "a value out of range (every range in the language's sections 2–6, `memoplan docs language`; a number too large for a float)", "write a value inside the range the help gives"),
    ("MP204", _S.SYNTAX, E, "an unknown word for an option, key, dtype, tensor function or budget mode, with a did-you-mean", "use one of the words the help lists"),
    ("MP205", _S.SYNTAX, E, "a lossy codec not marked `lossy`, or `lossy` on a lossless codec", "write `lossy` (and a `tolerance`) after a lossy codec, and only there"),
    ("MP206", _S.SYNTAX, E, "a policy kind twice in one rule", "merge the two into one policy"),
    ("MP207", _S.SYNTAX, E, "`keep` together with `checkpoint`, `compress` or `temporal_chunk` in one rule; `segments` with `split`", "keep one of the contradicting policies or options"),
    ("MP208", _S.SYNTAX, E, "given twice: a statement that may appear once, an option, a key, an example argument", "remove the repetition (the note shows the first)"),
    ("MP209", _S.SYNTAX, E, "something required is missing: `eviction_threshold`, a lossy codec's `tolerance`, `randint`'s `high`", "add the missing option or key"),
    ("MP210", _S.SYNTAX, W, "`static_memory_policy = 1`, read as `2`", "write `static_memory_policy = 2`"),
    ("MP211", _S.SYNTAX, E, "`**` inside a glob segment (`layer**`): `**` stands alone between dots", "write `layer*` for one segment, or `**` alone for any number"),
    ("MP212", _S.SYNTAX, E, "`checkpoint save = [...]` names an op that is not one of `attention`, `conv`, `matmul`, nor one of their ops by its place (`matmul_2`)", "name ops from the list, e.g. `save = [matmul, attention]`"),
    ("MP213", _S.SYNTAX, E, "`checkpoint save = [...]` names an op twice (or a family and one of its ops), or is empty", "name each op once; drop `save` for a plain checkpoint"),
    ("MP214", _S.RESOLVE, E, "a codec the language knows but this installation's runtime does not implement (registered in `memoplan.enums` without an encoder)", "register its implementation with `memoplan.runtime.codecs.register`, or name a codec the runtime lists"),
    # ---- plan-wide statements
    ("MP222", _S.SYNTAX, N, "a `sublinear` block sets the search of `memoplan plan PLAN`", "nothing: run `memoplan plan PLAN` to search with it"),
    ("MP224", _S.SYNTAX, N, "a `budget` is checked by `memoplan verify`, not by `apply`", "run `memoplan verify` to measure the step against it"),
    ("MP225", _S.VERIFY, E, "`memoplan verify`: the planned peak is over a `hard` budget", "plan more memory away (`memoplan plan --budget`), raise the budget, or write it as `hint`"),
    ("MP226", _S.VERIFY, W, "`memoplan verify`: the planned peak is over a `hint` budget", "plan more memory away or raise the budget"),
    ("MP227", _S.SYNTAX, E, "`static_memory_policy = 2` or `4` without a `budget` in bytes to reserve", "add a `budget` in bytes, or use policy `3`"),
    ("MP228", _S.SYNTAX, N, "`static_memory_policy` on a machine without CUDA changes nothing there", "nothing: it acts on a CUDA machine"),
    ("MP230", _S.RESOLVE, E, "a `dtr` block with no candidate: every block of the model has a rule of its own", "remove the block, or rules that cover every block"),
    ("MP231", _S.VERIFY, E, "the `dtr` threshold was not met in the measured step (the candidates' kept inputs need more)", "raise `eviction_threshold`, or choose one with `memoplan plan --budget B --dtr`"),
    ("MP232", _S.RESOLVE, E, "the `dtr` block's `modules` is not a selector, matches nothing, or selects a module and one inside it", "name the candidate blocks with a selector that matches modules none of which contains another"),
    # ---- memonger
    ("MP240", _S.RESOLVE, E, "`memonger`: the model cannot be captured with `torch.export` (the module and the cause)", "make the forward exportable, or plan the model without a `memonger` block"),
    ("MP241", _S.RESOLVE, E, "`memonger`: the forward keeps state between calls (a tensor attribute assigned, a buffer written)", "an arena replays one fixed graph: plan stateful models without `memonger`"),
    ("MP242", _S.RESOLVE, E, "`memonger`: the captured graph holds something the arena module cannot run", "plan this model without a `memonger` block"),
    ("MP243", _S.RESOLVE, E, "`memonger` without an `example` (or applied from a `ResolvedPlan`, which has none)", "add an `example` statement, or apply the plan from its text"),
    ("MP244", _S.SYNTAX, N, "`check`: where the `memonger` block acts", "nothing: the block lays out the model's inference buffers when the plan is applied"),
    # ---- the step
    ("MP250", _S.SYNTAX, E, "`step`: `mixed_precision` (FSDP2's `MixedPrecisionPolicy`) without `shards` above 1", "add `shards = N` (the FSDP2 ranks), or leave out `mixed_precision`"),
    ("MP251", _S.SPECS, E, "the step's loss callable (`--loss FILE.py:callable`, `loss = \"...\"`) raised, or returned something other than a one-element floating-point tensor", "fix the callable: it is called with the model's output and returns the loss"),
    ("MP252", _S.SPECS, E, "`loss = model` (the model's own loss), and the model's output carries no `loss` (an attribute or key holding a tensor)", "give the example the labels the model takes its loss of, or write `loss = auto` / `sum`"),
    ("MP253", _S.CLI, E, "the step asks for a precision the device cannot run: autocast in a dtype the device has no autocast for, or parameters of a dtype it cannot compute in", "plan on a device that has it (`--device`), or change `--autocast` / `--mixed-precision`"),
    ("MP254", _S.CLI, E, "the plan's `step` block and the command line's `--loss`, `--autocast`, `--optimizer`, `--master-weights`, `--shards` or `--mixed-precision` disagree", "leave out the option (the plan's step is used), or change the `step` block"),
    ("MP255", _S.SYNTAX, N, "`check`: the `step` block sets the training step `memoplan plan`, `verify` and `report` run", "nothing: those commands run this step"),
    # ---- the plan against a model
    ("MP301", _S.RESOLVE, E, "a selector (or class filter) that matches no module, with the nearest paths or classes", "use a path `memoplan explain` lists, or a class the model has"),
    ("MP303", _S.RESOLVE, E, "two equally specific rules disagree about a module", "make one rule more specific, or give both the same policies"),
    ("MP304", _S.RESOLVE, E, "`temporal_chunk` would not be equivalent (SyncBatchNorm, attention, RNN, dropout, whole-sequence module)", "chunk a module without those, or write `allow_nonequivalent = true` to accept the difference"),
    ("MP305", _S.RESOLVE, E, "nested checkpoint regions without `nested = true`", "checkpoint one of the two, or write `nested = true`"),
    ("MP306", _S.RESOLVE, E, "`segments` on a module that is not an `nn.Sequential`", "put `segments` on an `nn.Sequential`"),
    ("MP307", _S.RESOLVE, W, "more `segments` than children", "ask for at most as many segments as children"),
    ("MP308", _S.RESOLVE, E, "`rng = off` over random modules", "leave `rng` at `preserve` where dropout runs"),
    ("MP309", _S.RESOLVE, E, "`compress` without `checkpoint` on the module", "add `checkpoint` to the module that compresses"),
    ("MP310", _S.RESOLVE, W, "`keep` inside a checkpoint region has no effect", "remove `keep`, or the checkpoint around it"),
    ("MP311", _S.RESOLVE, E, "one module object under two paths, treated differently", "give both paths the same policies"),
    ("MP312", _S.RESOLVE, E, "`checkpoint` on a container that is never called (`nn.ModuleList`, `nn.ModuleDict`)", "checkpoint its children: `module layers.* { checkpoint }`"),
    ("MP314", _S.RESOLVE, E, "a stateful module inside a region is not marked `state = functional`", "add a rule `state = functional` for it"),
    ("MP315", _S.RESOLVE, E, "`state = functional` on a module that does not expose its state and holds no module that does", "mark the stateful module itself, or give it the state protocol"),
    ("MP316", _S.RESOLVE, E, "`temporal_chunk` together with `segments`/`split` on one module", "use one of the two on a module"),
    ("MP317", _S.RESOLVE, E, "`impl = torch` on a region that needs memoplan's own", "remove `impl = torch`"),
    ("MP319", _S.RESOLVE, E, "`split` names a non-child, or children out of order", "name the module's own children, in order, not the first"),
    ("MP320", _S.RESOLVE, E, "a region of its own, holding a BatchNorm, inside time chunks", "checkpoint the chunked module instead of the region inside it"),
    ("MP321", _S.RESOLVE, W, "`boundaries = recompute` where no module carries state between chunks", "remove `boundaries = recompute`"),
    ("MP322", _S.RESOLVE, W, "the plan checkpoints a model whose own (Hugging Face) activation checkpointing is on", "turn the model's own checkpointing off (`model.activation_checkpointing_disable()`; the Trainer's `activation_checkpointing=False`, before transformers 5 `gradient_checkpointing`), or drop the plan's checkpoint rules"),
    ("MP323", _S.RESOLVE, E, "a region starts with a module that overwrites its input in place (`inplace=True`)", "checkpoint the enclosing module the help names"),
    ("MP324", _S.CHECK, E, "with an example: `temporal_chunk ... dim d` past the dimensions of the input the chunked module sees", "chunk a dimension the input has"),
    ("MP325", _S.RESOLVE, E, "`checkpoint save = [...]` on a region that also compresses, chunks time or threads state", "drop `save` or the other policy: memoplan's own region does not save ops"),
    # ---- installing and running
    ("MP327", _S.CHECK, W, "with an example: in training, the model returns a transformers cache (`use_cache=True`) that the plan's regions write; the bytes it holds (`check`, `verify`, `plan`)", "train with `use_cache=False` (`model.config.use_cache = False`): that frees them"),
    ("MP401", _S.RUNTIME, E, "a plan that cannot be installed on this model: no such module", "apply the plan to the model it was resolved for"),
    ("MP402", _S.RUNTIME, E, "a plan that cannot be installed on this model: a module of another type", "apply the plan to the model it was resolved for"),
    ("MP403", _S.RUNTIME, E, "a plan that cannot be installed: a module's `forward` is already patched", "remove the other patch (or `memoplan.remove` the earlier plan) first"),
    ("MP405", _S.RUNTIME, E, "a value the codec cannot hold", "use a codec that holds it (`none`, `uint8`, `auto`) or mark a lossy one `lossy`"),
    ("MP406", _S.RUNTIME, E, "setting a module's `forward` raised; every module is restored", "the module's class refuses attribute assignment: leave it out of the plan"),
    ("MP407", _S.RUNTIME, E, "a region overwrote one of its inputs in place (its recompute would read the new values)", "checkpoint the enclosing module, or make the op out of place"),
    ("MP408", _S.RUNTIME, E, "`temporal_chunk ... dim d` past the chunked input's dimensions: the rule's `file:line`, the module, the shape", "chunk a dimension the input has"),
    ("MP409", _S.RUNTIME, E, "a planned model cannot be pickled (a forward that is not a module-level function)", "pickle the unplanned model and apply the plan after loading"),
    ("MP410", _S.RUNTIME, E, "no folder can hold `apply`'s generated code: neither the cache folder nor a temporary one can be written or trusted (a folder of another user, a link), or the cached module is not what was written; nothing runs", "set `MEMOPLAN_CACHE_DIR` or `XDG_CACHE_HOME` to a folder of yours that only you can write"),
    ("MP411", _S.RUNTIME, E, "a training step ran out of memory (CPU or CUDA allocator): the bytes it asked for and which step (unplanned, planned, profile); or the model's factory did (a model too big to build here); nothing is written", "`memoplan profile` and `plan` estimate a step that does not fit (`--method estimated`); for a planned step, lower the budget or the example; a model too big to build: build it on the meta device (`memoplan docs meta`)"),
    ("MP412", _S.RUNTIME, E, "a step of `memoplan verify` wrote one of the model's parameters in place: verify without the full-size unplanned step shares the weights between its copies, so it cannot compare", "keep in-place updates of weights (an optimizer step) out of the model's forward, or verify at a size where the unplanned step fits"),
    ("MP413", _S.RUNTIME, E, "a command that runs real training steps (`--method measured`, `plan --dtr`) given a model that cannot run here: built on the meta device, or for a CUDA device this machine lacks", "`memoplan profile` and `plan` estimate its step on fake tensors (`--method estimated`, what `auto` does for it); run real steps on a smaller real build (`memoplan docs meta`)"),
    ("MP414", _S.RUNTIME, W, "`memoplan verify` or `report` of a model on the meta device: the plan is resolved and its peaks estimated on fake tensors, but no step runs, so equivalence is not checked", "verify the same plan on a smaller real build of the model (fewer layers, the same blocks; `memoplan docs meta`)"),
    ("MP415", _S.RUNTIME, W, "under `torch.compile`, Dynamo could not trace inside a checkpointed region: the graph breaks there and the region runs eagerly (once per region: its path and Dynamo's reason)", "make the module traceable (the reason names what), or leave it out of the plan; an HF model in training: `use_cache=False`"),
    ("MP416", _S.RUNTIME, W, "in training, a region was given a transformers cache (`use_cache=True`) and wrote it: the returned cache holds every layer's keys and values (once per process, at the first such region)", "train with `use_cache=False` (`model.config.use_cache = False`)"),
    ("MP417", _S.RUNTIME, W, "under `torch.compile`, memoplan's own region (`compress`, `state = functional`, `temporal_chunk`) is not traced into the model's graph: the graph breaks at it (once per region)", "use a plain `checkpoint` where the model must compile whole; the results are the same either way"),
    ("MP418", _S.RUNTIME, W, "under `torch.compile`, the `dtr` block cannot evict at run time: its candidates run as a static checkpoint choice made when Dynamo traces (the dtr simulator's, from the last eager step's sizes; every candidate before one), said once per choice with what is checkpointed", "run one eager training step before compiling for the simulator's choice; `dtr_stats` counts eager steps only"),
    ("MP421", _S.RUNTIME, E, "`atomic_clean_policy = 0` under DDP with `gradient_as_bucket_view=True`", "leave `atomic_clean_policy` at its default under DDP"),
    ("MP422", _S.RUNTIME, E, "`atomic_clean_policy = 0` after FSDP2 replaced the parameters", "leave `atomic_clean_policy` at its default under FSDP2"),
    ("MP423", _S.RUNTIME, E, "expandable segments asked for after CUDA memory was already reserved", "apply the plan before anything allocates on CUDA"),
    ("MP424", _S.RUNTIME, E, "a generated plan module (`memoplan write-module`) written for a runtime interface this memoplan cannot run (its `RUNTIME_ABI`), refused on import", "regenerate the module with this memoplan (`memoplan write-module PLAN -o FILE.py`), or install the memoplan that generated it"),
    ("MP430", _S.RUNTIME, W, "the `dtr` threshold cannot be met even with every candidate evicted", "raise `eviction_threshold` above what the candidates' kept inputs need"),
    ("MP431", _S.RUNTIME, E, "an input a `dtr` candidate kept was changed in place after its forward: it cannot be recomputed", "make the change out of place, or leave the module out of `modules`"),
    ("MP433", _S.RUNTIME, E, "a `dtr` recompute saved different tensors than the forward (control flow on something else)", "leave the module out of the `dtr` block's `modules`"),
    ("MP434", _S.RUNTIME, E, "a tensor a `dtr` candidate saved was changed in place before backward (autograd refuses it too)", "make the change out of place"),
    ("MP440", _S.RUNTIME, E, "the `memonger` arena cannot be installed: the model's forward is already replaced on the instance", "remove the other patch first"),
    # ---- specs, the command line
    ("MP501", _S.SPECS, E, "a `model` spec without `:`", "write `package.module:function` or `path/to/file.py:function`"),
    ("MP502", _S.SPECS, E, "a model or example spec that cannot be found (no file, no module, no example input)", "check the spec's path, or pass `--example`"),
    ("MP503", _S.SPECS, E, "a model or example spec's attribute does not exist", "name a function or object the module defines"),
    ("MP504", _S.SPECS, E, "the user's model or example code raised (any exception but `KeyboardInterrupt`, `sys.exit()` too)", "fix the model's code; the traceback's last line is in the message"),
    ("MP505", _S.SPECS, E, "a model or example factory returned the wrong type", "return an `nn.Module` (model) or tensors (example)"),
    ("MP506", _S.CLI, E, "`--device` that is not a device, or not on this machine", "leave out `--device` to run on the CPU, or name a CUDA device this machine has"),
    ("MP507", _S.SPECS, E, "an inline example too large to build: its sizes overflow 64 bits, or it needs more bytes than the machine's memory", "use smaller sizes"),
    ("MP508", _S.CLI, E, "`-o PATH` (or a plan `fmt` rewrites) cannot be written: a directory, a device or anything not a regular file, a folder that does not exist, one of the command's inputs (the plan, the model's file), no permission, a full disk; the file is left as it was", "give `-o` the path of a regular file (or a new one) in an existing folder, other than the command's inputs"),
    ("MP509", _S.CLI, E, "`memoplan plan --budget device` where the step does not run on CUDA, or a device budget that is malformed or leaves nothing", "plan on CUDA (`--device cuda`), or give the budget in bytes (`--budget 8GiB`)"),
    ("MP510", _S.REPORT, E, "`memoplan report` needs matplotlib (the `report` extra), checked before any work", "pip install 'memoplan[report]'"),
    ("MP512", _S.REPORT, E, "`memoplan report --budgets F`: a budget of the sweep that is not a share of the unplanned peak in (0, 1]", "give shares such as `0.5,0.75`"),
    ("MP520", _S.EDITOR, W, "`memoplan lsp` with `loadModel`: the model process timed out or exited (the plan's `model` line)", "run `memoplan check --model` on the plan to see the model's own error"),
    ("MP521", _S.EDITOR, W, "`memoplan lsp`: checking the document failed inside memoplan (a bug); the server goes on", "report it with the plan text"),
    ("MP522", _S.EDITOR, E, "`memoplan lsp`: a document over the size limit (128 KiB, `memoplan check`'s `MP109`) is not checked; hover, completion and formatting are off for it", "split the plan, or cover many modules with one wildcard rule"),
    ("MP530", _S.SPECS, E, "`--isolate`: the model's code killed the process with a signal (os.abort(), a fault in a C extension, the out-of-memory killer)", "run the plan's `model` or `example` code on its own to find the crash"),
    ("MP531", _S.SPECS, E, "`--isolate`: the process ended before memoplan finished (os._exit() in the model's code)", "raise an exception or call sys.exit() instead: memoplan reports those as MP504"),
    ("MP532", _S.SPECS, E, "`--isolate`: the child process could not be started", "run the command without --isolate (and without MEMOPLAN_ISOLATE=1)"),
    ("MP540", _S.CLI, W, "an old name the command line still accepts for a release: the command `memoplan compile` (now `memoplan write-module`), the budget words `speed`, `balanced`, `memory` (now `checkpoint-half`, `checkpoint-three-quarters`, `checkpoint-all`); it runs as the new name", "write the new name (`memoplan.deprecations` lists them)"),
    ("MP550", _S.CLI, E, "a command that builds or runs a model (all but `check --syntax-only`, `fmt`, `rule` and the language server's syntax checks) where PyTorch is not installed: memoplan installs without it", "pip install 'memoplan[torch]' (the torch releases memoplan is tested with), or install the torch build you want first"),
    # ---- the planner
    ("MP601", _S.PLANNER, E, "`memoplan plan`: no plan of the search meets a `hard` budget", "raise the budget (the message gives the least reachable peak) or write it as `hint`"),
    ("MP602", _S.PLANNER, E, "`memoplan plan --dtr`: a budget that is not in bytes, or that eviction cannot meet", "give the budget in bytes, above the least the message gives"),
    ("MP603", _S.PLANNER, E, "`memoplan profile` or `plan`: `--method measured` with `--shards N` (or WORLD_SIZE) above 1: a sharded FSDP2 step runs only under torch.distributed, so memoplan cannot measure it", "leave out `--method measured` (one rank's step is estimated on fake tensors), or profile and plan one unsharded rank with `--shards 1`"),
    ("MP604", _S.PLANNER, E, "`memoplan plan --profile FILE` (or `memoplan.plan(profile=...)`): the profile was taken for another step than the one planned (its loss, autocast, optimizer, master weights, shards or mixed precision, the parameters' or the example's dtypes, or the device type)", "profile the step you plan (`memoplan profile` with the same step options and --device), or plan without --profile"),
)
# fmt: on

RULES: dict[str, Rule] = {code: Rule(code, stage, sev, summary, help) for code, stage, sev, summary, help in _TABLE}


def range_of(code: str) -> Range | None:
    number = int(code[2:]) if code[2:].isdigit() else -1
    return next((r for r in RANGES if number in r), None)


def markdown_table() -> str:
    """The code table of ``grammar/README.md`` section 7, one row per code in order."""
    rows = ["| code | stage | severity | meaning |", "| --- | --- | --- | --- |"]
    for code in sorted(RULES):
        rule = RULES[code]
        rows.append(f"| `{code}` | {rule.stage.value} | {rule.severity.value} | {rule.summary} |")
    return "\n".join(rows) + "\n"


def ranges_table() -> str:
    """The table of code groups, for ``grammar/README.md`` section 7."""
    rows = ["| codes | about | raised by |", "| --- | --- | --- |"]
    for r in RANGES:
        stages = ", ".join(sorted(s.value for s in r.stages))
        rows.append(f"| `MP{r.first}`–`MP{r.last}` | {r.topic} | {stages} |")
    return "\n".join(rows) + "\n"


def print_rule(code: str | None) -> int:
    """``memoplan rule [CODE]``: one code's explanation, or every code's summary; 2 for no such code."""
    if code is None:
        for name, entry in sorted(RULES.items()):
            print(f"{name}  {entry.severity.value:<7}  {_plain(entry.summary)}")
        return 0
    key = code.strip().upper()
    if key not in RULES:
        hint = did_you_mean(key, RULES) or "`memoplan rule` lists every code"
        print(f"error: no diagnostic code `{printable(code)}`; {hint}", file=sys.stderr)  # echoed: escaped
        return 2
    print(RULES[key].explain())
    return 0


def reference_block() -> str:
    """The generated part of ``grammar/README.md`` section 7: the group table, then the code table."""
    return f"{BEGIN}\n{ranges_table()}\n{markdown_table()}{END}\n"


BEGIN = "<!-- generated from memoplan/rules.py: begin -->"
END = "<!-- generated from memoplan/rules.py: end -->"


if __name__ == "__main__":
    print(reference_block(), end="")
