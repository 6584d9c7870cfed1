"""One rank's view of a plan: what a rank needs to train and to check its launch, typed, from the whole ``Plan``
or from its own part of an indexed plan file (``planner.plan.layout``).

A rank of a 65,536-rank job must not parse 33 MB of other ranks' entries (every rank reading the whole plan
took 66 s at 8,000 ranks). :func:`read_rank_view` reads the file's bytes once, checks the SHA-256 of the
index beside it (``plan.json.index``) over them, and parses only the header, this rank's entry and its
node's; it validates everything it reads with the validator's own checks (``planner.plan.validate``: types
and limits; ``planner.plan.derived``: the totals over the index's batches, this rank's loss weight and step
time; its node's launch line rebuilt). Other ranks' entries are not read here, so they are checked by the
ranks that read them and by ``show``. Whenever the fast path finds anything it does not accept (no index, a
digest that does not match, a field it refuses), the plan is read whole and validated as ``show`` does, so
every error a rank reports is the one ``show`` reports.

Known limitations: the digest proves that plan and index were written together, not who wrote them (as the
profile cache's checksum); someone who can write the plan can write any plan. An index forged with its
digest recomputed still cannot give a rank another split than the entries' bytes hold
(``planner.plan.layout``), but a malformed entry of another rank is seen only by that rank and by ``show``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.job import JobSpec
from planner.jsonio import check_tree, loads_strict, read_limited_bytes
from planner.plan.derived import TIME_REL_TOLERANCE, check_loss_weight, check_totals, rank_time_fit
from planner.plan.io import plan_fix
from planner.plan.launch import DEFAULT_PLAN_PATH, NodeLaunch
from planner.plan.layout import PlanParts, index_path, plan_parts
from planner.plan.types import LaunchInfo, NodeEntry, Plan, RankEntry
from planner.plan.validate import (
    MAX_PLAN_BYTES,
    check_header,
    check_node_fields,
    check_rank_fields,
    checked_job,
    validate_plan,
)
from planner.profiles.checks import checked_profile
from planner.profiles.profile import DeviceProfile

#: picks the rank to read once the plan's world size is known (``load_rank_plan``: ``RANK``, ``WORLD_SIZE``);
#: its second argument gives the plan's nodes, for a message (parsed only when called)
RankChoice = Callable[[int, Callable[[], Sequence[NodeEntry]]], int]


@dataclass(frozen=True, kw_only=True)
class RankView:
    """One rank's part of a validated plan."""

    entry: RankEntry
    node: NodeEntry
    """the node the rank runs on"""
    num_nodes: int
    world_size: int
    global_batch: int
    accumulate: int
    step_batch: int
    batches: tuple[int, ...]
    """every rank's batch, in rank order (what the sampler needs to find this rank's slice)"""
    job: JobSpec
    profile: DeviceProfile
    """the rank's profile (``entry.profile``)"""
    launch: LaunchInfo


def rank_view(plan: Plan, rank: int) -> RankView:
    """Rank ``rank``'s view of a typed (so validated) plan."""
    entry = plan.ranks[rank]
    assert plan.launch is not None  # a validated plan has one
    return RankView(entry=entry, node=plan.nodes[entry.node_rank], num_nodes=len(plan.nodes),
                    world_size=plan.world_size, global_batch=plan.global_batch, accumulate=plan.accumulate,
                    step_batch=plan.step_batch, batches=tuple(r.batch for r in plan.ranks), job=plan.job,
                    profile=plan.profiles[entry.profile], launch=plan.launch)


def read_rank_view(path: str | os.PathLike, choose: RankChoice) -> RankView:
    """The view of the rank ``choose(world_size, nodes)`` names, read from the plan file ``path`` (module docstring).

    Raises:
        ConfigError: the file is missing, over the size limit (refused before it is read), or not a valid plan;
            or ``choose`` refuses the plan's world size.
    """
    source = Path(path)
    where = str(source)
    if not source.is_file():
        raise ConfigError(f"plan file {source} does not exist (create one with: batchplan plan ... -o {source})")
    raw = read_limited_bytes(source, what="plan file", max_bytes=MAX_PLAN_BYTES, fix=plan_fix(source))
    parts = _indexed_parts(raw, source)
    header = None
    if parts is not None:
        try:
            header = _checked_header(parts, where)
        except ConfigError:
            header = None
    if parts is None or header is None:
        return _whole(raw, where, choose)
    # a refusal by choose is about the launch, not the file: it stands
    rank = choose(header["world_size"], lambda: [_checked_node(parts, j, where) for j in range(parts.num_nodes)])
    try:
        return _part_view(parts, header, rank, where)
    except ConfigError:
        return _whole(raw, where, choose)


def _indexed_parts(raw: bytes, source: Path) -> PlanParts | None:
    """The plan's parts by the index beside it; None without one (or with one that is not a file, too large,
    unreadable or not this plan's: the plan is then read whole)."""
    index = index_path(source)
    try:
        index_text = read_limited_bytes(index, what="plan index", max_bytes=MAX_PLAN_BYTES, fix="")
    except ConfigError:
        return None
    return plan_parts(raw, index_text, str(source))


def _whole(raw: bytes, where: str, choose: RankChoice) -> RankView:
    document = loads_strict(raw, source=f"plan file {where}", fix=plan_fix(Path(where)))
    plan = validate_plan(document, where=where)
    return rank_view(plan, choose(plan.world_size, lambda: plan.nodes))


def _checked_header(parts: PlanParts, where: str) -> dict[str, Any]:
    """The header's fields checked as the validator checks them, and the totals over the index's batches."""
    header = parts.header
    check_tree(header, where)
    check_header(header, where)
    check_totals(header["world_size"], header["global_batch"], header["accumulate"], header["step_batch"],
                 parts.batches, where)
    return header


def _part_view(parts: PlanParts, header: dict[str, Any], rank: int, where: str) -> RankView:
    """Rank ``rank``'s entry and node parsed from their own bytes and checked against the header."""
    at = f"{where}: ranks[{rank}]"
    data = parts.rank(rank)
    check_rank_fields(data, rank, header["profiles"], where)
    entry = RankEntry.from_json(data)
    if entry.rank != rank or entry.batch != parts.batches[rank]:
        raise ConfigError(f"{at} is not the entry the plan's index names")
    check_loss_weight(entry.loss_weight, entry.batch, header["world_size"], header["step_batch"], at)
    profile = checked_profile(header["profiles"][entry.profile], f"{where}.profiles[{entry.profile!r}]")
    if "measured" not in header:  # as planner.plan.derived.check_identities
        wanted = rank_time_fit(profile.time_fit, entry.speed_factor).predict_s(entry.batch)
        if not math.isclose(entry.predicted_step_time_s, wanted, rel_tol=TIME_REL_TOLERANCE):
            raise ConfigError(f"{at}.predicted_step_time_s is not its profile's time")
    if not 0 <= entry.node_rank < parts.num_nodes:
        raise ConfigError(f"{at}.node_rank {entry.node_rank} is not a node of the plan")
    node = _checked_node(parts, entry.node_rank, where)
    first = node if entry.node_rank == 0 else _checked_node(parts, 0, where)
    launch = LaunchInfo.from_json(header["launch"])
    if node.name != entry.node or not entry.local_rank < node.nproc_per_node:
        raise ConfigError(f"{at} is not on its node {node.name!r} as the plan says")
    if launch.master_addr != (first.address or first.name):
        raise ConfigError(f"{where}.launch.master_addr is not the address of node rank 0")
    _check_node_launch(node, entry, launch, parts.num_nodes, where)
    return RankView(entry=entry, node=node, num_nodes=parts.num_nodes, world_size=header["world_size"],
                    global_batch=header["global_batch"], accumulate=header["accumulate"],
                    step_batch=header["step_batch"], batches=parts.batches, job=checked_job(header["job"], where),
                    profile=profile, launch=launch)


def _checked_node(parts: PlanParts, j: int, where: str) -> NodeEntry:
    data = parts.node(j)
    check_node_fields(data, j, where)
    node = NodeEntry.from_json(data)
    if node.node_rank != j:
        raise ConfigError(f"{where}: nodes[{j}].node_rank is {node.node_rank}, expected {j}")
    return node


def _check_node_launch(node: NodeEntry, entry: RankEntry, launch: LaunchInfo, num_nodes: int, where: str) -> None:
    """The rank's device is its slot of the node's device list, and the node's line and environment are the
    ones its fields give (``planner.plan.validate.check_node_launch`` on the whole plan)."""
    rebuilt = NodeLaunch(nnodes=num_nodes, node_rank=node.node_rank, nproc_per_node=node.nproc_per_node,
                         master_addr=launch.master_addr, master_port=launch.master_port,
                         cuda_visible_devices=node.cuda_visible_devices, script=launch.script,
                         plan_path=launch.plan_path or DEFAULT_PLAN_PATH)
    devices = node.cuda_visible_devices.split(",")
    device = devices[entry.local_rank] if len(devices) == node.nproc_per_node else None
    if device is None or (device.isdigit() and int(device) != entry.device_index):
        raise ConfigError(f"{where}: nodes[{node.node_rank}].cuda_visible_devices does not name rank {entry.rank}'s device")
    if node.torchrun != rebuilt.torchrun_line() or (node.env is not None and node.env != rebuilt.env()):
        raise ConfigError(f"{where}: nodes[{node.node_rank}] holds a launch line its fields do not give")
