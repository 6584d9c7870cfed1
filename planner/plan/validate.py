"""The one validator of a plan (``batchplan/plan@1``): what ``show``, ``--emit``, the runtime's
``load_rank_plan`` and the writer all call, so none of them accepts a plan another would refuse. It checks
the document and returns the typed ``Plan``, so no renderer ever sees a field of the wrong type.

A plan is checked in three layers:

1. the document: size and nesting within limits, every number finite, no control character or lone surrogate
   in any string (``planner.jsonio``);
2. every field, optional ones included (``alternatives``, ``notes``, ``balance_efficiency_range``, each rank's
   ``idle_fraction`` and ``speed_factor``, each node's ``address`` and ``env``, ``launch.plan_path``, every
   field of ``job`` and of each profile): present where required, of its type, within its range, names and
   device lists matching strict patterns (``planner.plan.launch``); a ``job`` field is named as the plan names
   it (``job.multiple_of -3``), never as a CLI flag;
3. the identities between fields, on the typed plan (``planner.plan.derived.check_identities``: numbering,
   step and global batch, loss weights, each rank's time against its profile and speed factor, low <= balance
   efficiency <= high), every profile physically possible (``planner.profiles.checks``), and every launch
   line and environment stored in the plan equal to the one rebuilt from the checked fields, so what ``show``
   prints and a scheduler sources can only be what the plan's numbers say.

Every failure is a ``ConfigError`` naming the field and the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.errors import ConfigError, FieldError
from planner.job import MODES, JobSpec
from planner.jsonio import check_text, check_tree
from planner.plan.comm import check_comm_section
from planner.plan.derived import WEIGHT_REL_TOLERANCE
from planner.plan.launch import (
    DEFAULT_PLAN_PATH,
    NodeLaunch,
    check_host,
    check_node_name,
    check_visible_devices,
)
from planner.plan.types import Plan
from planner.profiles.checks import checked_profile

__all__ = ["MAX_PLAN_BYTES", "MAX_PLAN_RANKS", "SCHEMA", "WEIGHT_REL_TOLERANCE", "check_fields", "node_launch",
           "validate_plan"]

SCHEMA = "batchplan/plan@1"
#: most ranks a plan may hold: 65,536 GPUs is beyond any job this planner is meant for, and bounds the
#: work a hostile plan can cause
MAX_PLAN_RANKS = 65_536
#: largest plan.json (or its index) read: a 65,536-rank plan is 33 MB (``bench/bench_plan_sizes.py``)
MAX_PLAN_BYTES = 128 * 2**20
#: largest per-rank batch, accumulation or byte count a plan may hold (2^53: exact in a JSON double)
MAX_COUNT = 2**53
#: most options ``alternatives`` may compare, and most lines in ``warnings`` or ``notes``: far above what the
#: planner writes (5 options; a few dozen lines), a bound for hostile files
MAX_ALTERNATIVES = 64
MAX_LINES = 65_536

Kind = type | tuple[type, ...]
_NUMBER = (int, float)
_OPTIONAL_STR = (str, type(None))
_OPTIONAL_INT = (int, type(None))
TOP_FIELDS: dict[str, Kind] = {
    "schema": str, "created": str, "job": dict, "world_size": int, "global_batch": int, "accumulate": int,
    "step_batch": int, "predicted_step_time_s": _NUMBER, "throughput_samples_per_s": _NUMBER,
    "balance_efficiency": _NUMBER, "mode": str, "ranks": list, "nodes": list, "launch": dict, "excluded": list,
    "profiles": dict, "warnings": list,
}
TOP_OPTIONAL: dict[str, Kind] = {"alternatives": (dict, type(None)), "balance_efficiency_range": (list, type(None)),
                                 "notes": list}
RANK_FIELDS: dict[str, Kind] = {
    "rank": int, "node": str, "node_rank": int, "local_rank": int, "device_index": int, "gpu": str,
    "profile": str, "batch": int, "max_batch": int, "loss_weight": _NUMBER, "predicted_memory_bytes": int,
    "memory_budget_bytes": int, "total_memory_bytes": int, "predicted_step_time_s": _NUMBER,
}
RANK_OPTIONAL: dict[str, Kind] = {"idle_fraction": (int, float, type(None)), "speed_factor": _NUMBER}
_RANK_COUNTS = ("node_rank", "local_rank", "device_index", "max_batch", "predicted_memory_bytes",
                "memory_budget_bytes", "total_memory_bytes")
NODE_FIELDS: dict[str, Kind] = {
    "name": str, "node_rank": int, "cuda_visible_devices": str, "nproc_per_node": int, "torchrun": str,
}
NODE_OPTIONAL: dict[str, Kind] = {"address": str, "env": (dict, type(None))}
LAUNCH_FIELDS: dict[str, Kind] = {"master_addr": str, "master_port": int, "script": str}
LAUNCH_OPTIONAL: dict[str, Kind] = {"plan_path": str}
EXCLUDED_FIELDS: dict[str, Kind] = {"node": str, "reason": str}
EXCLUDED_OPTIONAL: dict[str, Kind] = {"device_index": _OPTIONAL_INT, "gpu": _OPTIONAL_STR}
PROFILE_FIELDS: dict[str, Kind] = {"gpu": str, "method": str, "memory_fit": dict, "time_fit": dict}
PROFILE_OPTIONAL: dict[str, Kind] = {
    "amp": str, "oom_batch": _OPTIONAL_INT, "notes": list, "min_memory_bytes": int,
    "breakdown_bytes": (dict, type(None)), "time_log_sigma": _NUMBER, "time_model": str,
}
#: a job field's JSON type where ``JobSpec`` would otherwise meet it unchecked (its own checks do the rest)
JOB_LISTS = ("input_shape",)


def validate_plan(plan: Any, where: str = "plan") -> Plan:
    """Check ``plan`` (a parsed plan.json) against every rule of the module docstring; return it typed.

    Raises:
        ConfigError: the first rule broken, naming ``where``, the field and the rule.
    """
    if not isinstance(plan, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(plan).__name__}")
    if plan.get("schema") != SCHEMA:
        raise ConfigError(f"{where} has schema {plan.get('schema')!r}, expected {SCHEMA!r} (is it a batchplan plan?)")
    check_tree(plan, where)
    check_header(plan, where)
    profiles = plan["profiles"]
    for i, rank in enumerate(plan["ranks"]):
        check_rank_fields(rank, i, profiles, where)
    for j, node in enumerate(plan["nodes"]):
        check_node_fields(node, j, where)
    typed = Plan.from_json(plan, where=where)  # the identities (planner.plan.derived) on the typed plan
    check_launch_lines(typed, where)
    return typed


def check_header(plan: Mapping[str, Any], where: str) -> None:
    """Every field of the plan apart from its ranks and nodes: types, limits, the job and the profiles."""
    check_fields(plan, TOP_FIELDS, where, TOP_OPTIONAL)
    if plan["mode"] not in MODES:
        raise ConfigError(f"{where}.mode {plan['mode']!r} is not one of {', '.join(MODES)}")
    if not 0 < plan["world_size"] <= MAX_PLAN_RANKS:
        raise ConfigError(f"{where}.world_size {plan['world_size']} is not in 1..{MAX_PLAN_RANKS}")
    if not 1 <= plan["accumulate"] <= MAX_COUNT:
        raise ConfigError(f"{where}.accumulate must be >= 1 (micro-steps per optimizer step), got {plan['accumulate']}")
    for name in ("step_batch", "global_batch"):
        if not 0 <= plan[name] <= MAX_COUNT:
            raise ConfigError(f"{where}.{name} must be in 0..{MAX_COUNT}, got {plan[name]}")
    for name in ("predicted_step_time_s", "throughput_samples_per_s", "balance_efficiency"):
        if plan[name] < 0:
            raise ConfigError(f"{where}.{name} must be >= 0, got {plan[name]}")
    _check_range(plan.get("balance_efficiency_range"), where)
    _check_alternatives(plan.get("alternatives"), where)
    for name in ("warnings", "notes"):
        check_lines(plan.get(name, []), f"{where}.{name}")
    checked_job(plan["job"], where)
    for key, value in plan["profiles"].items():
        at = f"{where}.profiles[{key!r}]"
        check_fields(value, PROFILE_FIELDS, at, PROFILE_OPTIONAL)
        check_lines(value.get("notes", []), f"{at}.notes")
        checked_profile(value, at)
    check_fields(plan["launch"], LAUNCH_FIELDS, f"{where}.launch", LAUNCH_OPTIONAL)
    check_host(plan["launch"]["master_addr"], f"{where}.launch.master_addr")
    for i, entry in enumerate(plan["excluded"]):
        check_fields(entry, EXCLUDED_FIELDS, f"{where}.excluded[{i}]", EXCLUDED_OPTIONAL)
    check_comm_section(plan, where)


def check_fields(obj: Any, fields: Mapping[str, Kind], where: str, optional: Mapping[str, Kind] | None = None) -> None:
    """``obj`` is an object holding each of ``fields`` with its type, and each of ``optional`` it holds with its
    type (a bool is not an int)."""
    if type(obj) is dict and _plainly_typed(obj, fields, optional):
        return  # the common case, decided without building a message (a 65,536-rank plan has 73,000 objects)
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be an object, got {type(obj).__name__}")
    for name, kind in fields.items():
        if name not in obj:
            raise ConfigError(f"{where} lacks the field '{name}' (regenerate the plan with batchplan plan)")
        _check_kind(obj[name], kind, f"{where}.{name}")
    for name, kind in (optional or {}).items():
        if name in obj:
            _check_kind(obj[name], kind, f"{where}.{name}")


_MISSING = object()
_EXACT: dict[int, tuple[tuple[str, frozenset[type]], ...]] = {}


def _exact_types(fields: Mapping[str, Kind]) -> tuple[tuple[str, frozenset[type]], ...]:
    """``fields`` as (name, the exact types allowed) pairs, made once per table (``bool`` is never among them)."""
    key = id(fields)
    if key not in _EXACT:
        _EXACT[key] = tuple((name, frozenset((kind,) if isinstance(kind, type) else kind)) for name, kind in fields.items())
    return _EXACT[key]


def _plainly_typed(obj: dict, fields: Mapping[str, Kind], optional: Mapping[str, Kind] | None) -> bool:
    """Every field of ``obj`` is of exactly an allowed type (no subclass); False sends it to the full check."""
    for name, kinds in _exact_types(fields):
        if type(obj.get(name, _MISSING)) not in kinds:
            return False
    for name, kinds in _exact_types(optional or {}):
        value = obj.get(name, _MISSING)
        if value is not _MISSING and type(value) not in kinds:
            return False
    return True


def _check_kind(value: Any, kind: Kind, at: str) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        kinds = (kind,) if isinstance(kind, type) else kind
        expected = "/".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise ConfigError(f"{at} must be {expected}, got {_shown(value)}")


def _shown(value: Any) -> str:
    """A value for an error message: its repr, cut short (a hostile field can be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def check_lines(lines: Any, where: str) -> None:
    """``lines`` is a list of strings (warnings, notes) of a bounded length."""
    if not isinstance(lines, list):
        raise ConfigError(f"{where} must be a list of strings, got {_shown(lines)}")
    if len(lines) > MAX_LINES:
        raise ConfigError(f"{where} holds {len(lines)} lines, over the limit of {MAX_LINES}")
    for i, text in enumerate(lines):
        if not isinstance(text, str):
            raise ConfigError(f"{where}[{i}] must be a string, got {_shown(text)}")
        check_text(text, f"{where}[{i}]")


def checked_job(job: Any, where: str) -> JobSpec:
    """The ``job`` of the plan at ``where`` as a ``JobSpec``; an invalid field is named as the plan names it
    (``plan.json: job.multiple_of -3 is invalid``), not as the CLI flag that would set it."""
    if not isinstance(job, dict):
        raise ConfigError(f"{where}.job must be an object, got {_shown(job)}")
    for name in JOB_LISTS:
        value = job.get(name)
        if value is not None and not isinstance(value, list):
            raise ConfigError(f"{where}: job.{name} must be a list of positive integers or null, got {_shown(value)}")
    try:
        return JobSpec.from_json(job)
    except FieldError as exc:  # the core names fields in backticks; here they are the plan's fields
        raise ConfigError(f"{where}: {exc.render(lambda name: f'job.{name}')}") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_range(span: Any, where: str) -> None:
    if span is None:  # optional: plans written before the calibrated time model lack it
        return
    if not (
        isinstance(span, list) and len(span) == 2
        and all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in span)
        and 0 <= span[0] <= span[1] <= 1
    ):
        raise ConfigError(
            f"{where}.balance_efficiency_range must be [low, high] with 0 <= low <= high <= 1, got {_shown(span)}"
        )


def _check_alternatives(alternatives: Any, where: str) -> None:
    if alternatives is None:
        return
    if len(alternatives) > MAX_ALTERNATIVES:
        raise ConfigError(f"{where}.alternatives holds {len(alternatives)} options, over the limit of {MAX_ALTERNATIVES}")
    for name, value in alternatives.items():
        if isinstance(value, bool) or not isinstance(value, _NUMBER) or value < 0:
            raise ConfigError(
                f"{where}.alternatives[{name!r}] must be a throughput in samples/s (a number >= 0), got {_shown(value)}"
            )


def check_rank_fields(rank: Any, i: int, profiles: Mapping[str, Any], where: str) -> None:
    """Types and limits of ``ranks[i]`` (its identities with the rest are ``planner.plan.derived``'s)."""
    at = f"{where}: ranks[{i}]"
    check_fields(rank, RANK_FIELDS, at, RANK_OPTIONAL)
    check_node_name(rank["node"], f"{at}.node")
    check_text(rank["gpu"], f"{at}.gpu")
    if rank["profile"] not in profiles:
        raise ConfigError(f"{at}.profile {_shown(rank['profile'])} is not a key of profiles")
    if not 1 <= rank["batch"] <= MAX_COUNT:
        raise ConfigError(f"{at}.batch must be >= 1, got {rank['batch']}")
    for name in _RANK_COUNTS:
        if not 0 <= rank[name] <= MAX_COUNT:
            raise ConfigError(f"{at}.{name} must be in 0..{MAX_COUNT}, got {rank[name]}")
    if not rank["predicted_step_time_s"] > 0:
        raise ConfigError(f"{at}.predicted_step_time_s must be > 0, got {rank['predicted_step_time_s']}")
    idle = rank.get("idle_fraction")
    if idle is not None and not 0 <= idle <= 1:
        raise ConfigError(f"{at}.idle_fraction must be a share in [0, 1], got {idle!r}")
    speed = rank.get("speed_factor", 1.0)
    if not 0 < speed <= 1:
        raise ConfigError(f"{at}.speed_factor must be a share of the profiled speed in (0, 1], got {speed!r}")


def check_node_fields(node: Any, j: int, where: str) -> None:
    """Types and shapes of ``nodes[j]`` (its launch line is checked against the typed plan afterwards)."""
    at = f"{where}: nodes[{j}]"
    check_fields(node, NODE_FIELDS, at, NODE_OPTIONAL)
    check_node_name(node["name"], f"{at}.name")
    check_host(node.get("address", node["name"]), f"{at}.address")
    if not 1 <= node["nproc_per_node"] <= MAX_PLAN_RANKS:
        raise ConfigError(f"{at}.nproc_per_node must be in 1..{MAX_PLAN_RANKS}, got {node['nproc_per_node']}")
    env = node.get("env")
    if env is not None and not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{at}.env must map names to strings, got {_shown(env)}")


def check_launch_lines(plan: Plan, where: str) -> None:
    """Each node's device list, torchrun line and environment are exactly what its checked fields give."""
    if plan.launch is None:
        raise ConfigError(f"{where} lacks the field 'launch' (regenerate the plan with batchplan plan)")
    first = plan.nodes[0].address or plan.nodes[0].name
    if plan.launch.master_addr != first:
        raise ConfigError(
            f"{where}.launch.master_addr {plan.launch.master_addr!r} is not the address of node rank 0 ({first!r})"
        )
    start = 0
    for j, node in enumerate(plan.nodes):
        check_node_launch(plan, j, plan.ranks[start:start + node.nproc_per_node], where)
        start += node.nproc_per_node


def node_launch(plan: Plan, node_rank: int) -> NodeLaunch:
    """The launch of ``nodes[node_rank]`` rebuilt from the plan's fields (checked by ``NodeLaunch``)."""
    launch = plan.launch
    node = plan.nodes[node_rank]
    assert launch is not None  # a validated plan has one
    return NodeLaunch(
        nnodes=len(plan.nodes),
        node_rank=node_rank,
        nproc_per_node=node.nproc_per_node,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        cuda_visible_devices=node.cuda_visible_devices,
        script=launch.script,
        plan_path=launch.plan_path or DEFAULT_PLAN_PATH,
    )


def check_node_launch(plan: Plan, j: int, node_ranks: Sequence[Any], where: str) -> None:
    """``nodes[j]``'s device list names its ranks' devices, and its stored line and environment are rebuilt
    exactly from its fields. ``node_ranks``: its ranks in local-rank order."""
    at = f"{where}: nodes[{j}]"
    node = plan.nodes[j]
    devices = check_visible_devices(node.cuda_visible_devices, f"{at}.cuda_visible_devices")
    if len(devices) != len(node_ranks):
        raise ConfigError(
            f"{at}.cuda_visible_devices {node.cuda_visible_devices!r} names {len(devices)} devices for "
            f"{len(node_ranks)} ranks"
        )
    for device, rank in zip(devices, node_ranks, strict=True):
        if device.isdigit() and int(device) != rank.device_index:
            raise ConfigError(
                f"{at}.cuda_visible_devices lists device {device} where rank {rank.rank} runs on device "
                f"{rank.device_index}"
            )
    launch = node_launch(plan, j)
    line = launch.torchrun_line()
    if node.torchrun != line:
        raise ConfigError(
            f"{at}.torchrun is not the line its fields give ({line!r}); edit the fields, not the line, or "
            "regenerate the plan with batchplan plan"
        )
    if node.env is not None and node.env != launch.env():
        raise ConfigError(f"{at}.env is not the environment its fields give ({launch.env()!r})")
