"""Flags shared by several commands (job options, cluster options) and their conversion to typed specs.

Every flag is validated here or in ``JobSpec``; a bad value is a ``ConfigError`` (exit 2) naming the flag.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from planner.errors import ConfigError
from planner.job import (
    AMP_CHOICES,
    DEFAULT_FRACTION,
    DEFAULT_MAX_UTILIZATION_FRACTION,
    DEFAULT_MIN_FREE_MEMORY_FRACTION,
    FIT_KINDS,
    INPUT_DTYPES,
    METHODS,
    MODES,
    OPTIMIZERS,
    JobSpec,
)
from planner.plan.launch import DEFAULT_MASTER_PORT
from planner.probing.backends import DEFAULT_PROBE_TIMEOUT_S, DEFAULT_PROFILE_TIMEOUT_S

#: the job options' flags whose names are not their JobSpec field's with dashes
_FLAG_OF_FIELD = {"min_free_memory_fraction": "min-memory-fraction", "max_utilization_fraction": "max-utilization"}


def flag_of(field: str) -> str:
    """The flag that sets JobSpec ``field`` (``global_batch`` -> ``--global-batch``): how the CLI names a
    field in an error (``JobFieldError.render``)."""
    return "--" + _FLAG_OF_FIELD.get(field, field.replace("_", "-"))


def parse_input_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` (or ``3x224x224``) → ``(3, 224, 224)``; a clear error for anything else, empty parts
    included."""
    parts = [part.strip() for part in re.split(r"[,x]", text)]
    shape = tuple(int(part) for part in parts if part.isdigit())
    if not parts or len(shape) != len(parts) or any(d <= 0 for d in shape):
        raise ConfigError(f"--input-shape {text!r} is invalid (use positive integers like 3,224,224)")
    return shape


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

    g.add_argument("--model", required=model_required, help="workload name (resnet18, resnet50, resnext101-32x4d, "
                   "se-resnext101-32x4d, yolo-n, yolo-s, vit-b16, gpt2-small), timm:NAME, torchvision:NAME, hf:ARCH or "
                   "hf:config.json, ultralytics:FILE.yaml, or package.module:factory")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--imgsz", type=int, help="square image size for image models")
    shape.add_argument("--input-shape", help="per-sample input shape, e.g. 3,224,224 (needed for a factory)")
    shape.add_argument("--seq-len", type=int, help="sequence length for token models")
    g.add_argument("--vocab-size", type=int, help="a factory's input is integer token ids in [0, N) (with --seq-len)")
    g.add_argument("--input-dtype", choices=INPUT_DTYPES, help="a factory's input dtype (default float32; int64 "
                   "with --vocab-size)")
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
    g.add_argument("--channels-last", action="store_true",
                   help="the script trains in NHWC memory format (torch.channels_last): changes the estimated step time")
    planning_flag("--bucket-cap-mb", type=float, help="DDP's bucket_cap_mb in your script, MiB (default: DDP's 25 "
                  "with a 1 MiB first bucket): shapes the gradient-synchronisation model")
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
        vocab_size=args.vocab_size,
        input_dtype=args.input_dtype,
        amp=args.amp,
        optimizer=args.optimizer,
        fraction=args.fraction,
        mode=args.mode,
        global_batch=args.global_batch,
        multiple_of=args.multiple_of,
        min_batch=args.min_batch,
        method=args.method,
        fit=args.fit,
        channels_last=args.channels_last,
        bucket_cap_mb=args.bucket_cap_mb,
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
    g.add_argument("--probe-timeout", type=float, default=DEFAULT_PROBE_TIMEOUT_S, help="seconds a node's probe may take to answer")
    g.add_argument("--profile-timeout", type=float, default=DEFAULT_PROFILE_TIMEOUT_S, help="seconds one profile may take")
    g.add_argument("--require-all-nodes", action="store_true", help="fail (exit 1) if any node cannot be probed")
    g.add_argument("--cache-dir", help="profile cache directory (default ~/.cache/batchplan/profiles)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the profile cache")
    g.add_argument("--workers", type=int, default=0, help="data-loader workers per rank (for the core-count check)")
    g.add_argument("--script", default="train.py", help="training script named in the torchrun lines")
    g.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT, help="torchrun master port")


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
    from planner.plan.launch import check_path_word

    check_path_word(args.script, "--script")
    if getattr(args, "output", None):
        check_path_word(args.output, "-o")
