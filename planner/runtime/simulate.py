"""A declared simulation of slower devices on CPU: rank i's compute takes longer in proportion to its batch.

On one CPU machine every gloo rank runs at the same speed, so a plan's speed ratios cannot be seen to be
wrong. ``SimulatedSpeed`` makes rank i behave like a device ``k_i`` times slower per sample by sleeping where
a slower device would still be computing: after the rank's own forward+backward, before its gradients
leave for the all-reduce (``planner.runtime.rebalance`` calls it from its DDP comm hook, or at the end of a
``no_sync`` micro-step). It is never on unless asked for (``--simulate-speed`` in the examples), and the
plan, the logs and the summary line say so.

Two forms:

* ``sample_s`` declared: the simulated device needs ``k_i × sample_s`` seconds per sample, so the sleep is
  ``k_i × sample_s × b`` and the (small) real compute is noise on top. Tests and benchmarks use this: the
  sleeps dominate the noise of a loaded machine.
* ``sample_s`` not given: the real compute plays the part of speed 1; the rank measures its own per-sample
  time ``s`` in its first micro-step and sleeps ``(k_i − 1) × s × b``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.errors import ConfigError

__all__ = ["SimulatedSpeed", "parse_speeds"]


def parse_speeds(text: str, world_size: int) -> tuple[float, ...]:
    """``"1,2,4"`` → ``(1.0, 2.0, 4.0)``: one slowdown factor ≥ 1 per rank.

    Raises:
        ConfigError: not numbers, a factor below 1, or not one per rank.
    """
    try:
        factors = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--simulate-speed {text!r} is invalid (use one factor per rank, e.g. 1,2,4)") from None
    if len(factors) != world_size:
        raise ConfigError(f"--simulate-speed {text!r} gives {len(factors)} factors for {world_size} ranks (give one per rank)")
    if any(not f >= 1 for f in factors):
        raise ConfigError(f"--simulate-speed {text!r}: every factor must be >= 1 (1 = this machine's speed)")
    return factors


@dataclass(kw_only=True)
class SimulatedSpeed:
    """Slowdown factors per rank, and the per-sample time they multiply (see the module docstring)."""

    factors: Sequence[float]
    """k_i per rank (1 = full speed)"""
    sample_s: float | None = None
    """declared seconds per sample of a speed-1 device; None: measured on each rank's first micro-step"""
    _measured_sample_s: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.factors = tuple(float(f) for f in self.factors)
        if not self.factors or any(not f >= 1 for f in self.factors):
            raise ConfigError(f"simulated speed factors must all be >= 1, got {list(self.factors)}")
        if self.sample_s is not None and not self.sample_s > 0:
            raise ConfigError(f"simulated per-sample time must be > 0 s, got {self.sample_s!r}")

    def extra_s(self, rank: int, batch: int, real_s: float) -> float:
        """Seconds to sleep after ``real_s`` seconds of real compute on ``batch`` samples."""
        factor = self.factors[rank]
        if self.sample_s is not None:
            return factor * self.sample_s * batch
        if self._measured_sample_s is None:
            self._measured_sample_s = max(real_s, 0.0) / max(batch, 1)
        return (factor - 1.0) * self._measured_sample_s * batch

    def describe(self) -> str:
        per_sample = f"{self.sample_s * 1e3:g} ms/sample" if self.sample_s is not None else "measured per-sample time"
        return f"simulated speeds {list(self.factors)} × {per_sample}"
