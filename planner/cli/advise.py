"""``batchplan advise``: which GPUs to rent for a job. Plans the job over every candidate cluster the offers
allow (``planner.advise``) and prints the Pareto front of cost per epoch against time per epoch, each point
with the ``batchplan plan`` line that reproduces its plan (``--pick K -o plan.json`` writes it here)."""

from __future__ import annotations

import argparse
import os
import time

from planner.cli.options import JOB_FLAG_FORMS, add_job_options, job_from_args
from planner.cli.output import check_writable, note
from planner.errors import ConfigError, InfeasiblePlanError
from planner.job import JobSpec

IMAGENET_TRAIN_SAMPLES = 1_281_167
"""images in ImageNet-1k's training split (ILSVRC-2012, Russakovsky et al. 2015): the default epoch"""
DEFAULT_MAX_GPUS = 16
MAX_GPUS_LIMIT = 4096
DEFAULT_CLUSTERS_DIR = "advise-clusters"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "advise",
        help="which GPUs to rent: plan a job over priced offers, show the cheapest and the fastest ways",
        description="Enumerate the candidate clusters an offers file allows (one offer's nodes, or offers mixed "
        "on one network), plan the job on each with estimated profiles (no GPU needed), and print the Pareto "
        "front of cost per epoch against time per epoch.",
    )
    p.add_argument(
        "--offers",
        required=True,
        metavar="FILE",
        help="offers YAML, or the name of a shipped one (example: cluster_configs/offers/example.yaml)",
    )
    add_job_options(p)
    g = p.add_argument_group("search")
    g.add_argument(
        "--epoch-samples",
        type=int,
        default=IMAGENET_TRAIN_SAMPLES,
        help=f"samples in one epoch (default {IMAGENET_TRAIN_SAMPLES:,}: ImageNet-1k's training split)",
    )
    g.add_argument(
        "--budget-per-hour", type=float, metavar="USD", help="leave out candidates dearer than this per hour"
    )
    g.add_argument(
        "--max-gpus",
        type=int,
        default=DEFAULT_MAX_GPUS,
        help=f"most GPUs a candidate may have (default {DEFAULT_MAX_GPUS})",
    )
    g.add_argument(
        "--deadline", type=float, metavar="HOURS", help="leave out candidates slower than this per epoch"
    )
    g.add_argument(
        "--exhaustive", action="store_true", help="plan every candidate (no pruning): the same front, slower"
    )
    g.add_argument("--cache-dir", help="profile cache directory (default ~/.cache/batchplan/profiles)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the profile cache")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the front as JSON on stdout")
    o.add_argument(
        "--plot", metavar="FILE.png", help="draw cost against time (needs the plot extra: matplotlib)"
    )
    o.add_argument(
        "--write-clusters",
        metavar="DIR",
        default=DEFAULT_CLUSTERS_DIR,
        help=f"where the front's cluster configs are written, for their plan lines (default ./{DEFAULT_CLUSTERS_DIR})",
    )
    o.add_argument(
        "--pick", type=int, metavar="K", help="write the plan of front point K (1 = fastest) to -o"
    )
    o.add_argument(
        "-o", "--output", default="plan.json", help="where --pick writes the plan (default ./plan.json)"
    )
    p.set_defaults(func=run)


def _check_args(args: argparse.Namespace, job: JobSpec) -> None:
    """Every bad value and unusable path before any work."""
    from planner.cli.model_names import check_model_name

    check_model_name(job.model)
    if job.gpus != "all":
        raise ConfigError(
            f"--gpus {job.gpus} selects GPUs of a known node; advise plans whole rented nodes (drop --gpus)"
        )
    if args.epoch_samples < 1:
        raise ConfigError(
            f"--epoch-samples {args.epoch_samples} is invalid (use a positive number of samples)"
        )
    if args.budget_per_hour is not None and not args.budget_per_hour >= 0:
        raise ConfigError(f"--budget-per-hour {args.budget_per_hour} is invalid (use USD per hour, >= 0)")
    if not 1 <= args.max_gpus <= MAX_GPUS_LIMIT:
        raise ConfigError(f"--max-gpus {args.max_gpus} is invalid (use 1-{MAX_GPUS_LIMIT})")
    if args.deadline is not None and not args.deadline > 0:
        raise ConfigError(f"--deadline {args.deadline} is invalid (use hours per epoch, > 0)")
    if args.pick is not None and args.pick < 1:
        raise ConfigError(f"--pick {args.pick} is invalid (1 is the fastest point of the front)")
    if args.plot:
        from planner.cli.plot import check_plot_path

        check_plot_path(args.plot)
    if args.pick is not None:
        check_writable("-o", args.output)
    if os.path.exists(args.write_clusters) and not os.path.isdir(args.write_clusters):
        raise ConfigError(f"--write-clusters {args.write_clusters} is a file (name a directory)")


def _cache(args: argparse.Namespace):
    from planner.profiles.cache import ProfileCache

    if args.no_cache:
        return None
    cache = ProfileCache(args.cache_dir)
    cache.check_directory("--cache-dir" if args.cache_dir else "the profile cache directory")
    return cache


def _search(args: argparse.Namespace, job: JobSpec):
    """(context, result, offer-level rejections): the profiles, the candidates and the pruned search."""
    from planner.advise.candidates import enumerate_candidates
    from planner.advise.evaluate import AdviseContext
    from planner.advise.offers import load_offers
    from planner.advise.search import Filters, Rejected, search
    from planner.cli.stdout_guard import stdout_to_stderr
    from planner.cli.user_code import announce_user_code

    offers = load_offers(args.offers)
    cache = _cache(args)
    announce_user_code(job, where="here")
    with stdout_to_stderr():  # a user factory's prints stay off the result
        context = AdviseContext(job, offers, epoch_samples=args.epoch_samples, cache=cache, on_progress=note)
    ruled_out = []
    for offer in offers.offers:
        reason = context.holds_job(offer)
        if reason is None and offer.gpus_per_node > args.max_gpus:
            reason = f"one node has {offer.gpus_per_node} GPUs, over --max-gpus {args.max_gpus}"
        if reason is not None:
            ruled_out.append(Rejected(cluster=f"offer {offer.name}", reason=reason))
    usable = [o for o in offers.offers if not any(r.cluster == f"offer {o.name}" for r in ruled_out)]
    candidates = enumerate_candidates(offers, usable, max_gpus=args.max_gpus)
    note(f"{len(candidates):,} candidate clusters of at most {args.max_gpus} GPUs over {len(usable)} offers")
    filters = Filters(
        budget_per_hour_usd=args.budget_per_hour,
        deadline_s=args.deadline * 3600 if args.deadline is not None else None,
    )
    result = search(context, candidates, filters, prune=not args.exhaustive, on_progress=note)
    result.rejected[:0] = ruled_out
    note(
        f"planned {result.planned:,} of {len(candidates):,} candidates ({result.pruned:,} ruled out by their bound) "
        f"in {result.seconds:.1f} s"
    )
    return context, result


def _front_json(args: argparse.Namespace, context, result) -> list[dict]:
    """The front points with their cluster files written and their plan lines."""
    from planner.advise.report import plan_argv, point_json, quoted, write_cluster_file
    from planner.cli.spec_flags import spec_argv

    job_argv = spec_argv(context.job, JOB_FLAG_FORMS)
    cache_argv = (
        ["--no-cache"] if args.no_cache else (["--cache-dir", args.cache_dir] if args.cache_dir else [])
    )
    points = []
    for rank, point in enumerate(result.front, 1):
        path = str(write_cluster_file(point.candidate, context.offers, args.write_clusters))
        command = quoted(plan_argv(path, job_argv, cache_argv, f"plan-{rank}.json"))
        points.append(point_json(rank, point, context, cluster_file=path, plan_command=command))
    if points:
        note(f"wrote the front's {len(points)} cluster configs to {args.write_clusters}/")
    return points


def _pick(args: argparse.Namespace, context, front: list[dict], result) -> None:
    """Write the plan of front point ``--pick`` as ``batchplan plan`` makes it from its cluster file."""
    from planner.cluster import load_cluster
    from planner.driver import DriverOptions, plan_without_ray
    from planner.plan.io import write_plan

    if args.pick > len(front):
        raise ConfigError(f"--pick {args.pick}: the front has {len(front)} point(s) (choose 1-{len(front)})")
    chosen = front[args.pick - 1]
    outcome = plan_without_ray(
        context.job,
        load_cluster(chosen["cluster_file"]),
        options=DriverOptions(cache=_cache(args), plan_path=args.output),
    )
    plan = outcome.plan
    assert plan is not None
    expected = result.front[args.pick - 1].samples_per_s
    if abs(plan.throughput_samples_per_s - expected) > 1e-9 * expected:
        note(
            f"warning: the plan's throughput {plan.throughput_samples_per_s:.6g} differs from the search's "
            f"{expected:.6g} samples/s"
        )
    write_plan(plan, getattr(args, "output_path", None) or args.output)
    note(f"wrote {args.output} (front point {args.pick}: {chosen['cluster']})")


def run(args: argparse.Namespace) -> int:
    from planner.advise.report import advice_json
    from planner.cli.advise_render import print_advice

    job = job_from_args(args)
    _check_args(args, job)
    start = time.monotonic()
    context, result = _search(args, job)
    front = _front_json(args, context, result)
    document = advice_json(result, context, args.offers, front)
    if args.plot:
        from planner.cli.plot import plot_advice

        note(f"wrote {plot_advice(result, front, args.plot)}")
    if args.pick is not None:
        _pick(args, context, front, result)
    note(f"advise took {time.monotonic() - start:.1f} s")
    print_advice(document, as_json=args.json)
    if not front:  # the result printed says why each was left out; the error line says what it means
        raise InfeasiblePlanError(
            f"no candidate cluster of these offers can run the job ({len(result.rejected):,} left out, each with why in "
            f"the result; raise --budget-per-hour, --deadline or --max-gpus, or add offers)"
        )
    return 0
