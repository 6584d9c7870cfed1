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

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from planner.codec import decode, decode_fields
from planner.errors import ConfigError
from planner.job import JobSpec
from planner.jsonio import read_limited_bytes
from planner.plan.derived import (
    check_loss_weight,
    check_node_launch,
    check_rank_time,
    check_sections,
    check_totals,
)
from planner.plan.io import plan_fix
from planner.plan.layout import PlanParts, index_path, plan_parts
from planner.plan.types import LaunchInfo, NodeEntry, Plan, RankEntry
from planner.plan.validate import MAX_PLAN_BYTES, plan_from_bytes
from planner.profiles.checks import check_profile
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
    return RankView(
        entry=entry,
        node=plan.nodes[entry.node_rank],
        num_nodes=len(plan.nodes),
        world_size=plan.world_size,
        global_batch=plan.global_batch,
        accumulate=plan.accumulate,
        step_batch=plan.step_batch,
        batches=tuple(r.batch for r in plan.ranks),
        job=plan.job,
        profile=plan.profiles[entry.profile],
        launch=plan.launch,
    )


def read_rank_view(path: str | os.PathLike, choose: RankChoice) -> RankView:
    """The view of the rank ``choose(world_size, nodes)`` names, read from the plan file ``path`` (module docstring).

    Raises:
        ConfigError: the file is missing, over the size limit (refused before it is read), or not a valid plan;
            or ``choose`` refuses the plan's world size.
    """
    source = Path(path)
    where = str(source)
    if not source.is_file():
        raise ConfigError(
            f"plan file {source} does not exist (create one with: batchplan plan ... -o {source})"
        )
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
    rank = choose(header.world_size, lambda: [_checked_node(parts, j, where) for j in range(parts.num_nodes)])
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
    plan = plan_from_bytes(raw, where=where, fix=plan_fix(Path(where)))
    return rank_view(plan, choose(plan.world_size, lambda: plan.nodes))


def _checked_header(parts: PlanParts, where: str) -> Any:
    """Every field but the ranks and nodes, read and checked as the whole plan's are (``planner.codec``), the
    sections' identities (``planner.plan.derived.check_sections``) and the totals over the index's batches."""
    header = SimpleNamespace(
        **decode_fields(
            Plan, parts.header, where=where, fix=plan_fix(Path(where)), without=("ranks", "nodes")
        )
    )
    check_sections(header)
    check_totals(header.world_size, header.global_batch, header.accumulate, header.step_batch, parts.batches)
    return header


def _part_view(parts: PlanParts, header: Any, rank: int, where: str) -> RankView:
    """Rank ``rank``'s entry and node parsed from their own bytes and checked against the header."""
    at = f"ranks[{rank}]"
    entry = decode(RankEntry, parts.rank(rank), where=f"{where}: {at}", fix="")
    if entry.rank != rank or entry.batch != parts.batches[rank]:
        raise ConfigError(f"{at} is not the entry the plan's index names")
    if entry.profile not in header.profiles:
        raise ConfigError(f"{at}.profile {entry.profile!r} is not a key of profiles")
    profile = header.profiles[entry.profile]
    check_profile(profile, f"profiles[{entry.profile!r}]")
    check_loss_weight(entry.loss_weight, entry.batch, header.world_size, header.step_batch, at)
    if header.measured is None:  # as planner.plan.derived.check_identities
        check_rank_time(entry, profile.time_fit, at)
    if not 0 <= entry.node_rank < parts.num_nodes:
        raise ConfigError(f"{at}.node_rank {entry.node_rank} is not a node of the plan")
    node = _checked_node(parts, entry.node_rank, where)
    first = node if entry.node_rank == 0 else _checked_node(parts, 0, where)
    if node.name != entry.node or not entry.local_rank < node.nproc_per_node:
        raise ConfigError(f"{at} is not on its node {node.name!r} as the plan says")
    if header.launch.master_addr != (first.address or first.name):
        raise ConfigError("launch.master_addr is not the address of node rank 0")
    check_node_launch(node, [entry], header.launch, parts.num_nodes)
    return RankView(
        entry=entry,
        node=node,
        num_nodes=parts.num_nodes,
        world_size=header.world_size,
        global_batch=header.global_batch,
        accumulate=header.accumulate,
        step_batch=header.step_batch,
        batches=parts.batches,
        job=header.job,
        profile=profile,
        launch=header.launch,
    )


def _checked_node(parts: PlanParts, j: int, where: str) -> NodeEntry:
    node = decode(NodeEntry, parts.node(j), where=f"{where}: nodes[{j}]", fix="")
    if node.node_rank != j:
        raise ConfigError(f"nodes[{j}].node_rank is {node.node_rank}, expected {j}")
    return node
