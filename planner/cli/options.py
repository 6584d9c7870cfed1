"""Flags shared by several commands (job options, cluster options) and their conversion to typed specs.

Every flag is validated here or in ``JobSpec``; a bad value is a ``ConfigError`` (exit 2) naming the flag.
"""

from __future__ import annotations

import argparse
import re

from planner.cli.spec_flags import FlagForm, add_spec_flags, flag_name, spec_from_args
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.plan.launch import DEFAULT_MASTER_PORT
from planner.probing.backends import DEFAULT_PROBE_TIMEOUT_S, DEFAULT_PROFILE_TIMEOUT_S
from planner.probing.session import DEFAULT_RAYLET_CAP
from torchkit.workloads.registry import model_help


def parse_input_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` (or ``3x224x224``) → ``(3, 224, 224)``; a clear error for anything else, empty parts
    included."""
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    shape = tuple(int(part) for part in parts if part.isdigit())
    if not parts or len(shape) != len(parts) or any(d <= 0 for d in shape):
        raise ConfigError(f"--input-shape {text!r} is invalid (use positive integers like 3,224,224)")
    return shape


#: the command-line forms of the JobSpec fields that need one (planner.cli.spec_flags); every other field is
#: a flag by its name, default, type and docstring alone
JOB_FLAG_FORMS: dict[str, FlagForm] = {
    "model": FlagForm(required=True, help=model_help()),
    "imgsz": FlagForm(exclusive="shape", help="square image size for image models"),
    "input_shape": FlagForm(
        exclusive="shape",
        parse=parse_input_shape,
        help="per-sample input shape, e.g. 3,224,224 (needed for a factory)",
    ),
    "seq_len": FlagForm(exclusive="shape", help="sequence length for token models"),
    "vocab_size": FlagForm(help="a factory's input is integer token ids in [0, N) (with --seq-len)"),
    "input_dtype": FlagForm(help="a factory's input dtype (default float32; int64 with --vocab-size)"),
    "amp": FlagForm(help="mixed precision; auto = bf16 where supported, else fp16"),
    "optimizer": FlagForm(help="optimizer whose state is counted"),
    "fraction": FlagForm(help="share of each GPU's available memory to plan for"),
    "mode": FlagForm(planning_only=True, help="allocation mode"),
    "global_batch": FlagForm(
        planning_only=True, help="samples per optimizer step over all ranks (default: max throughput)"
    ),
    "multiple_of": FlagForm(help="every rank's batch is a multiple of this"),
    "min_batch": FlagForm(planning_only=True, help="exclude ranks that cannot fit this many samples"),
    "method": FlagForm(
        help="profile by measuring, estimating, or auto (measure where a free CUDA GPU is, else estimate)"
    ),
    "gpus": FlagForm(planning_only=True, help="GPUs per node: all, -1,-1 (two most idle) or indices 0,2"),
    "min_free_memory_fraction": FlagForm(
        flag="min-memory-fraction",
        planning_only=True,
        help="skip GPUs with less free memory than this share of their total (0 keeps them)",
    ),
    "max_utilization_fraction": FlagForm(
        flag="max-utilization",
        planning_only=True,
        help="skip GPUs busier than this utilisation, 0-1; the GPUs kept are "
        "planned at (1 - utilisation) of their speed",
    ),
    "fit": FlagForm(help="memory curve model"),
    "channels_last": FlagForm(
        help="the script trains in NHWC memory format (torch.channels_last): changes the estimated step time"
    ),
    "bucket_cap_mb": FlagForm(
        planning_only=True,
        help="DDP's bucket_cap_mb in your script, MiB (default: DDP's 25 "
        "with a 1 MiB first bucket): shapes the gradient-synchronisation model",
    ),
    "user_code_timeout_s": FlagForm(
        flag="user-code-timeout",
        metavar="SECONDS",
        help="seconds a package.module:factory may take to import and build its model, "
        "here and in each probe",
    ),
}


#: the settings of the driver (``DriverOptions``) whose flags are not their names with dashes
_OPTION_FLAG_FORMS: dict[str, FlagForm] = {"workers_per_rank": FlagForm(flag="workers")}


def flag_of(field: str) -> str:
    """The flag that sets ``field`` of JobSpec, the preflight thresholds or the driver's options
    (``global_batch`` -> ``--global-batch``): how the CLI names a setting in a message
    (``FieldError.render``, ``DriverOptions.name_of``)."""
    return flag_name(field, {**JOB_FLAG_FORMS, **_OPTION_FLAG_FORMS})


def _refused_by_profile(form: FlagForm) -> str | None:
    """``batchplan profile`` draws one GPU type's curve: a flag that only shapes a plan is refused, with why."""
    if not form.planning_only:
        return None
    return (
        "{flag} applies to plan and preflight, not to profile, which draws one GPU type's curve: drop {flag}, "
        "or run batchplan plan"
    )


def add_job_options(
    parser: argparse.ArgumentParser, *, model_required: bool = True, planning: bool = True
) -> None:
    """The job flags, one per JobSpec field. With ``planning=False`` (``profile``) the flags that only shape a
    plan over many GPUs (mode, global batch, minimum batch, GPU selection and its thresholds) are refused when
    given."""
    add_spec_flags(
        parser.add_argument_group("job"),
        JobSpec,
        JOB_FLAG_FORMS,
        **({} if planning else {"refuse": _refused_by_profile}),
        required={"model": model_required},
    )


def job_from_args(args: argparse.Namespace) -> JobSpec:
    """The JobSpec the job flags spell."""
    return spec_from_args(JobSpec, JOB_FLAG_FORMS, args)


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster")
    where = g.add_mutually_exclusive_group()
    where.add_argument(
        "--cluster", metavar="FILE", help="simulated cluster config (YAML); Ray runs on 127.0.0.1"
    )
    where.add_argument(
        "--address", metavar="ADDR", help="join a running Ray cluster (auto, host:6379, ray://host:10001)"
    )
    where.add_argument(
        "--slurm",
        action="store_true",
        help="plan the SLURM job this runs in (its nodes and GPUs, from scontrol; no Ray)",
    )
    where.add_argument(
        "--slurm-partition",
        metavar="NAME",
        help="plan the GPU nodes of a SLURM partition (from sinfo; no Ray): a pre-flight check before sbatch",
    )
    g.add_argument(
        "--gres-type",
        action="append",
        default=[],
        metavar="NAME=TYPE",
        help="with --slurm/--slurm-partition: the catalog type of a GRES type name (e.g. a100=A100-SXM4-80GB; "
        "repeatable; overrides the default table)",
    )
    g.add_argument(
        "--no-ray", action="store_true", help="with --cluster: probe the simulated nodes in this process"
    )
    g.add_argument(
        "--raylet-cap",
        type=int,
        help=f"most raylets for a simulated cluster (default {DEFAULT_RAYLET_CAP}: one probe "
        "process answers for all nodes; up to about 8 gives each node its own)",
    )
    g.add_argument(
        "--probe-timeout",
        type=float,
        default=DEFAULT_PROBE_TIMEOUT_S,
        help="seconds a node's probe may take to answer",
    )
    g.add_argument(
        "--profile-timeout",
        type=float,
        default=DEFAULT_PROFILE_TIMEOUT_S,
        help="seconds one profile may take",
    )
    g.add_argument(
        "--require-all-nodes", action="store_true", help="fail (exit 1) if any node cannot be probed"
    )
    g.add_argument("--cache-dir", help="profile cache directory (default ~/.cache/batchplan/profiles)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the profile cache")
    add_verify_cache_flag(g)
    g.add_argument(
        "--workers", type=int, default=0, help="data-loader workers per rank (for the core-count check)"
    )
    g.add_argument("--script", default="train.py", help="training script named in the torchrun lines")
    g.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, help="torchrun master port")


def add_verify_cache_flag(group) -> None:
    """``--verify-cache`` (plan, preflight, profile): ``planner.obtain.verify``."""
    group.add_argument(
        "--verify-cache",
        action="store_true",
        help="hold every cached profile against a fresh estimate of the same job and GPU type; one "
        "outside the estimator's range is refused, with both figures, and profiled again",
    )


def check_cache_args(args: argparse.Namespace) -> None:
    if args.verify_cache and args.no_cache:
        raise ConfigError(
            "--verify-cache checks what the profile cache holds, and --no-cache reads none: drop one"
        )


def check_cluster_args(args: argparse.Namespace) -> None:
    check_cache_args(args)
    if args.no_ray and not args.cluster:
        raise ConfigError("--no-ray needs --cluster FILE (a real cluster is probed through Ray)")
    if args.gres_type and not (args.slurm or args.slurm_partition):
        raise ConfigError(
            "--gres-type maps SLURM GRES names: add --slurm or --slurm-partition NAME, or drop it"
        )
    if args.cluster:
        from planner.cluster import find_cluster_config

        find_cluster_config(args.cluster)  # a path, or the name of a shipped example (demo-mixed)
    if args.raylet_cap is not None and args.raylet_cap < 1:
        raise ConfigError(f"--raylet-cap {args.raylet_cap} is invalid (use an integer >= 1)")
    for flag, value in (("--probe-timeout", args.probe_timeout), ("--profile-timeout", args.profile_timeout)):
        if not value > 0:
            raise ConfigError(f"{flag} {value} is invalid (use a positive number of seconds)")
    if args.workers < 0:
        raise ConfigError(f"--workers {args.workers} is invalid (use 0 or more)")
    if not 1 <= args.master_port <= 65535:
        raise ConfigError(f"--master-port {args.master_port} is invalid (use 1-65535)")
    from planner.plan.launch import check_path_word

    check_path_word(args.script, "--script")
    if getattr(args, "output", None):
        check_path_word(args.output, "-o")
