"""The gathering step that ``plan`` and ``preflight`` share: from the cluster flags to the driver's
``PlanOutcome`` (probe, profile, allocate), with progress on stderr. Each command then renders it."""

from __future__ import annotations

import argparse

from planner.cli.model_names import check_model_name
from planner.cli.options import check_cluster_args, flag_of
from planner.cli.output import note
from planner.cli.progress import progress_sink
from planner.cli.stdout_guard import stdout_to_stderr
from planner.cli.user_code import announce_user_code
from planner.cluster import ClusterSpec, load_cluster
from planner.driver import DriverOptions, PlanOutcome, plan_with_ray, plan_without_ray
from planner.errors import NoGpuError
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
        verify_cache=args.verify_cache,
        workers_per_rank=args.workers,
        script=args.script,
        master_port=args.master_port,
        # the launch lines name the file the plan is written to (-o), as the user spelt it
        plan_path=getattr(args, "output", None) or DEFAULT_PLAN_PATH,
        name_of=flag_of,
    )


def slurm_cluster(args: argparse.Namespace) -> ClusterSpec | None:
    """The cluster ``--slurm`` (this job's allocation) or ``--slurm-partition NAME`` names, or None; what SLURM
    listed but cannot be planned is said on stderr, one line per node."""
    from planner.probing import slurm

    if getattr(args, "slurm", False):
        found = slurm.current_allocation(gres_types=args.gres_type)
    elif getattr(args, "slurm_partition", None):
        found = slurm.partition_cluster(args.slurm_partition, gres_types=args.gres_type)
    else:
        return None
    names = ", ".join(f"{n.name} ({len(n.gpus)}× {n.gpus[0].spec.name})" for n in found.cluster.nodes)
    note(f"SLURM: {len(found.cluster.nodes)} node(s) from {found.cluster.source_path}: {names}")
    for name in found.nvml_nodes:
        note(f"SLURM: {name} is this host: its GPUs as NVML reads them, not as its GRES says")
    for line in found.skipped:
        note(f"SLURM: left out {line}")
    return found.cluster


def _check_node_choice(args: argparse.Namespace, cluster: ClusterSpec | None) -> None:
    """``--emit env`` on a cluster of several nodes needs ``--node``/``--node-rank``: said before probing where
    the nodes are known already (a config, SLURM), rather than after (``planner.cli.emit_env``)."""
    if getattr(args, "emit", None) != "env" or cluster is None or len(cluster.nodes) < 2:
        return
    if args.node is None and args.node_rank is None:
        from planner.cli.emit_env import selected_node_rank

        selected_node_rank(
            cluster, None, None
        )  # reads only .nodes[].name, which a cluster has too: raises, naming them


def run_planning(args: argparse.Namespace, job: JobSpec, *, allow_infeasible: bool = False) -> PlanOutcome:
    """Plan for the cluster the flags name, with progress on stderr. Returns the driver's PlanOutcome."""
    check_model_name(job.model)
    check_cluster_args(args)
    options = driver_options(args)
    cluster = load_cluster(args.cluster) if args.cluster else None
    slurm = slurm_cluster(args)
    _check_node_choice(args, slurm or cluster)
    announce_user_code(job)
    # stdout carries only the result, printed after this: Ray's "(raylet) ..." lines go to stderr
    with stdout_to_stderr(), progress_sink() as on_event:
        if slurm is not None:  # SLURM said what each node has: planned here, no Ray
            return plan_without_ray(
                job, slurm, options=options, on_event=on_event, allow_infeasible=allow_infeasible
            )
        if cluster is not None and args.no_ray:
            return plan_without_ray(
                job, cluster, options=options, on_event=on_event, allow_infeasible=allow_infeasible
            )
        try:
            return plan_with_ray(
                job,
                cluster=cluster,
                address=args.address,
                options=options,
                on_event=on_event,
                raylet_cap=args.raylet_cap,
                allow_infeasible=allow_infeasible,
            )
        except NoGpuError as exc:
            if cluster is not None or args.address is not None:
                raise
            # nothing was named: this machine (or a Ray cluster found here) was planned, and it has no GPU
            raise NoGpuError(
                "no usable GPU to plan on: none found on this machine nor in a Ray cluster running here (try "
                "a simulated cluster, --cluster demo-mixed; or join a GPU cluster with --address "
                "HOST:6379; `batchplan devices` lists what is here)"
            ) from exc
