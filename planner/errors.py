"""Errors of the planner layer. Input errors are torchkit's (re-exported here); the CLI maps every
``UserError`` to one line on stderr and its ``exit_code`` (DESIGN.md: 1 infeasible/preflight failed,
2 bad input or unreachable cluster)."""

from __future__ import annotations

from torchkit.errors import ConfigError, UserError, WorkloadError

__all__ = [
    "ClusterUnreachableError", "ConfigError", "InfeasiblePlanError", "RebalanceError", "UserError", "WorkloadError",
]


class ClusterUnreachableError(UserError, ConnectionError):
    """The Ray cluster at the given address cannot be reached; the message names the address."""


class InfeasiblePlanError(UserError):
    """The job cannot be planned on these devices (nothing fits the minimum batch, global batch unreachable)."""

    exit_code = 1


class RebalanceError(RuntimeError):
    """In-job re-balancing cannot go on safely: a rank died or hung in its all-gather, or the ranks did not
    reach the same decision (``planner.runtime.rebalance``). Not a user error: the job must stop."""
