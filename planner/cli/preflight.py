"""``batchplan preflight``: go/no-go checks before a job is submitted. Exit 0 all good, 1 a check failed,
2 bad input or unreachable cluster."""

from __future__ import annotations

import argparse

from planner.cli.options import add_cluster_options, add_job_options, job_from_args
from planner.cli.output import echo, print_json
from planner.cli.planning import run_planning
from planner.cli.user_code import user_code_summary
from planner.errors import ConfigError, InfeasiblePlanError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "preflight",
        help="go/no-go checks before submitting a job (exit 0 go, 1 no-go, 2 bad input)",
        description="Probe and plan like `plan`, then check the result against thresholds.",
    )
    add_cluster_options(p)
    add_job_options(p)
    g = p.add_argument_group("thresholds")
    g.add_argument("--max-imbalance", type=float, default=0.15,
                   help="largest idle share of a step allowed for any rank (default 0.15)")
    g.add_argument("--expect-nodes", type=int, help="nodes that must answer")
    g.add_argument("--expect-gpus", type=int, help="ranks the plan must have at least")
    g.add_argument("--min-subset-gain", type=float, default=1.10,
                   help="fail if dropping some GPU types would be this many times faster (default 1.10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-o", "--output", help="also write the plan to this file when all checks pass")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from planner.preflight import SCHEMA, Check, Thresholds, run_checks

    if not 0 <= args.max_imbalance <= 1:
        raise ConfigError(f"--max-imbalance {args.max_imbalance} is invalid (use a share in [0, 1])")
    for flag, value in (("--expect-nodes", args.expect_nodes), ("--expect-gpus", args.expect_gpus)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value} is invalid (use an integer >= 1)")
    if not args.min_subset_gain >= 1:
        raise ConfigError(f"--min-subset-gain {args.min_subset_gain} is invalid (use a ratio >= 1, e.g. 1.1)")
    thresholds = Thresholds(
        max_imbalance=args.max_imbalance,
        expect_nodes=args.expect_nodes,
        expect_gpus=args.expect_gpus,
        min_subset_gain=args.min_subset_gain,
    )
    job = job_from_args(args)
    try:
        outcome = run_planning(args, job, allow_infeasible=True)
    except InfeasiblePlanError as exc:  # --require-all-nodes and a node missing
        checks = [Check(name="nodes_present", ok=False, detail=str(exc))]
        plan = None
    else:
        checks = run_checks(
            inventories=outcome.inventories,
            failed_nodes=outcome.failed_nodes,
            expected_node_names=outcome.expected_nodes,
            plan=outcome.plan,
            plan_error=outcome.error,
            thresholds=thresholds,
        )
        plan = outcome.plan
    summary = user_code_summary(job)
    if summary:  # the user's module was imported and run, before anything else: a scheduler's log says so
        checks.insert(0, Check(name="user_code", ok=True, detail=summary))
    ok = all(c.ok for c in checks)
    if ok and plan is not None and args.output:
        from planner.plan.io import write_plan

        write_plan(plan, args.output)
    if args.json:
        print_json({"schema": SCHEMA, "ok": ok, "checks": [c.to_json() for c in checks],
                    "plan": plan.to_json() if plan is not None else None})
    else:
        for check in checks:
            status = "FAIL" if not check.ok else "warn" if check.warning else "ok  "
            echo(f"{status}  {check.name}: {check.detail.removeprefix('warning: ')}")
        echo("preflight: " + ("go" if ok else "no-go"))
    return 0 if ok else 1
