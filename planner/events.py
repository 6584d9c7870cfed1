"""Progress events of planning, which the CLI draws on stderr (``planner.cli.progress``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Event:
    """Progress the CLI can draw: ``stage`` ray/probe/profile/allocate, ``status`` start/done/cached/failed."""

    stage: str
    status: str
    item: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


EventSink = Callable[[Event], None]


def ignore_event(_: Event) -> None:
    """The sink for callers that draw no progress."""
