"""The figures a plan derives from its typed data, each computed here once, and the identities that tie them.

- A rank's step-time curve is its profile's divided by its ``speed_factor`` (a GPU that other work keeps
  busy runs at that share of the profiled speed, ``planner.probing.busy``): :func:`rank_time_fit`. The
  allocation, the rank entries and the expected balance range all read it (``planner.plan.build``), and the
  validator holds every rank's ``predicted_step_time_s`` against it.
- A rank's loss weight is ``w_i = b_i · W / B`` (the derivation is in ``planner.runtime.weights``):
  :func:`loss_weight_of`. The builder writes it, the validator and the runtime check it.
- :func:`check_identities`: the rules between the fields of a ``Plan`` (world size, rank and node numbering,
  step and global batch, loss weights, rank times, low ≤ balance efficiency ≤ high, every rank's profile
  there and physically possible, the ``comm`` section over the plan's ranks, and every node's device list,
  launch line and environment exactly what its fields give, so what ``show`` prints and a scheduler sources
  can only be what the plan's numbers say). ``Plan`` runs it once, on construction, whoever constructs it.

Pure Python; every broken identity is a ``ConfigError`` naming the field (its path in the plan:
``ranks[3].loss_weight``; a reader puts the file's name before it) and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from planner.errors import ConfigError
from planner.plan.launch import DEFAULT_PLAN_PATH, NodeLaunch, check_visible_devices
from planner.profiles.checks import check_profile
from torchkit.step.fit import AffineTimeFit

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
    return AffineTimeFit(
        intercept_s=profile_fit.intercept_s / speed_factor,
        s_per_sample=profile_fit.s_per_sample / speed_factor,
    )


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


def check_totals(
    world_size: int, global_batch: int, accumulate: int, step_batch: int, batches: Sequence[int]
) -> None:
    """``world_size = len(batches) > 0``, ``step_batch = Σ batches``, ``global_batch = step_batch × accumulate``."""
    if world_size != len(batches):
        raise ConfigError(f"world_size {world_size} != number of ranks {len(batches)}")
    step = sum(batches)
    if step != step_batch:
        raise ConfigError(f"step_batch {step_batch} != sum of rank batches {step}")
    if global_batch != step_batch * accumulate:
        raise ConfigError(
            f"global_batch != step_batch × accumulate ({global_batch} != {step_batch} × {accumulate})"
        )


def check_identities(plan: Any) -> None:
    """Every identity of the module docstring on a plan (a ``planner.plan.types.Plan``; this module sits below
    the types, which call it).

    Raises:
        ConfigError: the first identity broken, naming the field by its path in the plan.
    """
    check_totals(
        plan.world_size, plan.global_batch, plan.accumulate, plan.step_batch, [r.batch for r in plan.ranks]
    )
    _check_numbering(plan)
    for key, profile in plan.profiles.items():
        check_profile(profile, f"profiles[{key!r}]")
    _check_ranks(plan)
    check_sections(plan)
    _check_launch_lines(plan)


def check_sections(plan: Any) -> None:
    """The identities of a plan's fields apart from its ranks and nodes (a reader of one rank's part has
    those): low <= balance efficiency <= high, and the ``comm`` section over the plan's world size."""
    span = plan.balance_efficiency_range
    if span is not None:
        low, high = span
        if not low <= high:
            raise ConfigError(
                f"balance_efficiency_range [{low!r}, {high!r}] must be [low, high] with low <= high"
            )
        if not low - RANGE_ABS_TOLERANCE <= plan.balance_efficiency <= high + RANGE_ABS_TOLERANCE:
            raise ConfigError(
                f"balance_efficiency {plan.balance_efficiency!r} is outside its own expected range "
                f"balance_efficiency_range [{low!r}, {high!r}] (regenerate the plan with batchplan plan)"
            )
    if (plan.comm is None) != (plan.predicted_comm_time_s is None):
        raise ConfigError("comm and predicted_comm_time_s must be given together (the synchronisation model)")
    if plan.comm is not None and plan.comm.num_ranks != plan.world_size:
        raise ConfigError(f"comm.num_ranks {plan.comm.num_ranks} != world_size {plan.world_size}")


def _check_ranks(plan: Any) -> None:
    """Every rank's profile is one of the plan's, its loss weight is its batch's and, unless a re-balanced
    run measured the times, its step time its profile's: checked for all ranks at once (numpy), and the
    first rank that breaks a rule is named by the rule's own check."""
    ranks = plan.ranks
    unknown = next((r for r in ranks if r.profile not in plan.profiles), None)
    if unknown is not None:
        raise ConfigError(f"ranks[{unknown.rank}].profile {unknown.profile!r} is not a key of profiles")
    batches = np.fromiter((r.batch for r in ranks), dtype=np.float64, count=len(ranks))
    weights = np.fromiter((r.loss_weight for r in ranks), dtype=np.float64, count=len(ranks))
    for i in _suspects(weights, batches * plan.world_size / plan.step_batch, WEIGHT_REL_TOLERANCE):
        check_loss_weight(
            ranks[i].loss_weight, ranks[i].batch, plan.world_size, plan.step_batch, f"ranks[{i}]"
        )
    if plan.measured is not None:  # a re-balanced plan states the times its job measured, not the profile's
        return
    fits = {key: profile.time_fit for key, profile in plan.profiles.items()}
    intercept = np.fromiter((fits[r.profile].intercept_s for r in ranks), dtype=np.float64, count=len(ranks))
    slope = np.fromiter((fits[r.profile].s_per_sample for r in ranks), dtype=np.float64, count=len(ranks))
    speed = np.fromiter((r.speed_factor for r in ranks), dtype=np.float64, count=len(ranks))
    times = np.fromiter((r.predicted_step_time_s for r in ranks), dtype=np.float64, count=len(ranks))
    for i in _suspects(times, (intercept + slope * batches) / speed, TIME_REL_TOLERANCE):
        check_rank_time(ranks[i], fits[ranks[i].profile], f"ranks[{i}]")


def _suspects(values: np.ndarray, wanted: np.ndarray, rel_tol: float) -> list[int]:
    """The indexes where ``values`` may not be within ``rel_tol`` of ``wanted`` (``math.isclose``'s rule): those
    off by more than a quarter of it, so that no index the scalar check would refuse is missed whichever order
    the floating-point operations ran in; the scalar check then decides each."""
    close = np.abs(values - wanted) <= rel_tol / 4 * np.maximum(np.abs(values), np.abs(wanted))
    return np.flatnonzero(~close).tolist()


def check_rank_time(rank: Any, profile_fit: AffineTimeFit, at: str) -> None:
    """A rank's ``predicted_step_time_s`` is its profile's curve at its batch and speed factor."""
    fit = rank_time_fit(profile_fit, rank.speed_factor)
    wanted = fit.predict_s(rank.batch)
    if not math.isclose(rank.predicted_step_time_s, wanted, rel_tol=TIME_REL_TOLERANCE):
        raise ConfigError(
            f"{at}.predicted_step_time_s is {rank.predicted_step_time_s!r} but its profile {rank.profile!r} at batch "
            f"{rank.batch} and speed_factor {rank.speed_factor!r} gives {wanted!r} (regenerate the plan with "
            "batchplan plan)"
        )


def _check_numbering(plan: Any) -> None:
    """Ranks 0..W-1 in order, node by node in node-rank order, each node's local ranks 0..n-1 and its
    ``nproc_per_node`` the number of its ranks; node names unique."""
    position: dict[str, int] = {}
    for j, node in enumerate(plan.nodes):
        if node.node_rank != j:
            raise ConfigError(
                f"nodes[{j}].node_rank is {node.node_rank}, expected {j} (nodes in node-rank order)"
            )
        if node.name in position:
            raise ConfigError(f"nodes names a node twice ({node.name!r})")
        position[node.name] = j
    if not plan.nodes:
        raise ConfigError("nodes is empty (a plan with ranks runs on at least one node)")
    if sum(n.nproc_per_node for n in plan.nodes) != plan.world_size:
        raise ConfigError(f"nodes' nproc_per_node do not add up to world_size {plan.world_size}")
    counts = [0] * len(plan.nodes)
    current = 0
    for i, rank in enumerate(plan.ranks):
        at = f"ranks[{i}]"
        if rank.rank != i:
            raise ConfigError(f"{at}.rank is {rank.rank}, expected {i} (ranks must be in order)")
        node_rank = position.get(rank.node)
        if node_rank is None:
            raise ConfigError(
                f"{at}.node {rank.node!r} is not one of the plan's nodes ({', '.join(position)})"
            )
        if rank.node_rank != node_rank:
            raise ConfigError(
                f"{at}.node_rank is {rank.node_rank}, but node {rank.node!r} is nodes[{node_rank}]"
            )
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
                raise ConfigError(f"nodes[{j}] has no rank (every node in the plan runs one)")
            raise ConfigError(
                f"nodes[{j}].nproc_per_node is {node.nproc_per_node} but the plan has {counts[j]} ranks on "
                f"{node.name!r}"
            )


def _check_launch_lines(plan: Any) -> None:
    """Each node's device list, torchrun line and environment are exactly what its checked fields give."""
    first = plan.nodes[0].address or plan.nodes[0].name
    if plan.launch.master_addr != first:
        raise ConfigError(
            f"launch.master_addr {plan.launch.master_addr!r} is not the address of node rank 0 ({first!r})"
        )
    start = 0
    for node in plan.nodes:
        check_node_launch(node, plan.ranks[start : start + node.nproc_per_node], plan.launch, len(plan.nodes))
        start += node.nproc_per_node


def node_launch(node: Any, launch: Any, num_nodes: int) -> NodeLaunch:
    """The launch of ``node`` (a ``NodeEntry``) rebuilt from its fields and the plan's ``launch`` (checked by
    ``NodeLaunch``)."""
    return NodeLaunch(
        nnodes=num_nodes,
        node_rank=node.node_rank,
        nproc_per_node=node.nproc_per_node,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        cuda_visible_devices=node.cuda_visible_devices,
        script=launch.script,
        plan_path=launch.plan_path or DEFAULT_PLAN_PATH,
    )


def check_node_launch(node: Any, node_ranks: Sequence[Any], launch: Any, num_nodes: int) -> None:
    """``node``'s device list names its ranks' devices (``node_ranks``: its ranks in local-rank order, or the one
    rank a reader has), and its stored line and environment are rebuilt exactly from its fields."""
    at = f"nodes[{node.node_rank}]"
    devices = check_visible_devices(node.cuda_visible_devices, f"{at}.cuda_visible_devices")
    if len(devices) != node.nproc_per_node:
        raise ConfigError(
            f"{at}.cuda_visible_devices {node.cuda_visible_devices!r} names {len(devices)} devices for "
            f"{node.nproc_per_node} ranks"
        )
    for rank in node_ranks:
        device = devices[rank.local_rank]
        if device.isdigit() and int(device) != rank.device_index:
            raise ConfigError(
                f"{at}.cuda_visible_devices lists device {device} where rank {rank.rank} runs on device "
                f"{rank.device_index}"
            )
    rebuilt = node_launch(node, launch, num_nodes)
    line = rebuilt.torchrun_line()
    if node.torchrun != line:
        raise ConfigError(
            f"{at}.torchrun is not the line its fields give ({line!r}); edit the fields, not the line, or "
            "regenerate the plan with batchplan plan"
        )
    if node.env is not None and node.env != rebuilt.env():
        raise ConfigError(f"{at}.env is not the environment its fields give ({rebuilt.env()!r})")
