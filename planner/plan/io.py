"""plan.json (``batchplan/plan@1``) at the edges: writing it atomically and reading it back, both through the
one validator (``planner.plan.validate``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.files import write_file_safely
from planner.jsonio import read_json_file
from planner.plan.types import Plan
from planner.plan.validate import MAX_PLAN_BYTES, SCHEMA, validate_plan

__all__ = ["SCHEMA", "load_plan", "read_plan", "validate_plan", "write_plan"]


def write_plan(plan: Plan | Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``plan`` (a ``Plan`` or its JSON document) as JSON to ``path``: atomically (temporary file in
    the same directory, then rename), never half-written nor replacing a FIFO or device (``planner.files``)."""
    if isinstance(plan, Plan):
        plan = plan.to_json()
    validate_plan(plan, where="plan to write")
    target = Path(path)
    fix = "choose another -o path"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} ({fix})") from exc
    # atomic for a file, through a link to its target, written through to a FIFO or a device (planner.files)
    write_file_safely(target, json.dumps(plan, indent=2) + "\n", what="the plan", fix=fix)
    return target


def load_plan(path: str | os.PathLike) -> Plan:
    """Read, validate and type a plan.json (``read_plan``, then ``Plan.from_json``)."""
    return Plan.from_json(read_plan(path), where=str(path))


def read_plan(path: str | os.PathLike) -> dict:
    """Read and validate a plan.json, its JSON document (what the runtime and training scripts read): size
    and nesting limits first (``planner.jsonio``), then every rule of ``planner.plan.validate``.

    Raises:
        ConfigError: missing file, too large or deep, not strict JSON, or breaking a rule of the plan.
    """
    source = Path(path)
    if not source.is_file():
        raise ConfigError(f"plan file {source} does not exist (create one with: batchplan plan ... -o {source})")
    plan = read_json_file(source, what="plan file", max_bytes=MAX_PLAN_BYTES,
                          fix=f"regenerate it with batchplan plan -o {source}")
    validate_plan(plan, where=str(source))
    return plan
