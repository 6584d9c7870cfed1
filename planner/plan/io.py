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

from planner.codec import encode
from planner.errors import ConfigError
from planner.files import write_file_safely
from planner.jsonio import read_limited_bytes
from planner.plan.layout import index_path, plan_text
from planner.plan.types import Plan
from planner.plan.validate import MAX_PLAN_BYTES, SCHEMA, plan_from_bytes, validate_plan

__all__ = ["SCHEMA", "load_plan", "plan_fix", "read_plan_bytes", "validate_plan", "write_plan"]

log = logging.getLogger(__name__)


def write_plan(plan: Plan | Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``plan`` (a ``Plan``, or a plan document, which is validated first) as JSON to ``path`` atomically
    (temporary file in the same directory, then rename), and its rank index beside it (``planner.plan.layout``).
    What is written is read back first, as every reader will read it: a plan no reader would accept is not
    written."""
    text, index = plan_text(encode(validate_plan(plan, where="plan to write")))
    plan_from_bytes(text.encode(), where="plan to write")
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
    """Read a plan.json whole and return it typed, validated (``planner.plan.validate``).

    Raises:
        ConfigError: missing file, too large or deep, not strict JSON, or breaking a rule of the plan.
    """
    return plan_from_bytes(read_plan_bytes(path), where=str(path), fix=plan_fix(Path(path)))


def read_plan_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a plan file within the size limit (checked by ``stat`` before a byte is read); not yet
    validated."""
    source = Path(path)
    if not source.is_file():
        name = "plan.json" if source.suffix.lower() in (".yaml", ".yml") else str(source)  # a plan is JSON
        fix = f"create one with: batchplan plan ... -o {shlex.quote(name)}"
        raise ConfigError(f"plan file {source} does not exist ({fix})")
    return read_limited_bytes(source, what="plan file", max_bytes=MAX_PLAN_BYTES, fix=plan_fix(source))


def plan_fix(source: Path) -> str:
    """How to fix any error in the plan file ``source``: never to overwrite a cluster config with a plan."""
    return _cluster_config_fix(source) or f"regenerate it with batchplan plan -o {shlex.quote(str(source))}"


def _cluster_config_fix(source: Path) -> str | None:
    """A YAML file given where a plan belongs is most likely a cluster config: plan it instead."""
    if source.suffix.lower() not in (".yaml", ".yml"):
        return None
    return (
        f"{source} is YAML, a cluster config rather than a plan: plan it with batchplan plan --cluster "
        f"{shlex.quote(str(source))} -o plan.json, then batchplan show plan.json"
    )
