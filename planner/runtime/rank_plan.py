"""One rank's part of a plan: read ``plan.json`` inside a torchrun job and pick this process's entry.

Pure Python (no torch): ``load_rank_plan`` can run before ``init_process_group``, so a launch that does not
match the plan (wrong number of processes, nodes started in a different order) fails with a message that
says how to launch, before any collective could hang.

A rank reads only its part of an indexed plan file (``planner.plan.rank_view``: the header, its entry, its
node; under a second at 65,536 ranks) and checks it with the validator's own rules, which ``show`` and the
writer use too (finite numbers, types, each rank's ``loss_weight = batch · world_size / step_batch`` and step
time); a plan without a matching index is read and validated whole. This module adds what only the running
job can check: the launcher's environment against the plan, and the GPU the rank runs on against its entry
(``planner.runtime.rank_gpu``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import ConfigError
from planner.plan.derived import WEIGHT_REL_TOLERANCE as _WEIGHT_REL_TOLERANCE
from planner.runtime.weights import loss_weight as expected_loss_weight

if TYPE_CHECKING:
    from planner.plan.rank_view import RankView
    from planner.plan.types import NodeEntry, Plan
    from torchkit.hardware.nvml import GpuStats

__all__ = ["RankPlan", "load_rank_plan"]

#: most nodes a launch summary in an error names (a plan can have thousands)
_MAX_SUMMARY_NODES = 16


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
            raise ConfigError(
                f"RankPlan: loss_weight {self.loss_weight!r} != batch × world_size / step_batch = {wanted!r}"
            )

    @property
    def offset(self) -> int:
        """Where this rank's samples start inside a global step: the sum of the batches of lower ranks."""
        return sum(self.batches[: self.rank])


def load_rank_plan(
    plan: str | os.PathLike | Mapping[str, Any] | Plan,
    rank: int | None = None,
    env: Mapping[str, str] | None = None,
    *,
    gpu: GpuStats | None = None,
    check_gpu: bool = True,
) -> RankPlan:
    """This process's entry of a plan.

    Args:
        plan: path of a ``plan.json`` (only this rank's part is read where the file has its index:
            ``planner.plan.rank_view``), the plan as a mapping (checked with ``planner.plan.io.validate_plan``)
            or a typed ``Plan``.
        rank: the global rank; default ``RANK`` from the environment (set by torchrun), or 0 for a
            one-rank plan started without a launcher.
        env: the environment to read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK`` and
            ``CUDA_VISIBLE_DEVICES`` from; default ``os.environ``.
        gpu: the GPU this rank runs on; default: read through NVML when the process runs under its node's
            ``CUDA_VISIBLE_DEVICES`` (``planner.runtime.rank_gpu``).
        check_gpu: False to skip the GPU check.

    Raises:
        ConfigError: the plan is malformed; no rank is given or in the environment; ``WORLD_SIZE`` is not
            the plan's world size; torchrun numbered this process differently from the plan (``LOCAL_RANK``
            or ``GROUP_RANK`` disagree with the plan's entry for ``RANK``); a loss weight does not match
            its batch; the GPU is not the type (or memory) its entry was planned for.
    """
    from planner.plan.io import load_plan, validate_plan  # numpy-level imports, only when a plan is read
    from planner.plan.rank_view import rank_view, read_rank_view
    from planner.plan.types import Plan

    environ: Mapping[str, str] = os.environ if env is None else env
    env_rank = _env_int(environ, "RANK")
    if isinstance(plan, Plan | Mapping):
        where = "plan"
        typed = plan if isinstance(plan, Plan) else validate_plan(dict(plan), where=where)
        view = rank_view(
            typed, _choose_rank(rank, env_rank, environ, where, typed.world_size, lambda: typed.nodes)
        )
        whole: Callable[[], Plan] = lambda: typed  # noqa: E731
    else:
        where = str(plan)
        view = read_rank_view(
            Path(plan),
            lambda world_size, nodes: _choose_rank(rank, env_rank, environ, where, world_size, nodes),
        )
        whole = lambda: load_plan(Path(plan))  # noqa: E731
    entry = view.entry
    this_process = env_rank == entry.rank  # the environment describes this very process
    if this_process:
        # torchrun's numbering must match the plan's, or this rank would take the batch planned for another GPU
        _check_launch_position(environ, view, where)
    if check_gpu and (gpu is not None or this_process):
        from planner.runtime.rank_gpu import check_rank_gpu, local_gpu

        here = gpu if gpu is not None else local_gpu(view, environ)
        if here is not None:
            check_rank_gpu(view, here, where, whole)
    return RankPlan(
        rank=entry.rank,
        world_size=view.world_size,
        local_rank=entry.local_rank,
        node_rank=entry.node_rank,
        batch=entry.batch,
        loss_weight=entry.loss_weight,
        step_batch=view.step_batch,
        global_batch=view.global_batch,
        accumulate=view.accumulate,
        device_index=entry.device_index,
        gpu=entry.gpu,
        batches=view.batches,
    )


def _choose_rank(
    rank: int | None,
    env_rank: int | None,
    environ: Mapping[str, str],
    where: str,
    world_size: int,
    nodes: Callable[[], Sequence[NodeEntry]],
) -> int:
    """The rank to read, once the plan's world size is known; ``WORLD_SIZE`` must be it."""
    env_world_size = _env_int(environ, "WORLD_SIZE")
    if env_world_size is not None and env_world_size != world_size:
        raise ConfigError(
            f"{where} is for {world_size} ranks but WORLD_SIZE={env_world_size}: re-plan for the devices this "
            f"job has, or launch with the plan's torchrun lines (nodes[].torchrun: {_launch_summary(nodes())})"
        )
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
    return rank


def _check_launch_position(environ: Mapping[str, str], view: RankView, where: str) -> None:
    entry = view.entry
    for variable, field in (("LOCAL_RANK", "local_rank"), ("GROUP_RANK", "node_rank")):
        value = _env_int(environ, variable)
        planned = getattr(entry, field)
        if value is not None and value != planned:
            raise ConfigError(
                f"{where} puts rank {entry.rank} on node {entry.node!r} as {field} {planned}, but torchrun "
                f"started it with {variable}={value}: the nodes were launched in a different order or shape "
                f"than planned. Run each node's own line from the plan (static rendezvous with --node-rank; "
                f"this rank's node is {_launch_summary([view.node])})"
            )


def _launch_summary(nodes: Sequence[NodeEntry]) -> str:
    parts = [
        f"{n.name}: --node-rank {n.node_rank} --nproc-per-node {n.nproc_per_node}"
        for n in nodes[:_MAX_SUMMARY_NODES]
    ]
    if len(nodes) > _MAX_SUMMARY_NODES:
        parts.append(f"... {len(nodes)} nodes in all, see batchplan show PLAN")
    return "; ".join(parts) if parts else "see batchplan show plan.json"


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={raw!r} is not an integer (torchrun sets it)"
        ) from None
