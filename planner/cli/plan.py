"""``batchplan plan``: per-rank batch sizes for a cluster, the torchrun line of every node, plan.json."""

from __future__ import annotations

import argparse

from planner.cli.emit_env import add_node_options, check_node_options
from planner.cli.options import add_cluster_options, add_job_options, job_from_args
from planner.cli.output import check_writable, note
from planner.cli.planning import run_planning
from planner.cli.render import EMIT_FORMS, print_plan
from planner.plan.types import Plan


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="plan per-rank batch sizes for a cluster",
        description="Probe the cluster, profile each GPU type once, and allocate per-rank batches.",
    )
    add_cluster_options(p)
    add_job_options(p)
    add_output_options(p)
    p.set_defaults(func=run)


def add_output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    g.add_argument(
        "-o", "--output", default="plan.json", help="where to write plan.json (default ./plan.json)"
    )
    g.add_argument("--no-write", action="store_true", help="do not write plan.json")
    g.add_argument("--plot", metavar="FILE.png", help="draw the plan (needs the plot extra: matplotlib)")
    g.add_argument(
        "--emit",
        choices=EMIT_FORMS,
        default="table",
        help="env: print one node's environment as export lines (choose it with --node or --node-rank); "
        "slurm: the srun line that starts torchrun on every node of a SLURM job",
    )
    add_node_options(g)


def check_output_args(args: argparse.Namespace) -> None:
    """Fail on an unusable output path before any planning work."""
    check_node_options(args)
    if args.plot:
        from planner.cli.plot import check_plot_path

        check_plot_path(args.plot)
    if not args.no_write:
        check_writable("-o", args.output)


def emit(plan: Plan, args: argparse.Namespace) -> None:
    """Write plan.json, the picture, and print the result in the requested form."""
    from planner.plan.io import write_plan

    if not args.no_write:
        write_plan(plan, getattr(args, "output_path", None) or args.output)
        note(f"wrote {args.output}")  # as the user spelt it (the file is the absolute path main resolved)
    else:
        note(
            f"plan not written (--no-write): the launch lines name {args.output}, which this run did not write "
            f"(drop --no-write, or write it later from the same flags)"
        )
    if args.plot:
        from planner.cli.plot import plot_plan

        note(f"wrote {plot_plan(plan, args.plot)}")
    print_plan(plan, as_json=args.json, emit=args.emit, node=args.node, node_rank=args.node_rank)


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args)
    check_output_args(args)
    outcome = run_planning(args, job)
    emit(outcome.plan, args)
    return 0
