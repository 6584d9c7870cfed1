"""The figures a plan derives from its typed data, each computed here once, and the identities that tie them.

- A rank's step-time curve is its profile's divided by its ``speed_factor`` (a GPU that other work keeps
  busy runs at that share of the profiled speed, ``planner.probing.busy``): :func:`rank_time_fit`. The
  allocation, the rank entries and the expected balance range all read it (``planner.plan.build``), and the
  validator holds every rank's ``predicted_step_time_s`` against it.
- A rank's loss weight is ``w_i = b_i · W / B`` (the derivation is in ``planner.runtime.weights``):
  :func:`loss_weight_of`. The builder writes it, the validator and the runtime check it.
- :func:`check_identities`: the rules between the fields of a typed ``Plan`` (world size, rank and node
  numbering, step and global batch, loss weights, rank times, low ≤ balance efficiency ≤ high), used by the
  builder, the reader (``Plan.from_json``) and so the writer, which reads what it writes.

Pure Python; every broken identity is a ``ConfigError`` naming the field and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from planner.errors import ConfigError
from torchkit.step.fit import AffineTimeFit

if TYPE_CHECKING:
    from planner.plan.types import Plan, RankEntry

#: a weight or a step time read back from JSON is the float the planner wrote; allow for a writer that rounded
WEIGHT_REL_TOLERANCE = 1e-9
#: how far a rank's step time may be from its curve, relative (``t/f`` and ``t0/f + t1/f·b`` round differently)
TIME_REL_TOLERANCE = 1e-9
#: how far the balance efficiency may sit outside its stated range (the two are computed by different sums)
RANGE_ABS_TOLERANCE = 1e-9


def rank_time_fit(profile_fit: AffineTimeFit, speed_factor: float) -> AffineTimeFit:
    """The step-time curve of a rank whose GPU gives it ``speed_factor`` of the profiled speed: ``t(b)/f``."""
    if not 0 < speed_factor <= 1:
        raise ConfigError(f"speed_factor must be in (0, 1], got {speed_factor!r}")
    if speed_factor == 1:
        return profile_fit
    return AffineTimeFit(intercept_s=profile_fit.intercept_s / speed_factor,
                         s_per_sample=profile_fit.s_per_sample / speed_factor)


def loss_weight_of(batch: int, world_size: int, step_batch: int) -> float:
    """``batch · world_size / step_batch``: the factor a rank multiplies its mean loss by (arguments trusted;
    ``planner.runtime.weights.loss_weight`` checks a user's)."""
    return batch * world_size / step_batch


def check_loss_weight(weight: float, batch: int, world_size: int, step_batch: int, at: str) -> None:
    """``weight`` is the loss weight of ``batch`` in a step of ``step_batch`` over ``world_size`` ranks."""
    wanted = loss_weight_of(batch, world_size, step_batch)
    if not math.isclose(float(weight), wanted, rel_tol=WEIGHT_REL_TOLERANCE):
        raise ConfigError(
            f"{at}.loss_weight is {weight!r} but its batch {batch} needs batch × world_size / step_batch = "
            f"{batch} × {world_size} / {step_batch} = {wanted!r} (were batches edited by hand? regenerate the plan "
            "with batchplan plan, or fix the weights)"
        )


def check_totals(world_size: int, global_batch: int, accumulate: int, step_batch: int, batches: Sequence[int],
                 where: str) -> None:
    """``world_size = len(batches) > 0``, ``step_batch = Σ batches``, ``global_batch = step_batch × accumulate``."""
    if world_size != len(batches):
        raise ConfigError(f"{where}: world_size {world_size} != number of ranks {len(batches)}")
    step = sum(batches)
    if step != step_batch:
        raise ConfigError(f"{where}: step_batch {step_batch} != sum of rank batches {step}")
    if global_batch != step_batch * accumulate:
        raise ConfigError(
            f"{where}: global_batch != step_batch × accumulate ({global_batch} != {step_batch} × {accumulate})"
        )


def check_identities(plan: Plan, where: str = "plan") -> None:
    """Every identity of the module docstring on a typed plan.

    Raises:
        ConfigError: the first identity broken, naming ``where`` and the field.
    """
    check_totals(plan.world_size, plan.global_batch, plan.accumulate, plan.step_batch,
                 [r.batch for r in plan.ranks], where)
    _check_numbering(plan, where)
    measured = "measured" in plan.extra  # a re-balanced plan states the times its job measured, not the profile's
    for i, rank in enumerate(plan.ranks):
        at = f"{where}: ranks[{i}]"
        check_loss_weight(rank.loss_weight, rank.batch, plan.world_size, plan.step_batch, at)
        if not measured:
            _check_rank_time(rank, plan, at)
    span = plan.balance_efficiency_range
    if span is not None:
        low, high = span
        if not low - RANGE_ABS_TOLERANCE <= plan.balance_efficiency <= high + RANGE_ABS_TOLERANCE:
            raise ConfigError(
                f"{where}: balance_efficiency {plan.balance_efficiency!r} is outside its own expected range "
                f"balance_efficiency_range [{low!r}, {high!r}] (regenerate the plan with batchplan plan)"
            )


def _check_rank_time(rank: RankEntry, plan: Plan, at: str) -> None:
    fit = rank_time_fit(plan.profiles[rank.profile].time_fit, rank.speed_factor)
    wanted = fit.predict_s(rank.batch)
    if not math.isclose(rank.predicted_step_time_s, wanted, rel_tol=TIME_REL_TOLERANCE):
        raise ConfigError(
            f"{at}.predicted_step_time_s is {rank.predicted_step_time_s!r} but its profile {rank.profile!r} at batch "
            f"{rank.batch} and speed_factor {rank.speed_factor!r} gives {wanted!r} (regenerate the plan with "
            "batchplan plan)"
        )


def _check_numbering(plan: Plan, where: str) -> None:
    """Ranks 0..W-1 in order, node by node in node-rank order, each node's local ranks 0..n-1 and its
    ``nproc_per_node`` the number of its ranks; node names unique."""
    position: dict[str, int] = {}
    for j, node in enumerate(plan.nodes):
        if node.node_rank != j:
            raise ConfigError(f"{where}: nodes[{j}].node_rank is {node.node_rank}, expected {j} (nodes in node-rank order)")
        if node.name in position:
            raise ConfigError(f"{where}.nodes names a node twice ({node.name!r})")
        position[node.name] = j
    if not plan.nodes:
        raise ConfigError(f"{where}.nodes is empty (a plan with ranks runs on at least one node)")
    if sum(n.nproc_per_node for n in plan.nodes) != plan.world_size:
        raise ConfigError(f"{where}: nodes' nproc_per_node do not add up to world_size {plan.world_size}")
    counts = [0] * len(plan.nodes)
    current = 0
    for i, rank in enumerate(plan.ranks):
        at = f"{where}: ranks[{i}]"
        if rank.rank != i:
            raise ConfigError(f"{at}.rank is {rank.rank}, expected {i} (ranks must be in order)")
        node_rank = position.get(rank.node)
        if node_rank is None:
            raise ConfigError(f"{at}.node {rank.node!r} is not one of the plan's nodes ({', '.join(position)})")
        if rank.node_rank != node_rank:
            raise ConfigError(f"{at}.node_rank is {rank.node_rank}, but node {rank.node!r} is nodes[{node_rank}]")
        if node_rank != current:
            if node_rank != current + 1 or counts[current] == 0:
                raise ConfigError(
                    f"{at} is on node rank {node_rank} after node rank {current}: torchrun numbers ranks node by "
                    "node, so each node's ranks must follow each other in node order"
                )
            current = node_rank
        if rank.local_rank != counts[node_rank]:
            raise ConfigError(
                f"{at}.local_rank is {rank.local_rank}, expected {counts[node_rank]} (each node's local ranks are "
                "0, 1, ... in rank order, as torchrun numbers them)"
            )
        counts[node_rank] += 1
    for j, node in enumerate(plan.nodes):
        if node.nproc_per_node != counts[j]:
            if counts[j] == 0:
                raise ConfigError(f"{where}: nodes[{j}] has no rank (every node in the plan runs one)")
            raise ConfigError(
                f"{where}: nodes[{j}].nproc_per_node is {node.nproc_per_node} but the plan has {counts[j]} ranks on "
                f"{node.name!r}"
            )
