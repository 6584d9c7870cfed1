"""What in-job re-balancing did: the switches, the summary line the examples print, and the check that
every sample of an epoch was taken exactly once (pure Python: the gathered numbers only)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.runtime.rebalance_model import StepMeasure, max_idle, median_points

__all__ = ["RebalanceReport", "Switch", "build_report", "samples_once"]


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One re-balancing decision."""

    decided_at_step: int
    """optimizer step after which it was decided"""
    position: tuple[int, int]
    """(sampler pass, micro-step) from which the new split is used"""
    batches: tuple[int, ...]
    predicted_step_s: float
    """step time of the new split under the refitted curves"""
    previous_step_s: float
    """step time of the old split under the same curves"""


@dataclass(frozen=True, kw_only=True)
class RebalanceReport:
    """What re-balancing did, for the summary line and the plan's ``measured`` section."""

    steps: int
    switches: tuple[Switch, ...]
    steps_to_balance: int
    """optimizer steps run before the final split took effect (0: the plan's split was kept)"""
    max_idle_first: float
    """largest idle share with the plan's split (medians of its measured steps)"""
    max_idle_last: float
    """largest idle share with the final split"""
    batches_first: tuple[int, ...]
    batches_last: tuple[int, ...]

    def line(self, samples_once: bool) -> str:
        """The one summary line the examples print."""
        return (
            f"rebalance: switches={len(self.switches)} steps_to_balance={self.steps_to_balance} "
            f"max_idle_first={self.max_idle_first:.3f} max_idle_last={self.max_idle_last:.3f} "
            f"batches_first={list(self.batches_first)} batches_last={list(self.batches_last)} "
            f"samples_once={'true' if samples_once else 'false'}"
        )


def _split_idle(measures: Sequence[StepMeasure], split: tuple[int, ...], since_step: int, warmup_steps: int) -> float:
    """Largest idle share of the medians of the steps at ``split`` from ``since_step`` on (warm-up left out
    when other steps exist); NaN when none was measured."""
    candidates = [m for m in measures if m.batches == split and m.step >= since_step]
    usable = [m for m in candidates if m.step > warmup_steps] or candidates
    if not usable:
        return float("nan")
    return max_idle([median_points(usable, r)[0][1] for r in range(len(split))])


def build_report(
    splits: Sequence[tuple[int, ...]],
    measures: Sequence[StepMeasure],
    switches: Sequence[Switch],
    *,
    warmup_steps: int,
) -> RebalanceReport:
    """The report of a run whose steps used ``splits`` (in step order)."""
    first, last = splits[0], splits[-1]
    run_start = len(splits)
    while run_start > 0 and splits[run_start - 1] == last:
        run_start -= 1
    return RebalanceReport(
        steps=len(splits), switches=tuple(switches),
        steps_to_balance=run_start if switches else 0,
        max_idle_first=_split_idle(measures, first, 1, warmup_steps),
        max_idle_last=_split_idle(measures, last, run_start + 1, warmup_steps),
        batches_first=first, batches_last=last)


def samples_once(sampler: Any, taken: Sequence[Sequence[tuple[int, int, list[int]]]]) -> bool:
    """Whether the ranks took every sample of each epoch's steps exactly once, in the epoch's order.

    Args:
        taken: per rank, ``(epoch, micro-step in epoch, indices)`` of every micro-step it trained on (the
            examples all-gather these at the end).
    """
    by_step: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for rank, steps in enumerate(taken):
        for epoch, step, indices in steps:
            by_step.setdefault((epoch, step), []).append((rank, list(indices)))
    orders: dict[int, list[int]] = {}
    seen: dict[int, set[int]] = {}
    current_epoch = sampler.epoch
    for (epoch, step), parts in sorted(by_step.items()):
        if sorted(r for r, _ in parts) != list(range(sampler.world_size)):
            return False
        if epoch not in orders:
            sampler.set_epoch(epoch)
            orders[epoch] = sampler.epoch_order()
            sampler.set_epoch(current_epoch)
        joined = [i for _, indices in sorted(parts) for i in indices]
        expected = orders[epoch][step * sampler.step_batch:(step + 1) * sampler.step_batch]
        epoch_seen = seen.setdefault(epoch, set())
        if joined != expected or epoch_seen & set(joined):
            return False
        epoch_seen.update(joined)
    return True
