"""``batchplan show plan.json``: a saved plan, validated and rendered."""

from __future__ import annotations

import argparse

from planner.cli.emit_env import add_node_options, check_node_options
from planner.cli.render import EMIT_FORMS, print_plan


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "show", help="show a saved plan.json", description="Validate and show a plan.json."
    )
    p.add_argument("plan", help="path of plan.json")
    p.add_argument("--json", action="store_true", help="print the validated plan as JSON")
    p.add_argument(
        "--emit",
        choices=EMIT_FORMS,
        default="table",
        help="env: one node's environment as export lines (choose it with --node or --node-rank); "
        "slurm: the srun line that starts torchrun on every node of a SLURM job",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw the plan (needs the plot extra: matplotlib)")
    add_node_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from planner.plan.io import load_plan

    check_node_options(args)
    if args.plot:
        from planner.cli.plot import check_plot_path

        check_plot_path(args.plot)
    plan = load_plan(args.plan)
    if args.plot:
        from planner.cli.output import note
        from planner.cli.plot import plot_plan

        note(f"wrote {plot_plan(plan, args.plot)}")
    print_plan(plan, as_json=args.json, emit=args.emit, node=args.node, node_rank=args.node_rank)
    return 0
