"""One rank's part of a plan: read ``plan.json`` inside a torchrun job and pick this process's entry.

Pure Python (no torch): ``load_rank_plan`` can run before ``init_process_group``, so a launch that does not
match the plan (wrong number of processes, nodes started in a different order) fails with a message that
says how to launch, before any collective could hang.

The plan is checked by ``planner.plan.validate.validate_plan``, the one validator ``show`` and the writer use too
(finite numbers, every cross-field identity including each rank's ``loss_weight = batch · world_size /
step_batch``); this module adds what only the running job can check: the launcher's environment against
the plan.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.runtime.weights import loss_weight as expected_loss_weight

__all__ = ["RankPlan", "load_rank_plan"]

from planner.plan.validate import WEIGHT_REL_TOLERANCE as _WEIGHT_REL_TOLERANCE


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """What one rank needs from the plan to train: its batch, its loss weight and where it runs."""

    rank: int
    """global rank (torchrun's ``RANK``)"""
    world_size: int
    """number of ranks in the job"""
    local_rank: int
    """rank on its node (torchrun's ``LOCAL_RANK``); also the CUDA device index under the plan's
    ``CUDA_VISIBLE_DEVICES``"""
    node_rank: int
    """index of its node (torchrun's ``--node-rank`` / ``GROUP_RANK``)"""
    batch: int
    """samples this rank takes per (micro-)step"""
    loss_weight: float
    """factor for this rank's mean loss: ``batch · world_size / step_batch`` (see ``planner.runtime.weights``)"""
    step_batch: int
    """samples of one (micro-)step over all ranks (the sum of ``batches``)"""
    global_batch: int
    """samples per optimizer step over all ranks: ``step_batch · accumulate``"""
    accumulate: int
    """micro-steps per optimizer step"""
    device_index: int
    """NVML index of its GPU on its node (what the probe saw; not the CUDA index inside the job)"""
    gpu: str
    """GPU type name"""
    batches: tuple[int, ...]
    """every rank's batch, in rank order (what the sampler needs to find this rank's slice)"""

    def __post_init__(self) -> None:
        # the fields repeat each other (batch is batches[rank], step_batch their sum...); a RankPlan built
        # in code (the in-job autobatch) must not disagree with itself, or the gradient silently drifts
        if len(self.batches) != self.world_size or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"RankPlan: rank {self.rank} with {len(self.batches)} batches does not fit world_size {self.world_size}"
            )
        if self.batches[self.rank] != self.batch or sum(self.batches) != self.step_batch:
            raise ConfigError(
                f"RankPlan: batch {self.batch} / step_batch {self.step_batch} disagree with batches {list(self.batches)}"
            )
        if self.global_batch != self.step_batch * self.accumulate:
            raise ConfigError(
                f"RankPlan: global_batch {self.global_batch} != step_batch {self.step_batch} × accumulate {self.accumulate}"
            )
        wanted = expected_loss_weight(self.batch, self.world_size, self.step_batch)
        if not math.isclose(self.loss_weight, wanted, rel_tol=_WEIGHT_REL_TOLERANCE):
            raise ConfigError(f"RankPlan: loss_weight {self.loss_weight!r} != batch × world_size / step_batch = {wanted!r}")

    @property
    def offset(self) -> int:
        """Where this rank's samples start inside a global step: the sum of the batches of lower ranks."""
        return sum(self.batches[: self.rank])


def load_rank_plan(
    plan: str | os.PathLike | Mapping[str, Any],
    rank: int | None = None,
    env: Mapping[str, str] | None = None,
) -> RankPlan:
    """This process's entry of a plan.

    Args:
        plan: path of a ``plan.json`` (read with ``planner.plan.io.read_plan``) or the plan as a mapping
            (checked with ``planner.plan.io.validate_plan``).
        rank: the global rank; default ``RANK`` from the environment (set by torchrun), or 0 for a
            one-rank plan started without a launcher.
        env: the environment to read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``GROUP_RANK`` from;
            default ``os.environ``.

    Raises:
        ConfigError: the plan is malformed; no rank is given or in the environment; ``WORLD_SIZE`` is not
            the plan's world size; torchrun numbered this process differently from the plan (``LOCAL_RANK``
            or ``GROUP_RANK`` disagree with the plan's entry for ``RANK``); a loss weight does not match
            its batch.
    """
    from planner.plan.io import read_plan, validate_plan  # numpy-level imports, only when a plan is read

    environ: Mapping[str, str] = os.environ if env is None else env
    if isinstance(plan, Mapping):
        data = dict(plan)
        where = "plan"
        validate_plan(data, where=where)
    else:
        where = str(plan)
        data = read_plan(Path(plan))

    world_size: int = data["world_size"]
    ranks: list[dict[str, Any]] = data["ranks"]
    batches = tuple(int(r["batch"]) for r in ranks)

    env_world_size = _env_int(environ, "WORLD_SIZE")
    if env_world_size is not None and env_world_size != world_size:
        raise ConfigError(
            f"{where} is for {world_size} ranks but WORLD_SIZE={env_world_size}: re-plan for the devices this "
            f"job has, or launch with the plan's torchrun lines (nodes[].torchrun: {_launch_summary(data)})"
        )

    env_rank = _env_int(environ, "RANK")
    if rank is None and env_rank is None and world_size == 1:
        rank = 0  # a one-rank plan run as plain `python train.py`: there is only one entry to take
    if rank is None:
        if env_rank is None:
            raise ConfigError(
                "no rank given and RANK is not set: start the script with torchrun (it sets RANK, WORLD_SIZE "
                "and LOCAL_RANK) or pass rank= to load_rank_plan"
            )
        rank = env_rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank!r} is not in {where} (it has ranks 0..{world_size - 1})")

    entry = ranks[rank]
    if env_rank == rank:
        # the environment describes this very process: torchrun's numbering must match the plan's, or this
        # rank would take the batch planned for a different GPU
        _check_launch_position(environ, entry, where, data)

    return RankPlan(
        rank=rank,
        world_size=world_size,
        local_rank=int(entry["local_rank"]),
        node_rank=int(entry["node_rank"]),
        batch=int(entry["batch"]),
        loss_weight=float(entry["loss_weight"]),
        step_batch=int(data["step_batch"]),
        global_batch=int(data["global_batch"]),
        accumulate=int(data["accumulate"]),
        device_index=int(entry["device_index"]),
        gpu=str(entry["gpu"]),
        batches=batches,
    )


def _check_launch_position(environ: Mapping[str, str], entry: Mapping[str, Any], where: str, data: Mapping) -> None:
    rank = entry["rank"]
    for variable, field in (("LOCAL_RANK", "local_rank"), ("GROUP_RANK", "node_rank")):
        value = _env_int(environ, variable)
        if value is not None and value != entry[field]:
            raise ConfigError(
                f"{where} puts rank {rank} on node {entry['node']!r} as {field} {entry[field]}, but torchrun "
                f"started it with {variable}={value}: the nodes were launched in a different order or shape "
                f"than planned. Run each node's own line from the plan (static rendezvous with --node-rank: "
                f"{_launch_summary(data)})"
            )


def _launch_summary(data: Mapping[str, Any]) -> str:
    nodes = data.get("nodes") or []
    parts = [f"{n['name']}: --node-rank {n['node_rank']} --nproc-per-node {n['nproc_per_node']}" for n in nodes]
    return "; ".join(parts) if parts else "see batchplan show plan.json"


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer (torchrun sets it)") from None
