"""The gathering step that ``plan`` and ``preflight`` share: from the cluster flags to the driver's
``PlanOutcome`` (probe, profile, allocate), with progress on stderr. Each command then renders it."""

from __future__ import annotations

import argparse

from planner.cli.options import check_cluster_args, flag_of
from planner.cli.progress import progress_sink
from planner.cli.stdout_guard import stdout_to_stderr
from planner.cli.user_code import announce_user_code
from planner.cluster import load_cluster
from planner.driver import DriverOptions, PlanOutcome, plan_with_ray, plan_without_ray
from planner.job import JobSpec
from planner.plan.launch import DEFAULT_PLAN_PATH
from planner.profiles.cache import ProfileCache


def driver_options(args: argparse.Namespace) -> DriverOptions:
    cache = None
    if not args.no_cache:
        cache = ProfileCache(args.cache_dir)
        cache.check_directory("--cache-dir" if args.cache_dir else "the profile cache directory")
    return DriverOptions(
        probe_timeout_s=args.probe_timeout,
        profile_timeout_s=args.profile_timeout,
        require_all_nodes=args.require_all_nodes,
        cache=cache,
        workers_per_rank=args.workers,
        script=args.script,
        master_port=args.master_port,
        # the launch lines name the file the plan is written to (-o), as the user spelt it
        plan_path=getattr(args, "output", None) or DEFAULT_PLAN_PATH,
        name_of=flag_of,
    )


def run_planning(args: argparse.Namespace, job: JobSpec, *, allow_infeasible: bool = False) -> PlanOutcome:
    """Plan for the cluster the flags name, with progress on stderr. Returns the driver's PlanOutcome."""
    check_cluster_args(args)
    options = driver_options(args)
    cluster = load_cluster(args.cluster) if args.cluster else None
    announce_user_code(job)
    # stdout carries only the result, printed after this: Ray's "(raylet) ..." lines go to stderr
    with stdout_to_stderr(), progress_sink() as on_event:
        if cluster is not None and args.no_ray:
            return plan_without_ray(job, cluster, options=options, on_event=on_event, allow_infeasible=allow_infeasible)
        return plan_with_ray(
            job,
            cluster=cluster,
            address=args.address,
            options=options,
            on_event=on_event,
            raylet_cap=args.raylet_cap,
            allow_infeasible=allow_infeasible,
        )
