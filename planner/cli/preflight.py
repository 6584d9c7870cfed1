"""``batchplan preflight``: go/no-go checks before a job is submitted. Exit 0 all good, 1 a check failed,
2 bad input or unreachable cluster."""

from __future__ import annotations

import argparse

from planner.cli.options import add_cluster_options, add_job_options, flag_of, job_from_args
from planner.cli.output import echo, print_json
from planner.cli.planning import run_planning
from planner.cli.spec_flags import FlagForm, add_spec_flags, spec_from_args
from planner.cli.user_code import user_code_summary
from planner.errors import InfeasiblePlanError
from planner.preflight import Thresholds

#: the thresholds' flags are their fields' (planner.preflight.Thresholds): name, default, type, docstring
THRESHOLD_FLAG_FORMS: dict[str, FlagForm] = {
    "max_imbalance": FlagForm(help="largest idle share of a step allowed for any rank"),
    "min_subset_gain": FlagForm(help="fail if dropping some GPU types would be this many times faster"),
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="go/no-go checks before submitting a job (exit 0 go, 1 no-go, 2 bad input)",
        description="Probe and plan like `plan`, then check the result against thresholds.",
    )
    add_cluster_options(p)
    add_job_options(p)
    add_spec_flags(p.add_argument_group("thresholds"), Thresholds, THRESHOLD_FLAG_FORMS)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-o", "--output", help="also write the plan to this file when all checks pass")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from planner.preflight import SCHEMA, Check, run_checks

    thresholds = spec_from_args(Thresholds, THRESHOLD_FLAG_FORMS, args)
    job = job_from_args(args)
    try:
        outcome = run_planning(args, job, allow_infeasible=True)
    except InfeasiblePlanError as exc:  # --require-all-nodes and a node missing
        from planner.preflight import FIXES

        fix = FIXES["nodes_present"].format(expect_nodes=flag_of("expect_nodes"))
        checks = [Check(name="nodes_present", ok=False, detail=str(exc), fix=fix)]
        plan = None
    else:
        checks = run_checks(
            inventories=outcome.inventories,
            failed_nodes=outcome.failed_nodes,
            expected_node_names=outcome.expected_nodes,
            plan=outcome.plan,
            plan_error=outcome.error,
            thresholds=thresholds,
            name_of=flag_of,
        )
        plan = outcome.plan
    summary = user_code_summary(job)
    if summary:  # the user's module was imported and run, before anything else: a scheduler's log says so
        checks.insert(0, Check(name="user_code", ok=True, detail=summary))
    ok = all(c.ok for c in checks)
    if ok and plan is not None and args.output:
        from planner.plan.io import write_plan

        write_plan(plan, getattr(args, "output_path", None) or args.output)
    if args.json:
        print_json({"schema": SCHEMA, "ok": ok, "checks": [c.to_json() for c in checks],
                    "plan": plan.to_json() if plan is not None else None})
    else:
        for check in checks:
            status = "FAIL" if not check.ok else "warn" if check.warning else "ok  "
            fix = f" (fix: {check.fix})" if check.fix else ""
            echo(f"{status}  {check.name}: {check.detail.removeprefix('warning: ')}{fix}")
        echo("preflight: " + ("go" if ok else "no-go"))
    return 0 if ok else 1
