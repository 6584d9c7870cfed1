"""What ``batchplan advise`` reports about a search: the front as JSON-ready data, each point with the cluster
config it needs and the ``batchplan plan`` line that reproduces its plan. Computed here, printed by the CLI
(``planner.cli.advise``). No torch, Ray or pynvml."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from planner.advise.candidates import Candidate
from planner.advise.evaluate import AdviseContext, Evaluated
from planner.advise.offers import OfferSet
from planner.advise.search import SearchResult
from planner.errors import ConfigError
from planner.files import write_file_safely
from torchkit.terminal_text import printable

SCHEMA = "batchplan/advise@1"


def cluster_file_text(candidate: Candidate, offers: OfferSet) -> str:
    """The candidate's cluster config as YAML, with where its offers and prices come from."""
    lines = [f"# candidate {candidate.label} of {offers.source_path} (written by batchplan advise)"]
    for offer, nodes in candidate.parts:
        # a comment line: whatever the offer says stays inside it (escaped; the offers reader refuses control
        # characters already)
        lines.append(
            printable(
                f"#   {nodes}× {offer.name}: {offer.gpus_per_node}× {offer.gpu.name}, "
                f"${offer.price_per_node_hour_usd:g}/node-h ({offer.source}, {offer.date})"
            )
        )
    body = yaml.safe_dump(candidate.cluster_config(offers), sort_keys=False, default_flow_style=None)
    return "\n".join(lines) + "\n" + body


def write_cluster_file(candidate: Candidate, offers: OfferSet, directory: str) -> Path:
    """Write the candidate's cluster config into ``directory`` (atomically: nothing half-written)."""
    path = Path(directory) / f"{candidate.slug}.yaml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create {directory}: {exc.strerror or exc} (choose another --write-clusters directory)"
        ) from exc
    return write_file_safely(
        path,
        cluster_file_text(candidate, offers),
        what="the candidate's cluster config",
        fix="choose another --write-clusters directory",
    )


def plan_argv(
    cluster_file: str, job_argv: Sequence[str], cache_argv: Sequence[str], output: str
) -> list[str]:
    """The ``batchplan plan`` line that makes a candidate's plan: its cluster config, no Ray, the same job."""
    return ["batchplan", "plan", "--cluster", cluster_file, "--no-ray", *job_argv, *cache_argv, "-o", output]


def point_json(
    rank: int, point: Evaluated, context: AdviseContext, *, cluster_file: str, plan_command: str
) -> dict[str, Any]:
    """One front point as ``--json`` gives it."""
    plan, candidate = point.plan, point.candidate
    return {
        "rank": rank,
        "cluster": candidate.label,
        "network": candidate.network,
        "nodes": [
            {
                "offer": o.name,
                "count": n,
                "gpu": o.gpu.name,
                "gpus_per_node": o.gpus_per_node,
                "price_per_node_hour_usd": o.price_per_node_hour_usd,
                "price_source": o.source,
                "price_date": o.date,
            }
            for o, n in candidate.parts
        ],
        "gpus": candidate.num_gpus,
        "price_per_hour_usd": candidate.price_per_hour_usd,
        "time_per_epoch_s": point.time_per_epoch_s,
        "time_per_epoch_range_s": list(point.time_per_epoch_range_s),
        "cost_per_epoch_usd": point.cost_per_epoch_usd,
        "cost_per_epoch_range_usd": list(point.cost_per_epoch_range_usd),
        "samples_per_s": point.samples_per_s,
        "global_batch": plan.global_batch,
        "accumulate": plan.accumulate,
        "predicted_step_time_s": plan.predicted_step_time_s,
        "predicted_comm_time_s": plan.predicted_comm_time_s or 0.0,
        "comm_share": plan.comm.exposed_share if plan.comm is not None else 0.0,
        "balance_efficiency": plan.balance_efficiency,
        "uncalibrated": context.uncalibrated(candidate),
        "cluster_file": cluster_file,
        "plan_command": plan_command,
    }


def advice_json(
    result: SearchResult, context: AdviseContext, offers_path: str, front: list[dict[str, Any]]
) -> dict[str, Any]:
    """The whole ``--json`` document."""
    job = context.job
    return {
        "schema": SCHEMA,
        "offers": offers_path,
        "model": job.model,
        "global_batch": job.global_batch,
        "epoch_samples": context.epoch_samples,
        "front": front,
        "candidates": result.candidates,
        "evaluated": result.planned,
        "pruned": result.pruned,
        "rejected": [{"cluster": r.cluster, "reason": r.reason} for r in result.rejected],
        "seconds": round(result.seconds, 3),
        "profiles": {
            gpu: {
                "key": f.key,
                "max_batch": f.max_batch,
                "samples_per_s_at_max_batch": f.rate_samples_per_s,
                "calibrated": f.calibrated,
            }
            for gpu, f in context.gpus.items()
        },
    }


def quoted(argv: Sequence[str]) -> str:
    return shlex.join(argv)
