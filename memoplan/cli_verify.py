"""``memoplan verify``: a step with and without the plan (``memoplan.verification``), its report,
the plan's budget checked; a model that cannot run here is estimated on fake tensors (MP414)."""

from __future__ import annotations

import contextlib
import sys

from memoplan import cli_output, cli_target
from memoplan.cli_load import cache_warnings, load_example, load_model, progress, resolve_plan, show
from memoplan.cli_output import OUTPUT, load_plan
from memoplan.cli_step import checked, command_step, first_step, present, stepping
from memoplan.diagnostics import Diagnostic, Severity


def verify_command(args) -> int:
    """`memoplan verify`; with ``--format json|github`` the human-readable report goes to stderr."""
    OUTPUT.begin(str(args.plan))
    if not OUTPUT.collecting:
        return _verify_plan(args)
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds only the JSON document or annotations
        return _verify_plan(args)


def _verify_plan(args) -> int:
    device = cli_target.device(args.device, estimating=True)  # a device not here: only a model that cannot run anyway
    plan = load_plan(args.plan)
    step = command_step(args, plan, args.plan)
    model = load_model(plan, args.plan, args.model, required=True, seed=args.seed)
    example = load_example(plan, args.plan, args.example, required=True)
    resolved = resolve_plan(plan, model)
    checked(step, model, device, plan)
    with stepping(step, plan):
        return _verify_with(args, plan, device, step, model, example, resolved)


def _verify_with(args, plan, device, step, model, example, resolved) -> int:
    """`memoplan verify` once its step, model, example and resolved plan are known."""
    from memoplan.codegen.emit import plan_table
    from memoplan.syntax import ast
    from memoplan.verification import budget_check, dtr_check, render_report, verify

    print(f"resolved plan {args.plan} ({len(resolved.modules)} modules):")
    for row in plan_table(resolved):
        show(f"  {row}")
    if cli_target.cannot_run(model, device):
        return _verify_estimated(args, plan, model, example, device)
    cli_target.device(args.device)  # MP506: a real step needs the device here
    cache_warnings(resolved, model, example, plan)
    print(f"step: {step.describe()}")
    if step.config.shards > 1:
        print(
            f"  one process runs the whole step here: the {step.config.shards} FSDP2 ranks' sharding and "
            "mixed precision are estimated by `memoplan plan`, not measured"
        )
    progress(f"running one training step without and one with the plan{f' on {device}' if device else ''}")
    smaller = load_example(None, None, args.compare_example, required=True) if args.compare_example else None
    report = first_step(
        lambda: verify(
            model,
            resolved,
            example,
            seed=args.seed,
            rtol=args.rtol,
            device=device,
            compare_example=smaller,
            compile=args.compile,
        ),
        instead="`verify` estimates the unplanned peak only with `--compare-example` or when the full-size "
        "unplanned step does not fit; without them both steps run for real",
    )
    show(render_report(report))
    present(OUTPUT.current).details.update(cli_output.verify_details(report))
    missed = _budget_verdict(plan, lambda budget: budget_check(budget, report))
    dtr_block = plan.block(ast.BlockKind.DTR)
    unmet = dtr_check(dtr_block, report) if dtr_block is not None else None
    if unmet is not None:
        OUTPUT.diagnostic(unmet, plan.source)
    passed = report.equivalent and (missed is None or not missed.is_error) and unmet is None
    present(OUTPUT.current).status = "ok" if passed else "error"
    return 0 if passed else 1


def _verify_estimated(args, plan, model, example, device) -> int:
    """`memoplan verify` of a model on the meta device: the plan resolved (above), the peaks
    estimated, the budget checked against them, and MP414: equivalence is not checked."""
    from memoplan.verification import estimated_budget_check, estimated_verify

    progress("estimating one training step without and one with the plan on fake tensors")
    check = first_step(lambda: estimated_verify(model, plan, example, device))
    show(check.render())
    missed = _budget_verdict(plan, lambda budget: estimated_budget_check(budget, check))
    OUTPUT.diagnostic(
        Diagnostic(
            "MP414",
            f"`{args.plan}`: equivalence not checked: {check.why}",
            help="verify the plan on a smaller real build of the model (`memoplan docs meta`)",
            severity=Severity.WARNING,
        ),
        plan.source,
    )
    passed = missed is None or not missed.is_error
    present(OUTPUT.current).status = "ok" if passed else "error"
    return 0 if passed else 1


def _budget_verdict(plan, check) -> Diagnostic | None:
    """The plan's budget line (``check(budget)``: the line and a missed budget's diagnostic),
    printed, and that diagnostic reported; None when the plan has no budget or meets it."""
    if plan.budget is None:
        return None
    line, missed = check(plan.budget)
    print(line)
    if missed is not None:
        OUTPUT.diagnostic(missed, plan.source)
    return missed
