"""Errors a user can cause, shared by torchkit and planner (planner re-exports them).

Each message says what was wrong, where, and how to fix it. The CLI prints ``error: <message>`` on one line
and exits with ``exit_code``. Pure Python: importing this module imports no torch.
"""

from __future__ import annotations


class UserError(Exception):
    """Base of every error caused by input (files, options, models). ``exit_code`` is what the CLI returns."""

    exit_code: int = 2


class ConfigError(UserError, ValueError):
    """A cluster config, the GPU catalog, a job option or a plan file is malformed.

    The message names the file and the path inside it (``nodes[1].gpus[0].type``) and the fix.
    """


class WorkloadError(UserError, ValueError):
    """A model/workload cannot be built or run: unknown name, failing factory, input shape that does not fit."""
