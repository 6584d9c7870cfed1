"""Where a training integration gets this rank's plan: a ``plan.json`` (``load_rank_plan``) or a ``JobSpec``
planned inside the running job (``autobatch_ddp``: the first rank of each node profiles its GPU type under
``torch_distributed_zero_first``, every rank computes the same plan).

A framework knows the rank, world size, local rank and node rank before the training script can read them
from the environment (Lightning's own launcher sets no ``RANK``); the integration passes them here and the
plan's checks of the launch (``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``, the rank's GPU) run against
them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from planner.errors import ConfigError
from planner.job import JobSpec

if TYPE_CHECKING:
    from planner.plan.types import Plan
    from planner.runtime.rank_plan import RankPlan

__all__ = ["PlanSource", "RankLaunch", "ResolvedPlan", "resolve_plan"]

#: what an integration accepts as its plan: a plan.json path, the plan's document or typed plan, or a job to
#: plan inside the running process group
PlanSource = Union[str, "os.PathLike[str]", Mapping[str, Any], "Plan", JobSpec]


@dataclass(frozen=True, kw_only=True)
class RankLaunch:
    """Where this process sits in the job, as its framework numbered it."""

    rank: int
    """global rank"""
    world_size: int
    """number of processes in the job"""
    local_rank: int
    """rank on its node"""
    node_rank: int | None = None
    """index of its node (torchrun's ``GROUP_RANK``); None where the framework does not say"""

    def environment(self) -> dict[str, str]:
        """``os.environ`` with the launch variables a plan's checks read set to this launch's numbers (the
        rest, ``CUDA_VISIBLE_DEVICES`` among them, as the process has them)."""
        env = dict(os.environ)
        env.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank))
        if self.node_rank is not None:
            env["GROUP_RANK"] = str(self.node_rank)
        return env


@dataclass(frozen=True, kw_only=True)
class ResolvedPlan:
    """This rank's entry and the whole plan it came from."""

    rank_plan: RankPlan
    """this rank's batch, loss weight, accumulate, every rank's batches"""
    plan: Any
    """what the re-balancer reads the whole plan from: the plan.json path, the plan given, or the typed ``Plan``
    planned in the job"""
    origin: str
    """where the plan came from, for the log and the summary"""


def resolve_plan(
    source: PlanSource, launch: RankLaunch, *, autobatch: Mapping[str, Any] | None = None
) -> ResolvedPlan:
    """This rank's plan from ``source``.

    Args:
        source: a ``plan.json`` path, a plan document (mapping) or typed ``Plan``, or a ``JobSpec`` to plan in
            the job (then the process group must be initialised: ``autobatch_ddp`` gathers every rank).
        launch: this process's numbers, from its framework.
        autobatch: options for ``autobatch_ddp`` (``gpu=`` to simulate a catalog GPU type on CPU, ``cache_dir=``);
            only with a ``JobSpec``.

    Raises:
        ConfigError: the plan does not match the launch (world size, numbering, GPU), or ``autobatch`` was given
            with a plan file.
        InfeasiblePlanError: the job cannot be planned on these ranks.
    """
    from planner.runtime.rank_plan import load_rank_plan

    env = launch.environment()
    if isinstance(source, JobSpec):
        from planner.runtime.autobatch_ddp import autobatch_ddp

        result = autobatch_ddp(source, env=env, **dict(autobatch or {}))
        origin = f"planned in the job (autobatch_ddp, model {source.model})"
        return ResolvedPlan(rank_plan=result.rank_plan, plan=result.plan, origin=origin)
    if autobatch:
        raise ConfigError(
            "autobatch options are for a JobSpec planned in the job; a plan file is already planned "
            f"(drop autobatch={dict(autobatch)!r})"
        )
    if isinstance(source, str | os.PathLike):
        origin = os.fspath(source)
    else:
        origin = "the plan given"
    rank_plan = load_rank_plan(source, rank=launch.rank, env=env)
    return ResolvedPlan(rank_plan=rank_plan, plan=source, origin=origin)
