"""The one validator of a plan (``batchplan/plan@1``): what ``show``, ``--emit``, the runtime's
``load_rank_plan`` and the writer all call, so none of them accepts a plan another would refuse.

A plan is checked in three layers:

1. the document: size and nesting within limits, every number finite, no control character in any string
   (``planner.jsonio``);
2. the fields: present, of their type, within their range, names and device lists matching strict
   patterns (``planner.plan.launch``);
3. the identities between fields: ``world_size = len(ranks) > 0``; ranks numbered 0..W-1 node by node, each
   node's local ranks 0..n-1; ``nproc_per_node`` = the ranks on that node; ``step_batch = Σ batch``;
   ``global_batch = step_batch · accumulate`` with ``accumulate >= 1``; ``loss_weight = batch · W /
   step_batch``; every profile physically possible (``planner.profiles.checks``); and every launch line and
   environment stored in the plan equal to the one rebuilt from the checked fields, so what ``show`` prints
   and a scheduler sources can only be what the plan's numbers say.

Every failure is a ``ConfigError`` naming the field and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from planner.errors import ConfigError
from planner.jsonio import check_text, check_tree
from planner.plan.comm import check_comm_section
from planner.plan.launch import (
    DEFAULT_PLAN_PATH,
    NodeLaunch,
    check_host,
    check_node_name,
    check_visible_devices,
)
from planner.profiles.checks import checked_profile

SCHEMA = "batchplan/plan@1"
MODES = ("balanced", "max", "uniform")
#: most ranks a plan may hold: 65,536 GPUs is beyond any job this planner is meant for, and bounds the
#: work a hostile plan can cause
MAX_PLAN_RANKS = 65_536
#: largest plan.json read: a 65,536-rank plan is about 45 MB
MAX_PLAN_BYTES = 128 * 2**20
#: a weight read back from JSON is the float the planner wrote; allow for a writer that rounded it
WEIGHT_REL_TOLERANCE = 1e-9
#: largest per-rank batch, accumulation or byte count a plan may hold (2^53: exact in a JSON double)
MAX_COUNT = 2**53

Kind = type | tuple[type, ...]
_NUMBER = (int, float)
TOP_FIELDS: dict[str, Kind] = {
    "schema": str, "created": str, "job": dict, "world_size": int, "global_batch": int, "accumulate": int,
    "step_batch": int, "predicted_step_time_s": _NUMBER, "throughput_samples_per_s": _NUMBER,
    "balance_efficiency": _NUMBER, "mode": str, "ranks": list, "nodes": list, "excluded": list,
    "profiles": dict, "warnings": list,
}
RANK_FIELDS: dict[str, Kind] = {
    "rank": int, "node": str, "node_rank": int, "local_rank": int, "device_index": int, "gpu": str,
    "profile": str, "batch": int, "max_batch": int, "loss_weight": _NUMBER, "predicted_memory_bytes": int,
    "memory_budget_bytes": int, "total_memory_bytes": int, "predicted_step_time_s": _NUMBER,
}
NODE_FIELDS: dict[str, Kind] = {
    "name": str, "node_rank": int, "cuda_visible_devices": str, "nproc_per_node": int, "torchrun": str,
}
LAUNCH_FIELDS: dict[str, Kind] = {"master_addr": str, "master_port": int, "script": str}
EXCLUDED_FIELDS: dict[str, Kind | tuple] = {"node": str, "reason": str}


def validate_plan(plan: Any, where: str = "plan") -> None:
    """Check ``plan`` (a parsed plan.json) against every rule of the module docstring.

    Raises:
        ConfigError: the first rule broken, naming ``where``, the field and the rule.
    """
    if not isinstance(plan, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(plan).__name__}")
    if plan.get("schema") != SCHEMA:
        raise ConfigError(f"{where} has schema {plan.get('schema')!r}, expected {SCHEMA!r} (is it a batchplan plan?)")
    check_tree(plan, where)
    check_fields(plan, TOP_FIELDS, where)
    if plan["mode"] not in MODES:
        raise ConfigError(f"{where}.mode {plan['mode']!r} is not one of {', '.join(MODES)}")
    ranks, _nodes = plan["ranks"], plan["nodes"]
    if not 0 < plan["world_size"] <= MAX_PLAN_RANKS:
        raise ConfigError(f"{where}.world_size {plan['world_size']} is not in 1..{MAX_PLAN_RANKS}")
    if plan["world_size"] != len(ranks):
        raise ConfigError(f"{where}: world_size {plan['world_size']} != number of ranks {len(ranks)}")
    profiles = {key: checked_profile(value, f"{where}.profiles[{key!r}]") for key, value in plan["profiles"].items()}
    for i, rank in enumerate(ranks):
        _check_rank_fields(rank, i, profiles, where)
    _check_totals(plan, where)
    for i, rank in enumerate(ranks):
        _check_loss_weight(rank, i, plan, where)
    _check_nodes(plan, where)
    check_comm_section(plan, where)
    for i, entry in enumerate(plan["excluded"]):
        check_fields(entry, EXCLUDED_FIELDS, f"{where}.excluded[{i}]")
    for i, text in enumerate(plan["warnings"]):
        if not isinstance(text, str):
            raise ConfigError(f"{where}.warnings[{i}] must be a string, got {text!r}")
        check_text(text, f"{where}.warnings[{i}]")


def check_fields(obj: Any, fields: Mapping[str, Kind], where: str) -> None:
    """``obj`` is an object holding each of ``fields`` with its type (a bool is not an int)."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ConfigError(f"{where} lacks the field '{name}' (regenerate the plan with batchplan plan)")
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ConfigError(f"{where}.{name} must be {expected}, got {value!r}")


def _check_totals(plan: dict, where: str) -> None:
    ranks = plan["ranks"]
    if not 1 <= plan["accumulate"] <= MAX_COUNT:
        raise ConfigError(f"{where}.accumulate must be >= 1 (micro-steps per optimizer step), got {plan['accumulate']}")
    for name in ("predicted_step_time_s", "throughput_samples_per_s", "balance_efficiency"):
        if plan[name] < 0:
            raise ConfigError(f"{where}.{name} must be >= 0, got {plan[name]}")
    step = sum(r["batch"] for r in ranks if isinstance(r, dict) and isinstance(r.get("batch"), int))
    if step != plan["step_batch"]:
        raise ConfigError(f"{where}: step_batch {plan['step_batch']} != sum of rank batches {step}")
    if plan["global_batch"] != plan["step_batch"] * plan["accumulate"]:
        raise ConfigError(
            f"{where}: global_batch != step_batch × accumulate ({plan['global_batch']} != {plan['step_batch']} × "
            f"{plan['accumulate']})"
        )
    if "balance_efficiency_range" in plan:  # optional: plans written before the calibrated time model lack it
        span = plan["balance_efficiency_range"]
        if not (
            isinstance(span, list) and len(span) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in span)
            and 0 <= span[0] <= span[1] <= 1
        ):
            raise ConfigError(
                f"{where}.balance_efficiency_range must be [low, high] with 0 <= low <= high <= 1, got {span!r}"
            )


def _check_rank_fields(rank: Any, i: int, profiles: Mapping[str, Any], where: str) -> None:
    at = f"{where}: ranks[{i}]"
    check_fields(rank, RANK_FIELDS, at)
    if rank["rank"] != i:
        raise ConfigError(f"{at}.rank is {rank['rank']}, expected {i} (ranks must be in order)")
    check_node_name(rank["node"], f"{at}.node")
    check_text(rank["gpu"], f"{at}.gpu")
    if rank["profile"] not in profiles:
        raise ConfigError(f"{at}.profile {rank['profile']!r} is not a key of profiles")
    if not 1 <= rank["batch"] <= MAX_COUNT:
        raise ConfigError(f"{at}.batch must be >= 1, got {rank['batch']}")
    for name in ("node_rank", "local_rank", "device_index", "max_batch", "predicted_memory_bytes",
                 "memory_budget_bytes", "total_memory_bytes"):
        if not 0 <= rank[name] <= MAX_COUNT:
            raise ConfigError(f"{at}.{name} must be in 0..{MAX_COUNT}, got {rank[name]}")
    if not rank["predicted_step_time_s"] > 0:
        raise ConfigError(f"{at}.predicted_step_time_s must be > 0, got {rank['predicted_step_time_s']}")
    idle = rank.get("idle_fraction", 0.0)
    if isinstance(idle, bool) or not isinstance(idle, _NUMBER) or not 0 <= idle <= 1:
        raise ConfigError(f"{at}.idle_fraction must be a share in [0, 1], got {idle!r}")


def _check_loss_weight(rank: dict, i: int, plan: dict, where: str) -> None:
    at = f"{where}: ranks[{i}]"
    # w_i = b_i · W / B (planner.runtime.weights.loss_weight; the plan layer may not import the runtime)
    wanted = rank["batch"] * plan["world_size"] / plan["step_batch"]
    if not math.isclose(float(rank["loss_weight"]), wanted, rel_tol=WEIGHT_REL_TOLERANCE):
        raise ConfigError(
            f"{at}.loss_weight is {rank['loss_weight']!r} but its batch {rank['batch']} needs batch × world_size / "
            f"step_batch = {rank['batch']} × {plan['world_size']} / {plan['step_batch']} = {wanted!r} (were batches "
            "edited by hand? regenerate the plan with batchplan plan, or fix the weights)"
        )


def _check_nodes(plan: dict, where: str) -> None:
    """Nodes 0..N-1, each with its ranks contiguous and local ranks 0..n-1, and launch lines that are exactly
    the ones the checked fields give."""
    ranks, nodes = plan["ranks"], plan["nodes"]
    if not nodes:
        raise ConfigError(f"{where}.nodes is empty (a plan with ranks runs on at least one node)")
    launch = plan.get("launch")
    check_fields(launch, LAUNCH_FIELDS, f"{where}.launch")
    names: list[str] = []
    for j, node in enumerate(nodes):
        at = f"{where}: nodes[{j}]"
        check_fields(node, NODE_FIELDS, at)
        names.append(check_node_name(node["name"], f"{at}.name"))
        if node["node_rank"] != j:
            raise ConfigError(f"{at}.node_rank is {node['node_rank']}, expected {j} (nodes in node-rank order)")
        check_host(node.get("address", node["name"]), f"{at}.address")
    if sum(n["nproc_per_node"] for n in nodes) != plan["world_size"]:
        raise ConfigError(f"{where}: nodes' nproc_per_node do not add up to world_size {plan['world_size']}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.nodes names a node twice ({', '.join(names)})")
    position = {name: j for j, name in enumerate(names)}
    expected_node_rank = 0
    local_rank = 0
    for i, rank in enumerate(ranks):
        at = f"{where}: ranks[{i}]"
        if rank["node"] not in position:
            raise ConfigError(f"{at}.node {rank['node']!r} is not one of the plan's nodes ({', '.join(names)})")
        node_rank = position[rank["node"]]
        if rank["node_rank"] != node_rank:
            raise ConfigError(f"{at}.node_rank is {rank['node_rank']}, but node {rank['node']!r} is nodes[{node_rank}]")
        if node_rank != expected_node_rank:
            if node_rank != expected_node_rank + 1 or local_rank == 0:
                raise ConfigError(
                    f"{at} is on node rank {node_rank} after node rank {expected_node_rank}: torchrun numbers ranks "
                    "node by node, so each node's ranks must follow each other in node order"
                )
            expected_node_rank, local_rank = node_rank, 0
        if rank["local_rank"] != local_rank:
            raise ConfigError(
                f"{at}.local_rank is {rank['local_rank']}, expected {local_rank} (each node's local ranks are "
                "0, 1, ... in rank order, as torchrun numbers them)"
            )
        local_rank += 1
    if expected_node_rank != len(nodes) - 1:
        raise ConfigError(f"{where}: nodes[{expected_node_rank + 1}] has no rank (every node in the plan runs one)")
    master = check_host(launch["master_addr"], f"{where}.launch.master_addr")
    first = nodes[0].get("address", nodes[0]["name"])
    if master != first:
        raise ConfigError(f"{where}.launch.master_addr {master!r} is not the address of node rank 0 ({first!r})")
    for j, node in enumerate(nodes):
        _check_node_launch(plan, j, node, [r for r in ranks if r["node"] == node["name"]], where)


def node_launch(plan: Mapping[str, Any], node_rank: int) -> NodeLaunch:
    """The launch of ``nodes[node_rank]`` rebuilt from the plan's fields (checked by ``NodeLaunch``)."""
    launch = plan["launch"]
    node = plan["nodes"][node_rank]
    return NodeLaunch(
        nnodes=len(plan["nodes"]),
        node_rank=node_rank,
        nproc_per_node=node["nproc_per_node"],
        master_addr=launch["master_addr"],
        master_port=launch["master_port"],
        cuda_visible_devices=node["cuda_visible_devices"],
        script=launch["script"],
        plan_path=launch.get("plan_path", DEFAULT_PLAN_PATH),
    )


def _check_node_launch(plan: dict, j: int, node: dict, node_ranks: list[dict], where: str) -> None:
    at = f"{where}: nodes[{j}]"
    if node["nproc_per_node"] != len(node_ranks):
        raise ConfigError(
            f"{at}.nproc_per_node is {node['nproc_per_node']} but the plan has {len(node_ranks)} ranks on "
            f"{node['name']!r}"
        )
    devices = check_visible_devices(node["cuda_visible_devices"], f"{at}.cuda_visible_devices")
    if len(devices) != len(node_ranks):
        raise ConfigError(
            f"{at}.cuda_visible_devices {node['cuda_visible_devices']!r} names {len(devices)} devices for "
            f"{len(node_ranks)} ranks"
        )
    for device, rank in zip(devices, node_ranks, strict=True):
        if device.isdigit() and int(device) != rank["device_index"]:
            raise ConfigError(
                f"{at}.cuda_visible_devices lists device {device} where rank {rank['rank']} runs on device "
                f"{rank['device_index']}"
            )
    launch = node_launch(plan, j)
    if node["torchrun"] != launch.torchrun_line():
        raise ConfigError(
            f"{at}.torchrun is not the line its fields give ({launch.torchrun_line()!r}); edit the fields, not "
            "the line, or regenerate the plan with batchplan plan"
        )
    if "env" in node and node["env"] != launch.env():
        raise ConfigError(f"{at}.env is not the environment its fields give ({launch.env()!r})")
