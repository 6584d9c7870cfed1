"""The arithmetic of in-job re-balancing (pure: numpy and the planner's own solver, no torch).

Given the compute time every rank measured for its batch in a few optimizer steps, refit each rank's
affine step time ``t_i(b) = t0_i + t1_i·b`` with the plan's curve as prior, cap every rank by its plan cap
(and, on GPUs, by its measured peak memory extrapolated to the new batch, never above its budget), and
re-run ``planner.allocate.allocate`` for the same step batch and constraints. Every rank runs this on the
same gathered numbers, so every rank reaches the same decision (``planner.runtime.rebalance`` checks it).

The fit, for one rank with measured points ``(b_j, t_j)`` (medians per distinct batch, ``n_j`` steps each):

    minimise  Σ_j n_j·(t0 + t1·b_j − t_j)²  +  λ·(0.1·b̄)²·(t1 − α·t1_plan)²        (t0, t1 ≥ 0)

where ``b̄`` is the mean measured batch, ``α`` the measured / planned time ratio at the measured batches and
``λ`` the prior's weight (``RebalancePolicy.prior_weight``): the prior counts as much as ``λ`` steps at
batches 10% away from the mean. With one distinct batch (the usual case before the first switch) this is
the plan's curve scaled to the measurement, ``α·t_plan(b)``: the plan's idea of fixed vs per-sample cost is
kept, its speed is corrected. Once steps at batches further apart exist (a switch moves a batch by tens of
percent) the data decide the slope, and the prior only steadies it against noise; so a plan whose *shape*
was wrong (an estimate dominated by a fixed cost the device does not have) is corrected by the second
decision at the latest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from planner.allocate.allocation import allocate
from planner.errors import ConfigError, InfeasiblePlanError
from torchkit.step.fit import AffineTimeFit

__all__ = [
    "Decision", "RankLimits", "RebalancePolicy", "StepMeasure", "decide", "fit_rank_time", "idle_fractions",
    "max_idle", "median_points", "memory_cap",
]


#: the prior on the slope weighs like steps at batches this share away from the mean measured batch
_PRIOR_SPREAD = 0.1


@dataclass(frozen=True, kw_only=True)
class RebalancePolicy:
    """When the re-balancer measures and when it switches."""

    probe_steps: int = 10
    """optimizer steps at the start in which every step is measured and may lead to a switch"""
    check_every_steps: int = 50
    """after ``probe_steps``: measure one step in this many, as long as the imbalance stays above
    ``imbalance_threshold`` (a balanced job then runs without any extra collective)"""
    imbalance_threshold: float = 0.05
    """largest idle share (1 − own compute / slowest compute of the step) accepted as balanced"""
    warmup_steps: int = 2
    """first optimizer steps not used for fitting: allocator warm-up, DDP's bucket rebuild in step 2"""
    min_points: int = 3
    """measured steps at a split before deciding on it (their median ignores one noisy step)"""
    min_gain: float = 0.03
    """a switch must cut the predicted step time by at least this share (noise must not cause switches)"""
    prior_weight: float = 1.0
    """weight of the plan's slope in the refit, in steps at batches 10% away from the mean measured batch"""
    max_switches: int = 6
    """switches at most in one job: noise must never make the split wander for good"""

    def __post_init__(self) -> None:
        for name in ("probe_steps", "check_every_steps", "min_points", "max_switches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RebalancePolicy.{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"RebalancePolicy.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        for name in ("imbalance_threshold", "min_gain"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"RebalancePolicy.{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not self.prior_weight >= 0:
            raise ConfigError(f"RebalancePolicy.prior_weight must be >= 0, got {self.prior_weight!r}")


@dataclass(frozen=True, kw_only=True)
class RankLimits:
    """What bounds one rank's batch, and the plan's step-time curve for it (the prior)."""

    cap: int
    """the plan's ``max_batch``: the largest batch its memory model allows"""
    prior: AffineTimeFit
    """the plan profile's step-time fit for this rank's GPU type"""
    memory_budget_bytes: int | None = None
    """the plan's budget (fraction × available); with measured peaks the cap is re-derived under it"""
    bytes_per_sample: float | None = None
    """the plan profile's memory slope, to extrapolate a measured peak to another batch"""


@dataclass(frozen=True, kw_only=True)
class StepMeasure:
    """One measured optimizer step, gathered from all ranks (index = rank)."""

    step: int
    """optimizer step number, from 1"""
    batches: tuple[int, ...]
    """samples each rank took in each micro-step of this step"""
    compute_s: tuple[float, ...]
    """each rank's own compute time for the step (forward+backward, without the all-reduce wait)"""
    peak_bytes: tuple[int, ...] | None = None
    """each rank's peak reserved device memory in the step (GPU only)"""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A new split, and why."""

    batches: tuple[int, ...]
    """the new per-rank batches (same sum as before)"""
    caps: tuple[int, ...]
    """the caps the split was solved under"""
    fits: tuple[AffineTimeFit, ...]
    """each rank's refitted step time"""
    predicted_step_s: float
    """step time of the new split under the refitted curves"""
    current_step_s: float
    """step time of the current split under the same curves"""


def idle_fractions(times_s: Sequence[float]) -> tuple[float, ...]:
    """``1 − t_i / max_j t_j`` per rank: the share of the step each rank waits for the slowest."""
    slowest = max(times_s)
    if slowest <= 0:
        return tuple(0.0 for _ in times_s)
    return tuple(1.0 - t / slowest for t in times_s)


def max_idle(times_s: Sequence[float]) -> float:
    """The largest idle share of one step (0 when perfectly balanced)."""
    return max(idle_fractions(times_s))


def median_points(measures: Sequence[StepMeasure], rank: int) -> list[tuple[int, float, int]]:
    """``(batch, median seconds, steps)`` of one rank, per distinct batch, ascending batch."""
    by_batch: dict[int, list[float]] = {}
    for measure in measures:
        by_batch.setdefault(measure.batches[rank], []).append(measure.compute_s[rank])
    return [(b, statistics.median(ts), len(ts)) for b, ts in sorted(by_batch.items())]


def fit_rank_time(points: Sequence[tuple[int, float, int]], prior: AffineTimeFit, prior_weight: float) -> AffineTimeFit:
    """The refit of the module docstring for ``(batch, seconds, steps)`` points; t0, t1 clipped at 0."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    n = np.array([p[2] for p in points], dtype=float)
    if len(b) == 0 or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("fit_rank_time needs measured points with positive finite times")
    planned = prior.intercept_s + prior.s_per_sample * b
    alpha = float(np.sum(n * t) / np.sum(n * planned)) if np.all(planned > 0) else 1.0
    slope_prior = alpha * prior.s_per_sample
    b_mean = float(np.sum(n * b) / np.sum(n))
    lam = prior_weight * (_PRIOR_SPREAD * b_mean) ** 2
    # normal equations of the penalised least squares in (t0, t1)
    a = np.array([[n.sum(), (n * b).sum()], [(n * b).sum(), (n * b * b).sum() + lam]])
    rhs = np.array([(n * t).sum(), (n * b * t).sum() + lam * slope_prior])
    if abs(np.linalg.det(a)) > 1e-300:
        t0, t1 = (float(v) for v in np.linalg.solve(a, rhs))
    else:  # no prior and one batch: proportional
        t0, t1 = 0.0, float(np.sum(n * t) / np.sum(n * b))
    if t1 < 0:  # time falling with the batch is noise: a constant
        return AffineTimeFit(intercept_s=float(np.sum(n * t) / n.sum()), s_per_sample=0.0)
    if t0 < 0:  # a negative fixed cost is noise: through the origin, same penalty
        t1 = float(((n * b * t).sum() + lam * slope_prior) / ((n * b * b).sum() + lam))
        return AffineTimeFit(intercept_s=0.0, s_per_sample=max(t1, 0.0))
    return AffineTimeFit(intercept_s=t0, s_per_sample=t1)


def memory_cap(limits: RankLimits, peaks: Sequence[tuple[int, int]], multiple_of: int) -> int:
    """The rank's cap: the plan's, and under a measured peak ``(batch, bytes)`` extrapolated with the plan's
    memory slope, the largest multiple of ``multiple_of`` whose extrapolated peak stays within the budget.

    The measured peak at the largest measured batch is the anchor (peaks only grow with the batch); below
    it nothing is extrapolated, since a smaller batch never needs more memory.
    """
    cap = limits.cap
    if not peaks or limits.memory_budget_bytes is None:
        return cap
    anchor_batch, anchor_bytes = max(peaks)
    anchor_bytes = max(p for b, p in peaks if b == anchor_batch)
    slope = limits.bytes_per_sample or 0.0
    if slope <= 0:
        # no slope to extrapolate with: never go above what was seen to fit
        return min(cap, anchor_batch) if anchor_bytes <= limits.memory_budget_bytes else 0
    room = (limits.memory_budget_bytes - anchor_bytes) / slope
    fits = math.floor(anchor_batch + room)
    return max(0, min(cap, fits // multiple_of * multiple_of))


def decide(
    measures: Sequence[StepMeasure],
    limits: Sequence[RankLimits],
    *,
    current: tuple[int, ...],
    multiple_of: int,
    min_batch: int,
    policy: RebalancePolicy,
) -> Decision | None:
    """A better split for the same step batch, or None (keep ``current``).

    ``measures`` are the usable steps (warm-up left out), any split. Nothing changes while the steps measured
    at ``current`` are balanced within ``policy.imbalance_threshold`` and fit every cap. Otherwise the new
    split is the planner's ``balanced`` allocation under the curves refitted to all measured steps and the
    caps; it is taken only when it differs from ``current`` and cuts the predicted step time by
    ``policy.min_gain``, or when ``current`` no longer fits a cap (measured memory grew). When those curves
    say "keep" although the latest steps are measured imbalanced, the older steps mislead (a burst of load
    on the machine during them, a device that changed speed): the split is then solved from the steps at
    ``current`` alone. None also when no allocation exists under these caps (the current split, the one
    that ran, stays).
    """
    world_size = len(current)
    if not measures:
        return None
    caps = []
    for r in range(world_size):
        peaks = [(m.batches[r], m.peak_bytes[r]) for m in measures if m.peak_bytes is not None]
        caps.append(memory_cap(limits[r], peaks, multiple_of))
    over_cap = any(b > c for b, c in zip(current, caps, strict=True))
    at_current = [m for m in measures if m.batches == current]
    if at_current and not over_cap:
        idle_now = max_idle([median_points(at_current, r)[0][1] for r in range(world_size)])
        if idle_now <= policy.imbalance_threshold:
            return None  # balanced as measured: nothing to correct
    solve = dict(limits=limits, caps=tuple(caps), current=current, multiple_of=multiple_of, min_batch=min_batch,
                 policy=policy, over_cap=over_cap)
    decision = _solve(measures, **solve)
    if decision is None and at_current and len(at_current) < len(measures):
        decision = _solve(at_current, **solve)
    return decision


def _solve(
    measures: Sequence[StepMeasure],
    *,
    limits: Sequence[RankLimits],
    caps: tuple[int, ...],
    current: tuple[int, ...],
    multiple_of: int,
    min_batch: int,
    policy: RebalancePolicy,
    over_cap: bool,
) -> Decision | None:
    """The solver's split under the curves fitted to ``measures``, if it is worth switching to."""
    fits = tuple(
        fit_rank_time(median_points(measures, r), limits[r].prior, policy.prior_weight) for r in range(len(current))
    )
    try:
        allocation = allocate(
            np.array(caps, dtype=np.int64),
            [f.intercept_s for f in fits],
            [f.s_per_sample for f in fits],
            mode="balanced",
            global_batch=sum(current),
            multiple_of=multiple_of,
            min_batch=min_batch,
            accumulate=1,  # the same step batch in one step: what a running job can switch to
        )
    except (InfeasiblePlanError, ConfigError):
        return None
    if allocation.accumulate != 1 or not bool(np.all(allocation.included)):
        return None  # the same step batch in one step on every rank is the only switch a running job can make
    new = tuple(int(b) for b in allocation.batches)
    current_s = max(f.predict_s(b) for f, b in zip(fits, current, strict=True))
    if new == current:
        return None
    if not over_cap and allocation.step_time_s > current_s * (1.0 - policy.min_gain):
        return None
    return Decision(batches=new, caps=caps, fits=fits, predicted_step_s=float(allocation.step_time_s),
                    current_step_s=float(current_s))
