"""What in-job re-balancing did: the switches, the summary line the examples print, and the check that
every sample of an epoch was taken exactly once (pure Python: the gathered numbers only)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.plan.sections import StepMeasure, Switch
from planner.runtime.rebalance_model import max_idle, split_step_s

__all__ = ["RebalanceReport", "Switch", "build_report", "samples_once"]


@dataclass(frozen=True, kw_only=True)
class RebalanceReport:
    """What re-balancing did, for the summary line and the plan's ``measured`` section."""

    steps: int
    switches: tuple[Switch, ...]
    """every change of the split, roll-backs included"""
    steps_to_balance: int
    """optimizer steps run before the final split took effect (0: the plan's split was kept)"""
    max_idle_first: float | None
    """largest idle share with the plan's split (medians of its measured steps); None: none measured"""
    max_idle_last: float | None
    """largest idle share with the final split (its last run's steps, else any); None: none measured"""
    batches_first: tuple[int, ...]
    batches_last: tuple[int, ...]
    step_compute_s_first: float | None = None
    """the plan's split's step compute: the median over its steps of the slowest rank's compute, what a switch is
    judged by (``planner.runtime.rebalance_model.split_step_s``); None: none measured"""
    step_compute_s_last: float | None = None
    """the same for the final split: below ``step_compute_s_first``, the re-balancing paid off"""
    compute_s_last: tuple[float, ...] | None = None
    """each rank's median compute per step with the final split"""
    sync_wait_s_last: tuple[float, ...] | None = None
    """each rank's median synchronisation wait per step with the final split (``StepMeasure.sync_wait_s``)"""
    watch_overhead: float | None = None
    """share of the watching steps' time spent gathering and deciding (None: the job never got to watch)"""

    @property
    def rollbacks(self) -> int:
        return sum(1 for s in self.switches if s.kind == "rollback")

    def line(self, samples_once: bool) -> str:
        """The one summary line the examples print."""

        def idle(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.3f}"

        def seconds(values: tuple[float, ...] | None) -> str:
            return "n/a" if values is None else "[" + ", ".join(f"{v:.4f}" for v in values) + "]"

        def step(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.4f}"

        overhead = "n/a" if self.watch_overhead is None else f"{self.watch_overhead:.2%}"
        return (
            f"rebalance: switches={len(self.switches)} steps_to_balance={self.steps_to_balance} "
            f"step_compute_s_first={step(self.step_compute_s_first)} step_compute_s_last={step(self.step_compute_s_last)} "
            f"max_idle_first={idle(self.max_idle_first)} max_idle_last={idle(self.max_idle_last)} "
            f"batches_first={list(self.batches_first)} batches_last={list(self.batches_last)} "
            f"samples_once={'true' if samples_once else 'false'} rollbacks={self.rollbacks} "
            f"compute_s_last={seconds(self.compute_s_last)} sync_wait_s_last={seconds(self.sync_wait_s_last)} "
            f"watch_overhead={overhead}"
        )


def _usable(
    measures: Sequence[StepMeasure], split: tuple[int, ...], since_step: int, warmup_steps: int
) -> list[StepMeasure]:
    """The steps at ``split`` from ``since_step`` on (warm-up left out when other steps exist)."""
    candidates = [m for m in measures if m.batches == split and m.step >= since_step]
    return [m for m in candidates if m.step > warmup_steps] or candidates


def _medians(at: Sequence[StepMeasure], field: str) -> tuple[float, ...] | None:
    rows = [getattr(m, field) for m in at if getattr(m, field) is not None]
    if not rows:
        return None
    return tuple(statistics.median(row[r] for row in rows) for r in range(len(rows[0])))


def build_report(
    splits: Sequence[tuple[int, ...]],
    measures: Sequence[StepMeasure],
    switches: Sequence[Switch],
    *,
    warmup_steps: int,
    watch_overhead: float | None = None,
) -> RebalanceReport:
    """The report of a run whose steps used ``splits`` (in step order)."""
    first, last = splits[0], splits[-1]
    run_start = len(splits)
    while run_start > 0 and splits[run_start - 1] == last:
        run_start -= 1
    at_first = _usable(measures, first, 1, warmup_steps)
    # the final split's last run; a split seen before and not measured since: its earlier steps
    at_last = _usable(measures, last, run_start + 1, warmup_steps) or _usable(measures, last, 1, warmup_steps)
    compute_first, compute_last = _medians(at_first, "compute_s"), _medians(at_last, "compute_s")
    return RebalanceReport(
        steps=len(splits),
        switches=tuple(switches),
        steps_to_balance=run_start if switches else 0,
        max_idle_first=None if compute_first is None else max_idle(compute_first),
        max_idle_last=None if compute_last is None else max_idle(compute_last),
        batches_first=first,
        batches_last=last,
        step_compute_s_first=split_step_s(at_first) if at_first else None,
        step_compute_s_last=split_step_s(at_last) if at_last else None,
        compute_s_last=compute_last,
        sync_wait_s_last=_medians(at_last, "sync_wait_s"),
        watch_overhead=watch_overhead,
    )


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
        expected = orders[epoch][step * sampler.step_batch : (step + 1) * sampler.step_batch]
        epoch_seen = seen.setdefault(epoch, set())
        if joined != expected or epoch_seen & set(joined):
            return False
        epoch_seen.update(joined)
    return True
