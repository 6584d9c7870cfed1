"""Flags shared by several commands (job options, cluster options) and their conversion to typed specs.

Every flag is validated here or in ``JobSpec``; a bad value is a ``ConfigError`` (exit 2) naming the flag.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.job import (
    AMP_CHOICES,
    DEFAULT_FRACTION,
    DEFAULT_MAX_UTILIZATION_FRACTION,
    DEFAULT_MIN_FREE_MEMORY_FRACTION,
    FIT_KINDS,
    METHODS,
    MODES,
    OPTIMIZERS,
    JobSpec,
    parse_input_shape,
)
from torchkit.errors import ConfigError


class _PlanningOnly(argparse.Action):
    """A job option that shapes a plan over many GPUs but not one GPU's profile: refused with the reason
    (rather than accepted and silently ignored) by ``batchplan profile``."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} applies to plan and preflight, not to profile, which draws one GPU type's "
                     f"curve: drop {option_string}, or run batchplan plan")


def add_job_options(parser: argparse.ArgumentParser, *, model_required: bool = True, planning: bool = True) -> None:
    """The job flags. With ``planning=False`` (``profile``) the flags that only shape a plan over many GPUs
    (mode, global batch, minimum batch, GPU selection and its thresholds) are refused when given."""
    g = parser.add_argument_group("job")

    def planning_flag(*names: str, help: str, **kwargs) -> None:  # noqa: A002 (argparse's own name)
        if planning:
            g.add_argument(*names, help=help, **kwargs)
        else:  # keeps its default; a value given is refused
            g.add_argument(*names, action=_PlanningOnly, help=argparse.SUPPRESS, **kwargs)

    g.add_argument("--model", required=model_required, help="workload name (resnet18, resnet50, yolo-n, yolo-s, "
                   "vit-b16, gpt2-small) or package.module:factory")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--imgsz", type=int, help="square image size for image models")
    shape.add_argument("--input-shape", help="per-sample input shape, e.g. 3,224,224 (needed for a factory)")
    shape.add_argument("--seq-len", type=int, help="sequence length for token models")
    g.add_argument("--amp", choices=AMP_CHOICES, default="auto", help="mixed precision; auto = bf16 where supported, else fp16")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="optimizer whose state is counted (default sgd)")
    g.add_argument("--fraction", type=float, default=DEFAULT_FRACTION,
                   help=f"share of each GPU's available memory to plan for (default {DEFAULT_FRACTION})")
    planning_flag("--mode", choices=MODES, default="balanced", help="allocation mode (default balanced)")
    planning_flag("--global-batch", type=int, help="samples per optimizer step over all ranks (default: max throughput)")
    g.add_argument("--multiple-of", type=int, default=1, help="every rank's batch is a multiple of this")
    planning_flag("--min-batch", type=int, default=1, help="exclude ranks that cannot fit this many samples")
    g.add_argument("--method", choices=METHODS, default="auto", help="profile by measuring, estimating, or auto")
    g.add_argument("--fit", choices=FIT_KINDS, default="affine", help="memory curve model (default affine)")
    planning_flag("--gpus", default="all", help="GPUs per node: all, -1,-1 (two most idle) or indices 0,2")
    planning_flag("--min-memory-fraction", type=float, default=DEFAULT_MIN_FREE_MEMORY_FRACTION,
                  help="skip GPUs with less free memory than this share of their total "
                  f"(default {DEFAULT_MIN_FREE_MEMORY_FRACTION}; 0 keeps them)")
    planning_flag("--max-utilization", type=float, default=DEFAULT_MAX_UTILIZATION_FRACTION,
                  help=f"skip GPUs busier than this utilisation, 0-1 (default {DEFAULT_MAX_UTILIZATION_FRACTION}); "
                  "the GPUs kept are planned at (1 - utilisation) of their speed")


def job_from_args(args: argparse.Namespace) -> JobSpec:
    return JobSpec(
        model=args.model,
        imgsz=args.imgsz,
        input_shape=parse_input_shape(args.input_shape) if args.input_shape else None,
        seq_len=args.seq_len,
        amp=args.amp,
        optimizer=args.optimizer,
        fraction=args.fraction,
        mode=args.mode,
        global_batch=args.global_batch,
        multiple_of=args.multiple_of,
        min_batch=args.min_batch,
        method=args.method,
        fit=args.fit,
        gpus=args.gpus,
        min_free_memory_fraction=args.min_memory_fraction,
        max_utilization_fraction=args.max_utilization,
    )


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--cluster", metavar="FILE", help="simulated cluster config (YAML); Ray runs on 127.0.0.1")
    where.add_argument("--address", metavar="ADDR", help="join a running Ray cluster (auto, host:6379, ray://host:10001)")
    g.add_argument("--no-ray", action="store_true", help="with --cluster: probe the simulated nodes in this process")
    g.add_argument("--raylet-cap", type=int, help="most raylets for a simulated cluster (default 1: one probe "
                   "process answers for all nodes; up to about 8 gives each node its own)")
    g.add_argument("--probe-timeout", type=float, default=120.0, help="seconds a node's probe may take to answer")
    g.add_argument("--profile-timeout", type=float, default=900.0, help="seconds one profile may take")
    g.add_argument("--require-all-nodes", action="store_true", help="fail (exit 1) if any node cannot be probed")
    g.add_argument("--cache-dir", help="profile cache directory (default ~/.cache/batchplan/profiles)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the profile cache")
    g.add_argument("--workers", type=int, default=0, help="data-loader workers per rank (for the core-count check)")
    g.add_argument("--script", default="train.py", help="training script named in the torchrun lines")
    g.add_argument("--master-port", type=int, default=29500, help="torchrun master port")


def check_cluster_args(args: argparse.Namespace) -> None:
    if args.no_ray and not args.cluster:
        raise ConfigError("--no-ray needs --cluster FILE (a real cluster is probed through Ray)")
    if args.cluster and not Path(args.cluster).is_file():
        raise ConfigError(f"cluster config {args.cluster} does not exist (see cluster_configs/ for examples)")
    if args.raylet_cap is not None and args.raylet_cap < 1:
        raise ConfigError(f"--raylet-cap {args.raylet_cap} is invalid (use an integer >= 1)")
    for flag, value in (("--probe-timeout", args.probe_timeout), ("--profile-timeout", args.profile_timeout)):
        if not value > 0:
            raise ConfigError(f"{flag} {value} is invalid (use a positive number of seconds)")
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers} is invalid (use 0 or more)")
    if not 1 <= args.master_port <= 65535:
        raise ConfigError(f"--master-port {args.master_port} is invalid (use 1-65535)")


def driver_options(args: argparse.Namespace):
    from planner.driver import DriverOptions
    from planner.profile_cache import ProfileCache

    return DriverOptions(
        probe_timeout_s=args.probe_timeout,
        profile_timeout_s=args.profile_timeout,
        require_all_nodes=args.require_all_nodes,
        cache=None if args.no_cache else ProfileCache(args.cache_dir),
        workers_per_rank=args.workers,
        script=args.script,
        master_port=args.master_port,
    )


def run_planning(args: argparse.Namespace, job: JobSpec, *, allow_infeasible: bool = False):
    """Plan for the cluster the flags name, with progress on stderr. Returns the driver's PlanOutcome."""
    from planner.cli.progress import progress_sink
    from planner.driver import plan_with_ray, plan_without_ray

    check_cluster_args(args)
    options = driver_options(args)
    cluster = None
    if args.cluster:
        from planner.cluster import load_cluster

        cluster = load_cluster(args.cluster)
    with progress_sink() as on_event:
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
