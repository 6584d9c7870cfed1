"""The one budget rule of batchplan: a batch may use ``fraction`` of the memory available to this process
(driver-free memory + what it already reserves), the seed's meaning of ``fraction`` (Ultralytics
``batch=-1`` -> 0.60).

AutoBatch and the batch choice compare curves with it as a real number (``memory_target_bytes``); the plan,
``batchplan profile`` and ``autobatch_ddp`` report it in whole bytes (``memory_budget_bytes``). Pure Python."""

from __future__ import annotations

#: fraction of available memory the batch may use (seed: ``batch=-1`` -> 0.60)
DEFAULT_FRACTION = 0.60


def memory_target_bytes(fraction: float, available_bytes: float) -> float:
    """The memory a batch may use: ``fraction`` of the available memory (the seed's target)."""
    return fraction * available_bytes


def memory_budget_bytes(fraction: float, available_bytes: float) -> int:
    """``memory_target_bytes`` in whole bytes (rounded down)."""
    return int(memory_target_bytes(fraction, available_bytes))
