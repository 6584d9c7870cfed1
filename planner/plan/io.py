"""plan.json (``batchplan/plan@1``) at the edges: writing it atomically, reading it back, validating it."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.plan.types import Plan
from planner.profiles.profile import DeviceProfile

SCHEMA = "batchplan/plan@1"


def write_plan(plan: Plan | Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``plan`` (a ``Plan`` or its JSON document) as JSON to ``path`` atomically (temporary file in
    the same directory, then rename)."""
    if isinstance(plan, Plan):
        plan = plan.to_json()
    validate_plan(plan, where="plan to write")
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} (choose another -o path)") from exc
    try:
        # mkstemp makes the file 0600; a plan is shared with the scheduler and the nodes: the usual 0666 & ~umask
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as handle:
            json.dump(plan, handle, indent=2)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} (choose another -o path)") from exc
        raise
    return target


def load_plan(path: str | os.PathLike) -> Plan:
    """Read, validate and type a plan.json (``read_plan``, then ``Plan.from_json``)."""
    return Plan.from_json(read_plan(path), where=str(path))


def read_plan(path: str | os.PathLike) -> dict:
    """Read and validate a plan.json: its JSON document (what the runtime and training scripts read).

    Raises:
        ConfigError: missing file, not JSON, wrong schema, missing or mistyped fields.
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"plan file {source} does not exist (create one with: batchplan plan ... -o {source})")
    try:
        plan = json.loads(source.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc} (regenerate it with batchplan plan -o {source})") from exc
    validate_plan(plan, where=str(source))
    return plan


_TOP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "schema": str,
    "created": str,
    "job": dict,
    "world_size": int,
    "global_batch": int,
    "accumulate": int,
    "step_batch": int,
    "predicted_step_time_s": (int, float),
    "throughput_samples_per_s": (int, float),
    "balance_efficiency": (int, float),
    "mode": str,
    "ranks": list,
    "nodes": list,
    "excluded": list,
    "profiles": dict,
    "warnings": list,
}
_RANK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "node": str,
    "node_rank": int,
    "local_rank": int,
    "device_index": int,
    "gpu": str,
    "profile": str,
    "batch": int,
    "max_batch": int,
    "loss_weight": (int, float),
    "predicted_memory_bytes": int,
    "memory_budget_bytes": int,
    "total_memory_bytes": int,
    "predicted_step_time_s": (int, float),
}
_NODE_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "node_rank": int,
    "cuda_visible_devices": str,
    "nproc_per_node": int,
    "torchrun": str,
}


def _check_fields(obj: Any, fields: Mapping[str, type | tuple[type, ...]], where: str) -> None:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ConfigError(f"{where} lacks the field '{name}' (regenerate the plan with batchplan plan)")
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ConfigError(f"{where}.{name} must be {expected}, got {value!r}")


def validate_plan(plan: Any, where: str = "plan") -> None:
    """Check the schema and the fields a scheduler and the runtime read, and their consistency."""
    if not isinstance(plan, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(plan).__name__}")
    if plan.get("schema") != SCHEMA:
        raise ConfigError(
            f"{where} has schema {plan.get('schema')!r}, expected {SCHEMA!r} (is it a batchplan plan?)"
        )
    _check_fields(plan, _TOP_FIELDS, where)
    for i, rank in enumerate(plan["ranks"]):
        _check_fields(rank, _RANK_FIELDS, f"{where}: ranks[{i}]")
        if rank["rank"] != i:
            raise ConfigError(f"{where}: ranks[{i}].rank is {rank['rank']}, expected {i} (ranks must be in order)")
        if rank["profile"] not in plan["profiles"]:
            raise ConfigError(f"{where}: ranks[{i}].profile {rank['profile']!r} is not a key of profiles")
        if rank["batch"] < 1:
            raise ConfigError(f"{where}: ranks[{i}].batch must be >= 1, got {rank['batch']}")
    for i, node in enumerate(plan["nodes"]):
        _check_fields(node, _NODE_FIELDS, f"{where}: nodes[{i}]")
    if plan["world_size"] != len(plan["ranks"]):
        raise ConfigError(f"{where}: world_size {plan['world_size']} != number of ranks {len(plan['ranks'])}")
    step = sum(r["batch"] for r in plan["ranks"])
    if step != plan["step_batch"]:
        raise ConfigError(f"{where}: step_batch {plan['step_batch']} != sum of rank batches {step}")
    if plan["global_batch"] != plan["step_batch"] * plan["accumulate"]:
        raise ConfigError(f"{where}: global_batch != step_batch × accumulate")
    if sum(n["nproc_per_node"] for n in plan["nodes"]) != plan["world_size"]:
        raise ConfigError(f"{where}: nodes' nproc_per_node do not add up to world_size")
    for key, profile in plan["profiles"].items():
        DeviceProfile.from_json(profile, where=f"{where}: profiles[{key!r}]")
