"""A declared simulation of slower devices on CPU: rank i's compute takes longer in proportion to its batch.

On one CPU machine every gloo rank runs at the same speed, so a plan's speed ratios cannot be seen to be
wrong. ``SimulatedSpeed`` makes rank i behave like a device ``k_i`` times slower per sample by sleeping where
a slower device would still be computing: after the rank's own forward+backward, before its gradients
leave for the all-reduce (``planner.runtime.rebalance`` calls it from its DDP comm hook, or at the end of a
``no_sync`` micro-step). It is never on unless asked for (``--simulate-speed`` in the examples), and the
plan, the logs and the summary line say so.

One per-sample time ``s`` is shared by all ranks, so ``--simulate-speed 1,2,4`` means speeds 1, 2 and 4:

* ``sample_s`` declared: the simulated device needs ``k_i × sample_s`` seconds per sample, so the sleep is
  ``k_i × sample_s × b`` and the (small) real compute is noise on top. Tests and benchmarks use this: the
  sleeps dominate the noise of a loaded machine.
* ``sample_s`` not given: ``s`` is measured once, after the warm-up, and agreed by all ranks (the median of the
  ranks' real seconds per sample in the same step: ``agree``); from then on rank i's compute is stretched to
  ``k_i × s × b``, its real compute part of it (the sleep is what is left, never negative). Until then nothing
  sleeps; the re-balancer leaves those steps out of its fits. (The real compute used to play speed 1, with
  ``(k_i − 1) × s × b`` on top: but ``s`` measured as compute per sample carries a step's fixed cost, which the
  real compute of a speed-1 rank does not grow by, so the speeds were not the declared ones. With the examples'
  small MLP, almost all fixed cost, rank 2 of ``4,2,1`` cost microseconds per sample against rank 0's 0.2 ms,
  and the re-balancer rightly moved every sample it could to it.)

With a measured ``s``, what is timed as the simulated device's compute is the time declared, not the host's
sleep: a sleep on a loaded machine ends late by the scheduler's wake-up latency (2-4 ms at load 10, whatever its
length), several times these sleeps of a fraction of a millisecond, which made every rank that slept look like a
device with a fixed cost of that size, deaf to its batch, beside one that did not; the lateness is this rank's
wait instead (``planner.runtime.rebalance``: the host clock's mark is credited). A declared ``sample_s``'s sleeps
(tens of ms) keep it, as the noise a real device's step has.

A speed that changes mid-run (``changes``, ``--simulate-speed-change STEP:K0,K1,...``) tests that the job keeps
watching: from optimizer step STEP on, the factors are K0, K1, ...

Known limitations: the simulated device is slower per sample only; a fixed per-step cost of a real slow
device is not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.errors import ConfigError

__all__ = ["SimulatedSpeed", "parse_speed_change", "parse_speeds"]


def parse_speeds(text: str, world_size: int, flag: str = "--simulate-speed") -> tuple[float, ...]:
    """``"1,2,4"`` → ``(1.0, 2.0, 4.0)``: one slowdown factor ≥ 1 per rank.

    Raises:
        ConfigError: not numbers, a factor below 1, or not one per rank.
    """
    try:
        factors = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is invalid (use one factor per rank, e.g. 1,2,4)") from None
    if len(factors) != world_size:
        raise ConfigError(
            f"{flag} {text!r} gives {len(factors)} factors for {world_size} ranks (give one per rank)"
        )
    if any(not 1 <= f < float("inf") for f in factors):
        raise ConfigError(f"{flag} {text!r}: every factor must be a number >= 1 (1 = this machine's speed)")
    return factors


def parse_speed_change(text: str, world_size: int) -> tuple[int, tuple[float, ...]]:
    """``"30:4,2,1"`` → ``(30, (4.0, 2.0, 1.0))``: from optimizer step 30 on, these factors.

    Raises:
        ConfigError: not ``STEP:K0,K1,...`` with STEP ≥ 1 and one factor ≥ 1 per rank.
    """
    flag = "--simulate-speed-change"
    step_text, colon, factors_text = text.partition(":")
    if not colon or not step_text.strip().isdigit() or int(step_text) < 1:
        raise ConfigError(f"{flag} {text!r} is invalid (use STEP:K0,K1,... with STEP >= 1, e.g. 30:4,2,1)")
    return int(step_text), parse_speeds(factors_text, world_size, flag)


@dataclass(kw_only=True)
class SimulatedSpeed:
    """Slowdown factors per rank, and the per-sample time they multiply (see the module docstring)."""

    factors: Sequence[float]
    """k_i per rank (1 = full speed), from the first step on"""
    sample_s: float | None = None
    """declared seconds per sample of a speed-1 device; None: measured after the warm-up and agreed (``agree``)"""
    changes: Sequence[tuple[int, Sequence[float]]] = ()
    """``(step, factors)``: from optimizer step ``step`` on, these factors (a speed change mid-run)"""
    _agreed_sample_s: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.factors = tuple(float(f) for f in self.factors)
        self.changes = tuple(sorted((int(step), tuple(float(f) for f in fs)) for step, fs in self.changes))
        for factors in (self.factors, *(fs for _, fs in self.changes)):
            if (
                not factors
                or len(factors) != len(self.factors)
                or any(not 1 <= f < float("inf") for f in factors)
            ):
                raise ConfigError(
                    f"simulated speed factors must be one number >= 1 per rank, got {list(factors)}"
                )
        if any(step < 1 for step, _ in self.changes):
            raise ConfigError(
                f"a simulated speed change must start at optimizer step >= 1, got {list(self.changes)}"
            )
        if self.sample_s is not None and not 0 < self.sample_s < float("inf"):
            raise ConfigError(f"simulated per-sample time must be > 0 s, got {self.sample_s!r}")

    def factors_at(self, step: int) -> tuple[float, ...]:
        """The factors in force in optimizer step ``step`` (from 1)."""
        factors = self.factors
        for start, changed in self.changes:
            if step >= start:
                factors = changed
        return tuple(factors)

    @property
    def measuring(self) -> bool:
        """Whether the shared per-sample time is still to be agreed (nothing sleeps until it is)."""
        return self.sample_s is None and self._agreed_sample_s is None

    def agree(self, sample_s: float) -> None:
        """Set the shared per-sample time of speed 1 (the same value on every rank)."""
        if not sample_s >= 0:
            raise ValueError(
                f"the agreed per-sample time must be >= 0, got {sample_s!r}"
            )  # our own invariant
        self._agreed_sample_s = float(sample_s)

    def extra_s(self, rank: int, batch: int, step: int, real_s: float = 0.0) -> float:
        """Seconds to sleep after rank ``rank``'s real compute of ``real_s`` seconds on ``batch`` samples in
        optimizer step ``step`` (a measured ``s``: the rest of ``k × s × batch``; a declared one: all of it)."""
        factor = self.factors_at(step)[rank]
        if self.sample_s is not None:
            return factor * self.sample_s * batch
        if self._agreed_sample_s is None:
            return 0.0
        return max(0.0, factor * self._agreed_sample_s * batch - real_s)

    def step_time_s(self, batches: Sequence[int], step: int) -> float:
        """The simulated step time of a split, the slowest rank's (declared ``sample_s`` only: the truth a
        benchmark compares with)."""
        if self.sample_s is None:
            raise ValueError("step_time_s needs a declared sample_s")  # our own invariant
        return max(k * self.sample_s * b for k, b in zip(self.factors_at(step), batches, strict=True))

    def describe(self) -> str:
        if self.sample_s is not None:
            per_sample = f"{self.sample_s * 1e3:g} ms/sample"
        elif self._agreed_sample_s is not None:
            per_sample = (
                f"{self._agreed_sample_s * 1e3:.3g} ms/sample (measured after warm-up, agreed by all ranks; "
                "the real compute is part of it)"
            )
        else:
            per_sample = "a per-sample time measured after warm-up"
        changes = "".join(f", from step {step}: {list(fs)}" for step, fs in self.changes)
        return f"simulated speeds {list(self.factors)}{changes} × {per_sample}"
