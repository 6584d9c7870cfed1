"""``--model`` checked before any probing: a built-in name that is not one (``resnet51``) is refused at once,
with the close matches, instead of after every node was probed.

Library models (``timm:``, ...) and ``package.module:factory`` are left to the workload builder, which
imports them (only it can tell whether ``timm:convnext_tiny`` exists).
"""

from __future__ import annotations

import difflib

from planner.errors import ConfigError


def check_model_name(model: str) -> None:
    """Raise a ConfigError naming the close matches when ``model`` is no built-in workload nor a
    ``source:name`` form."""
    if ":" in model:
        return
    from torchkit.workloads.registry import WORKLOAD_NAMES, other_sources

    if model in WORKLOAD_NAMES:
        return
    close = difflib.get_close_matches(model, WORKLOAD_NAMES, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(
        f"--model {model!r} is not a built-in workload ({hint}built-in: {', '.join(WORKLOAD_NAMES)}; or "
        f"{other_sources()})"
    )
