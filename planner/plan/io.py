"""plan.json (``batchplan/plan@1``) at the edges: writing it atomically and reading it back, both through the
one validator (``planner.plan.validate``). The file's layout (one line per rank, and the index beside it by
which one rank reads its part) is ``planner.plan.layout``'s; ``planner.plan.rank_view`` reads one rank's part."""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.files import write_file_safely
from planner.jsonio import read_json_file
from planner.plan.layout import index_path, plan_text
from planner.plan.types import Plan
from planner.plan.validate import MAX_PLAN_BYTES, SCHEMA, validate_plan

__all__ = ["SCHEMA", "load_plan", "read_plan", "validate_plan", "write_plan"]

log = logging.getLogger(__name__)


def write_plan(plan: Plan | Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``plan`` (a ``Plan`` or its JSON document) as JSON to ``path`` atomically (temporary file in
    the same directory, then rename), and its rank index beside it (``planner.plan.layout``)."""
    if isinstance(plan, Plan):
        plan = plan.to_json()
    validate_plan(plan, where="plan to write")
    text, index = plan_text(plan)
    target = Path(path)
    _write_atomically(text, target)
    if index is not None and target.is_file():  # a plan written through to a pipe or a device has no "beside"
        try:
            _write_atomically(index, index_path(target))
        except ConfigError as exc:  # the plan is whole; without its index each rank reads all of it (slower)
            log.warning("the plan's rank index was not written (%s): each rank will read the whole plan", exc)
    return target


def _write_atomically(text: str, target: Path) -> None:
    """``text`` into ``target``: by a temporary file in its directory and a rename (nothing half-written), through
    a link to its target, or written through to a FIFO or a device, never replacing one (``planner.files``)."""
    fix = "choose another -o path"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the plan to {target}: {exc.strerror or exc} ({fix})") from exc
    write_file_safely(target, text, what="the plan", fix=fix)


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan.json whole, validate it and return it typed (``planner.plan.validate.validate_plan``).

    Raises:
        ConfigError: as ``read_plan``.
    """
    return validate_plan(read_document(path), where=str(path))


def read_plan(path: str | os.PathLike) -> dict:
    """Read and validate a plan.json, its JSON document (what training scripts read): size and nesting limits
    first (``planner.jsonio``), then every rule of ``planner.plan.validate``.

    Raises:
        ConfigError: missing file, too large or deep, not strict JSON, or breaking a rule of the plan.
    """
    document = read_document(path)
    validate_plan(document, where=str(path))
    return document


def read_document(path: str | os.PathLike) -> dict:
    """The JSON document of a plan file within the limits (size first, by ``stat``, before a byte is read);
    not yet validated."""
    source = Path(path)
    if not source.is_file():
        name = "plan.json" if source.suffix.lower() in (".yaml", ".yml") else str(source)  # a plan is JSON
        fix = f"create one with: batchplan plan ... -o {shlex.quote(name)}"
        raise ConfigError(f"plan file {source} does not exist ({fix})")
    return read_json_file(source, what="plan file", max_bytes=MAX_PLAN_BYTES, fix=plan_fix(source))


def plan_fix(source: Path) -> str:
    """How to fix any error in the plan file ``source``: never to overwrite a cluster config with a plan."""
    return _cluster_config_fix(source) or f"regenerate it with batchplan plan -o {shlex.quote(str(source))}"


def _cluster_config_fix(source: Path) -> str | None:
    """A YAML file given where a plan belongs is most likely a cluster config: plan it instead."""
    if source.suffix.lower() not in (".yaml", ".yml"):
        return None
    return (f"{source} is YAML, a cluster config rather than a plan: plan it with batchplan plan --cluster "
            f"{shlex.quote(str(source))} -o plan.json, then batchplan show plan.json")
