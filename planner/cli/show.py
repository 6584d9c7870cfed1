"""``batchplan show plan.json``: a saved plan, validated and rendered."""

from __future__ import annotations

import argparse

from planner.cli.output import echo, print_json
from planner.cli.render import env_lines, render_plan


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("show", help="show a saved plan.json", description="Validate and show a plan.json.")
    p.add_argument("plan", help="path of plan.json")
    p.add_argument("--json", action="store_true", help="print the validated plan as JSON")
    p.add_argument("--emit", choices=("table", "env"), default="table", help="env: per-node environment lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from planner.plan import read_plan

    plan = read_plan(args.plan)
    if args.json:
        print_json(plan)
    elif args.emit == "env":
        for line in env_lines(plan):
            echo(line)
    else:
        render_plan(plan)
    return 0
