"""The one validator of a plan (``batchplan/plan@1``): what ``show``, ``--emit``, the runtime's
``load_rank_plan``, the re-balancer and the writer all call, so none of them accepts a plan another would
refuse. It returns the typed ``Plan``, so no renderer ever sees a field of the wrong type.

A plan is checked in three layers, each said once:

1. the text: size and nesting within limits, every number finite, no control character or lone surrogate in
   any string (``planner.jsonio``, through ``planner.codec``);
2. every field, optional ones included: present where required, of its type, within its bounds, names and
   hosts matching strict patterns: the declarations of ``planner.plan.types`` and ``planner.plan.sections``
   (and ``planner.job.JobSpec``, whose own checks name a bad field as the plan names it: ``job.multiple_of
   -3``), read by ``planner.codec``;
3. the identities between fields, every profile physically possible, every launch line rebuilt from the
   fields it stands for (``planner.plan.derived.check_identities``, run when the ``Plan`` is constructed).

Every failure is a ``ConfigError`` naming the file, the field's path and the rule, and how to regenerate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from planner.codec import convert, decode
from planner.errors import ConfigError
from planner.plan.types import MAX_COUNT, MAX_PLAN_RANKS, SCHEMA, Plan

__all__ = ["MAX_COUNT", "MAX_PLAN_BYTES", "MAX_PLAN_RANKS", "SCHEMA", "plan_from_bytes", "validate_plan"]

#: largest plan.json (or its index) read: a 65,536-rank plan is 33 MB (``bench/bench_plan_sizes.py``)
MAX_PLAN_BYTES = 128 * 2**20
#: the fix every message about a plan ends with
REGENERATE = "regenerate the plan with batchplan plan"


def validate_plan(plan: Plan | Mapping[str, Any], where: str = "plan", fix: str = REGENERATE) -> Plan:
    """``plan`` (a typed plan, or a parsed plan.json) checked against every rule of the module docstring.

    Raises:
        ConfigError: the first rule broken, naming ``where``, the field and the rule.
    """
    if isinstance(plan, Plan):
        return plan
    _check_is_a_plan(plan, where)
    return convert(Plan, plan, where=where, fix=fix)


def plan_from_bytes(raw: bytes, where: str, fix: str = REGENERATE) -> Plan:
    """The plan of plan.json's bytes, checked against every rule of the module docstring.

    Raises:
        ConfigError: the first rule broken, naming ``where``, the field and the rule.
    """
    try:
        return decode(Plan, raw, where=where, fix=fix)
    except ConfigError as exc:
        try:  # a document that is no plan at all is said to be none, before any of its fields is
            document = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            raise exc from None  # the codec's error names what is wrong with the text
        _check_is_a_plan(document, where)
        raise


def _check_is_a_plan(document: Any, where: str) -> None:
    """A document that is no batchplan plan at all is said to be none, before any of its fields is."""
    if not isinstance(document, Mapping):
        raise ConfigError(f"{where} must be a JSON object (a batchplan plan), got {type(document).__name__}")
    if document.get("schema") != SCHEMA:
        raise ConfigError(
            f"{where} has schema {document.get('schema')!r}, expected {SCHEMA!r} (is it a batchplan plan?)"
        )
