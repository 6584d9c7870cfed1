"""Errors of the planner layer. Input errors are torchkit's (re-exported here); the CLI maps every
``UserError`` to one line on stderr and its ``exit_code`` (DESIGN.md: 1 infeasible/preflight failed,
2 bad input or unreachable cluster)."""

from __future__ import annotations

import re
from collections.abc import Callable

from torchkit.errors import ConfigError, UserError, WorkloadError

__all__ = [
    "ClusterUnreachableError",
    "ConfigError",
    "FieldError",
    "InfeasiblePlanError",
    "RebalanceError",
    "UserError",
    "WorkloadError",
    "field_name",
    "render_fields",
]


def field_name(field: str) -> str:
    """How the core names a setting in a message by default: by its field's name (``global_batch``). A front
    end passes its own (the CLI: its flag, ``planner.cli.options.flag_of``)."""
    return field


def render_fields(template: str, name_of: Callable[[str], str] = field_name) -> str:
    """``template`` with every `field` reference (a field name in backticks) written as ``name_of(field)``."""
    return re.sub(r"`(\w+)`", lambda m: name_of(m.group(1)), template)


class FieldError(ConfigError):
    """A setting (a ``JobSpec`` field, a preflight threshold, the cache directory) has a value that cannot be
    used; ``field`` names it.

    The message names fields in backticks in ``template``; ``str()`` shows them as the field names
    (``global_batch``), and a front end shows them as what its user typed: the CLI renders them as its
    flags (``render(flag_of)``, ``planner.cli.options``). The core does not know the flags.
    """

    def __init__(self, field: str, template: str) -> None:
        self.field = field
        self.template = template
        super().__init__(self.render())

    def render(self, name_of: Callable[[str], str] = field_name) -> str:
        """The message with every `field` reference written as ``name_of(field)``."""
        return render_fields(self.template, name_of)

    def __reduce__(self):  # a probe's error crosses Ray by pickle: rebuild it from its parts
        return type(self), (self.field, self.template)


class ClusterUnreachableError(UserError, ConnectionError):
    """The Ray cluster at the given address cannot be reached; the message names the address."""


class InfeasiblePlanError(UserError):
    """The job cannot be planned on these devices (nothing fits the minimum batch, global batch unreachable)."""

    exit_code = 1


class NoGpuError(InfeasiblePlanError):
    """The cluster has no GPU at all to plan on (none found, none left out): a machine without GPUs, or a Ray
    cluster whose nodes have none."""


class RebalanceError(RuntimeError):
    """In-job re-balancing cannot go on safely: a rank died or hung in its all-gather, or the ranks did not
    reach the same decision (``planner.runtime.rebalance``). Not a user error: the job must stop."""
