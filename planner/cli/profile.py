"""``batchplan profile``: the memory and step-time curve of one model on one GPU (a catalog type, estimated;
or a local device, measured), the batch it would get, and where its memory goes."""

from __future__ import annotations

import argparse
import math

from planner.cli.options import (
    add_job_options,
    add_verify_cache_flag,
    check_cache_args,
    flag_of,
    job_from_args,
)
from planner.cli.output import check_writable, echo, format_gib, note, print_json, print_table
from planner.codec import encode
from planner.errors import ConfigError, render_fields
from planner.job import JobSpec, Method
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import ADD_GPU_TYPE_FIX

SCHEMA = "batchplan/profile@1"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "profile",
        help="memory/time curve and batch of a model on one GPU type or device",
        description="Profile one model on a catalog GPU type (--gpu, estimated, no GPU needed) or on a local "
        "device (--device, measured).",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", metavar="TYPE", help="catalog GPU type, e.g. T4 or A100-SXM4-80GB")
    where.add_argument(
        "--device", metavar="SPEC", help="local CUDA device: 0, cuda:1, or -1 for the most idle"
    )
    add_job_options(p, planning=False)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw the memory curve (needs matplotlib)")
    p.add_argument("--cluster", metavar="FILE", help="cluster config whose gpu_types extend the catalog")
    p.add_argument(
        "--cache-dir", help="profile cache directory (default ~/.cache/batchplan/profiles, as plan)"
    )
    p.add_argument("--no-cache", action="store_true", help="do not read or write the profile cache")
    add_verify_cache_flag(p)
    p.set_defaults(func=run)


def _local_device(spec: str):
    """(cuda index, total bytes, free bytes, NVML/CUDA name) of a local device; ConfigError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {spec}: no CUDA GPU is usable on this machine (use --gpu TYPE to estimate for a catalog GPU)"
        )
    from torchkit.process.device import parse_device

    parsed = parse_device(spec)
    if not parsed.startswith("cuda") and not parsed[:1].isdigit():
        raise ConfigError(f"--device {spec} resolved to {parsed!r}, not a CUDA device (use an index like 0)")
    index = int(parsed.split(":")[-1].split(",")[0]) if ":" in parsed else int(parsed.split(",")[0])
    free, total = torch.cuda.mem_get_info(index)
    return index, int(total), int(free), torch.cuda.get_device_name(index)


def run(args: argparse.Namespace) -> int:
    from planner.cli.model_names import check_model_name
    from planner.cli.user_code import announce_user_code

    job = job_from_args(args)
    check_model_name(job.model)  # a misspelt built-in at once, with the close matches (not after an estimate)
    check_cache_args(args)
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise ConfigError(f"--plot {args.plot} must name a .png file (e.g. --plot curve.png)")
        check_writable("--plot", args.plot)
    from planner.cli.stdout_guard import stdout_to_stderr

    with stdout_to_stderr():  # what the user's factory prints is not the result (profile --json)
        announce_user_code(
            job, where="here"
        )  # the module imported and the factory run, said before (as plan does)
        result, profile = _gather(args, job)
    if args.plot:
        from planner.cli.plot import plot_profile

        path = plot_profile(
            profile,
            budget_bytes=result["memory_budget_bytes"],
            total_bytes=result["total_memory_bytes"],
            chosen_batch=result["chosen_batch"],
            path=args.plot,
            model=job.model,
        )
        note(f"wrote {path}")
    if args.json:
        print_json(result)
    else:
        _render(job, result, profile)
    return 0 if result["chosen_batch"] else 1


def _obtained_profile(args: argparse.Namespace, request) -> DeviceProfile:
    """The profile from the cache ``plan`` shares, or made here now (and cached): ``planner.obtain``."""
    from planner.obtain import ProfileOrigin, job_fingerprint, make_profile, obtain_profile, planned_method
    from planner.profiles.cache import ProfileCache

    cache = None if args.no_cache else ProfileCache(args.cache_dir)
    job, gpu = request.job, request.gpu

    def make(request) -> DeviceProfile:
        estimating = planned_method(request.method, request.device_index) is Method.ESTIMATE
        note(f"{'estimating' if estimating else 'measuring'} {job.model} on {gpu.name}")
        return make_profile(job, gpu, method=request.method, device_index=request.device_index)

    result = obtain_profile(
        request, make, cache=cache, identity=job_fingerprint(job), verify=args.verify_cache
    )
    assert result is not None  # make raises rather than giving none
    if result.origin is not ProfileOrigin.MADE:
        note(
            f"profile of {job.model} on {gpu.name} ({result.profile.method}) from the cache {cache.path_for(result.key)}"
        )
    for line in result.notes:
        note(render_fields(line, flag_of))
    return result.profile


def _gather(args: argparse.Namespace, job: JobSpec) -> tuple[dict, DeviceProfile]:
    """Profile the GPU the flags name; the ``batchplan/profile@1`` document and the profile."""
    from planner.cli.catalog import catalog_of_args
    from planner.obtain import ProfileRequest

    catalog = catalog_of_args(args)
    if args.device is None and args.gpu is None:
        raise ConfigError("say which GPU: --gpu TYPE (estimated, e.g. --gpu T4) or --device 0 (a local GPU)")
    device_index = None
    if args.gpu is not None:
        if job.method == "measure":
            raise ConfigError(
                "--method measure needs a local GPU: use --device, or --method estimate with --gpu"
            )
        gpu = catalog.get(args.gpu)
        total_bytes = free_bytes = gpu.memory_bytes
        method = Method.ESTIMATE
    else:
        device_index, total_bytes, free_bytes, name = _local_device(args.device)
        gpu = catalog.resolve(name)
        if gpu is None:
            raise ConfigError(f"local GPU '{name}' is not in the GPU catalog ({ADD_GPU_TYPE_FIX})")
        method = job.method
    profile = _obtained_profile(
        args, ProfileRequest(job=job, gpu=gpu, method=method, device_index=device_index)
    )
    budget = job.memory_budget_bytes(free_bytes)
    chosen = profile.max_batch(budget, job.multiple_of)
    result = {
        "schema": SCHEMA,
        "job": encode(job),
        "gpu": gpu.name,
        "device_index": device_index,
        "total_memory_bytes": total_bytes,
        "available_memory_bytes": free_bytes,
        "memory_budget_bytes": budget,
        "chosen_batch": chosen,
        "predicted_memory_bytes": profile.memory_bytes(chosen) if chosen else None,
        "predicted_step_time_s": profile.step_time_s(chosen) if chosen else None,
        "throughput_samples_per_s": chosen / profile.step_time_s(chosen) if chosen else 0.0,
        "profile": encode(profile),
    }
    return result, profile


def _render(job: JobSpec, result: dict, profile: DeviceProfile) -> None:
    chosen, budget = result["chosen_batch"], result["memory_budget_bytes"]
    free_bytes, total_bytes = result["available_memory_bytes"], result["total_memory_bytes"]
    fit = encode(profile.memory_fit)
    echo(f"{job.model} on {result['gpu']}, amp {profile.amp}, optimizer {job.optimizer}, {profile.method}d")
    time_at = dict(profile.time_points)
    print_table(
        "probe points",
        ["batch", "memory GiB", "step ms"],
        [
            [b, format_gib(v, 3), f"{time_at[b] * 1000:.1f}" if b in time_at else "-"]
            for b, v in profile.memory_points
        ],
    )
    if fit["kind"] == "affine":
        echo(
            f"memory fit: {format_gib(fit['intercept_bytes'], 3)} GiB + {fit['bytes_per_sample'] / 2**20:.2f} MiB × batch"
        )
    else:
        echo(f"memory fit (log-log): exponent {fit['log_slope']:.3f}")
    echo(
        f"step time fit: {profile.time_fit.intercept_s * 1000:.2f} ms + "
        f"{profile.time_fit.s_per_sample * 1000:.3f} ms × batch"
        + (
            f", ±{math.exp(profile.time_log_sigma) - 1:.0%} (time model: {profile.time_model})"
            if profile.time_log_sigma
            else ""
        )
    )
    if chosen:
        echo(
            f"batch {chosen}: predicted {format_gib(result['predicted_memory_bytes'], 2)} GiB of a "
            f"{format_gib(budget, 2)} GiB budget ({job.fraction:.0%} of {format_gib(free_bytes, 2)} GiB available; "
            f"{format_gib(total_bytes, 2)} GiB total), {result['predicted_step_time_s'] * 1000:.1f} ms/step, "
            f"{result['throughput_samples_per_s']:.0f} samples/s"
        )
    else:
        echo(
            f"not even {job.multiple_of} sample(s) fit the {format_gib(budget, 2)} GiB budget on {result['gpu']}"
        )
    if profile.breakdown_bytes:
        print_table(
            "memory by category at the largest probe (allocated, before CUDA overheads)",
            ["category", "GiB"],
            [[k, format_gib(v, 3)] for k, v in profile.breakdown_bytes.items()],
        )
    for line in profile.notes:
        note(f"warning: {line}")
