"""The vocabulary of the training step, written once: the mixed-precision modes and the optimizers whose state
is counted. Torch-free, so that the planner core and the CLI can read it (choices come from ``get_args``)."""

from __future__ import annotations

from typing import Literal, get_args

AmpMode = Literal["fp16", "bf16", "off"]
OptimizerName = Literal["sgd", "adamw"]

AMP_MODES: tuple[str, ...] = get_args(AmpMode)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
