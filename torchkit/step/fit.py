"""Fits of a training step's memory and time against batch size: the one home of these curves.

Pure numpy (no torch): used by ``torchkit.seed_api.autobatch`` on a single GPU and by ``planner.profiles.profile`` for every
device of a cluster.

Models (DESIGN.md, Profiles):
- memory, default ``affine``: ``mem(b) = m0 + m1·b``. Weights, gradients, optimizer state and workspaces are
  constant in b; activations grow linearly. Least squares, with a residual check.
- memory, ``loglog``: Ultralytics 8.3.51's fit, ``log mem = p0·log b + p1``, kept for comparison.
- time: ``t(b) = t0 + t1·b`` (Pollux's compute model).

The fits are records of documents (a profile's ``memory_fit`` and ``time_fit`` in plan.json and the profile
cache): ``kind`` comes first, as written; a ``MemoryFit`` is one of its subclasses, told apart by ``kind``
(``tag_field``, read by ``planner.codec``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

MemoryFitKind = Literal["affine", "loglog"]

#: a point whose value is further than this share from its fit is reported as an outlier
OUTLIER_RELATIVE_TOLERANCE = 0.10


class MemoryFit:
    """A memory curve: :class:`AffineMemoryFit` or :class:`LogLogMemoryFit`, by its ``kind``."""

    tag_field = "kind"
    kind: MemoryFitKind

    def predict_bytes(self, batch: float) -> float:
        raise NotImplementedError

    def largest_batch_within(self, budget_bytes: float) -> float:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class AffineMemoryFit(MemoryFit):
    """``mem(b) = intercept_bytes + bytes_per_sample·b``."""

    kind: Literal["affine"] = "affine"
    intercept_bytes: float
    """memory of a step that does not depend on the batch: weights, gradients, optimizer state, workspaces"""
    bytes_per_sample: float
    """memory each extra sample adds (activations, mostly)"""

    def predict_bytes(self, batch: float) -> float:
        return self.intercept_bytes + self.bytes_per_sample * batch

    def largest_batch_within(self, budget_bytes: float) -> float:
        """Real-valued b with ``mem(b) = budget``; ``inf`` if memory does not grow with the batch."""
        if self.bytes_per_sample <= 0:
            return math.inf if self.intercept_bytes <= budget_bytes else 0.0
        return (budget_bytes - self.intercept_bytes) / self.bytes_per_sample


@dataclass(frozen=True, kw_only=True)
class LogLogMemoryFit(MemoryFit):
    """``log mem(b) = log_slope·log b + log_intercept`` (Ultralytics 8.3.51-8.3.100)."""

    kind: Literal["loglog"] = "loglog"
    log_slope: float
    """p0: exponent of the batch"""
    log_intercept: float
    """p1: log of the bytes at batch 1"""

    def predict_bytes(self, batch: float) -> float:
        return math.exp(self.log_slope * math.log(max(batch, 1e-12)) + self.log_intercept)

    def largest_batch_within(self, budget_bytes: float) -> float:
        if budget_bytes <= 0:
            return 0.0
        if self.log_slope <= 0:
            return math.inf if self.predict_bytes(1) <= budget_bytes else 0.0
        return math.exp((math.log(budget_bytes) - self.log_intercept) / self.log_slope)


@dataclass(frozen=True, kw_only=True)
class AffineTimeFit:
    """``t(b) = intercept_s + s_per_sample·b``: seconds of one optimizer step at per-device batch b."""

    kind: Literal["affine"] = "affine"
    intercept_s: float
    """fixed cost of a step: kernel launches, optimizer update, weight reads"""
    s_per_sample: float
    """seconds each extra sample adds"""

    def predict_s(self, batch: float) -> float:
        return self.intercept_s + self.s_per_sample * batch


@dataclass(frozen=True, kw_only=True)
class DroppedPoint:
    """A probe point left out of a fit, and why (shown to the user, never silently swallowed)."""

    batch: int
    value: float
    reason: str


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """A fit together with the points it used, those it dropped, and those far off the line."""

    fit: MemoryFit | AffineTimeFit
    used_points: tuple[tuple[int, float], ...]
    dropped: tuple[DroppedPoint, ...] = ()
    outliers: tuple[DroppedPoint, ...] = ()
    """used points further than OUTLIER_RELATIVE_TOLERANCE from the fit (reported, still used)"""


def clean_increasing(
    points: Sequence[tuple[int, float]],
) -> tuple[list[tuple[int, float]], list[DroppedPoint]]:
    """Sort points by batch and drop those that break monotonic growth.

    A training step never needs less memory for a larger batch; a point that does (caching allocator reuse,
    cudnn.benchmark, a measurement taken while another process freed memory) is dropped with its reason.
    Duplicate batches keep the largest value (the conservative one).
    """
    by_batch: dict[int, float] = {}
    dropped: list[DroppedPoint] = []
    for batch, value in points:
        if batch <= 0 or not math.isfinite(value) or value <= 0:
            dropped.append(
                DroppedPoint(batch=int(batch), value=float(value), reason="not a positive finite point")
            )
            continue
        if batch in by_batch:
            dropped.append(
                DroppedPoint(
                    batch=int(batch), value=float(min(value, by_batch[batch])), reason="duplicate batch"
                )
            )
            value = max(value, by_batch[batch])
        by_batch[int(batch)] = float(value)
    kept: list[tuple[int, float]] = []
    for batch in sorted(by_batch):
        value = by_batch[batch]
        if kept and value <= kept[-1][1]:
            dropped.append(
                DroppedPoint(
                    batch=batch,
                    value=value,
                    reason=f"not increasing: {value:.4g} at batch {batch} <= {kept[-1][1]:.4g} at batch {kept[-1][0]}",
                )
            )
            continue
        kept.append((batch, value))
    return kept, dropped


def _outliers(points: Sequence[tuple[int, float]], predict) -> tuple[DroppedPoint, ...]:
    found = []
    for batch, value in points:
        predicted = predict(batch)
        if abs(predicted - value) > OUTLIER_RELATIVE_TOLERANCE * abs(value):
            found.append(
                DroppedPoint(
                    batch=batch,
                    value=value,
                    reason=f"{abs(predicted - value) / value:.0%} off the fit ({predicted:.4g})",
                )
            )
    return tuple(found)


def fit_memory(points: Sequence[tuple[int, float]], kind: MemoryFitKind = "affine") -> FitResult:
    """Fit ``(batch, peak_bytes)`` points.

    Non-increasing points are dropped (reported in ``dropped``). With a single usable point the affine fit is
    proportional (``m0 = 0``): it overestimates the per-sample cost, so batches above that point are
    underestimated rather than run out of memory.

    Raises:
        ValueError: no usable point.
    """
    kept, dropped = clean_increasing(points)
    if not kept:
        raise ValueError("no usable memory point to fit (every probe failed or was not increasing)")
    batches = np.array([b for b, _ in kept], dtype=float)
    values = np.array([v for _, v in kept], dtype=float)
    if kind == "affine":
        if len(kept) == 1:
            fit = AffineMemoryFit(intercept_bytes=0.0, bytes_per_sample=float(values[0] / batches[0]))
        else:
            slope, intercept = np.polyfit(batches, values, 1)
            fit = AffineMemoryFit(intercept_bytes=float(intercept), bytes_per_sample=float(slope))
        return FitResult(
            fit=fit,
            used_points=tuple(kept),
            dropped=tuple(dropped),
            outliers=_outliers(kept, fit.predict_bytes),
        )
    if kind == "loglog":
        if len(kept) == 1:
            fit = LogLogMemoryFit(log_slope=1.0, log_intercept=float(math.log(values[0] / batches[0])))
        else:
            slope, intercept = np.polyfit(np.log(batches), np.log(values), 1)
            fit = LogLogMemoryFit(log_slope=float(slope), log_intercept=float(intercept))
        return FitResult(
            fit=fit,
            used_points=tuple(kept),
            dropped=tuple(dropped),
            outliers=_outliers(kept, fit.predict_bytes),
        )
    raise ValueError(f"unknown memory fit kind {kind!r} (use 'affine' or 'loglog')")


def fit_time(points: Sequence[tuple[int, float]]) -> FitResult:
    """Least-squares ``t(b) = t0 + t1·b`` over ``(batch, step_seconds)`` points.

    Timings are noisy, so points are not required to increase; t0 and t1 are clipped at 0 (a negative fixed
    cost or per-sample cost is measurement noise). One point gives a proportional fit.

    Raises:
        ValueError: no positive finite point.
    """
    usable = [(int(b), float(t)) for b, t in points if b > 0 and math.isfinite(t) and t > 0]
    dropped = tuple(
        DroppedPoint(batch=int(b), value=float(t), reason="not a positive finite time")
        for b, t in points
        if not (b > 0 and math.isfinite(t) and t > 0)
    )
    if not usable:
        raise ValueError("no usable step-time point to fit")
    batches = np.array([b for b, _ in usable], dtype=float)
    times = np.array([t for _, t in usable], dtype=float)
    if len(set(batches.tolist())) == 1:
        fit = AffineTimeFit(intercept_s=0.0, s_per_sample=float(times.mean() / batches[0]))
    else:
        slope, intercept = np.polyfit(batches, times, 1)
        if slope < 0:
            fit = AffineTimeFit(intercept_s=float(times.mean()), s_per_sample=0.0)
        elif intercept < 0:
            fit = AffineTimeFit(
                intercept_s=0.0, s_per_sample=float(np.dot(batches, times) / np.dot(batches, batches))
            )
        else:
            fit = AffineTimeFit(intercept_s=float(intercept), s_per_sample=float(slope))
    return FitResult(
        fit=fit, used_points=tuple(usable), dropped=dropped, outliers=_outliers(usable, fit.predict_s)
    )


def max_batch_within(
    fit: MemoryFit, budget_bytes: float, multiple_of: int = 1, upper: int | None = None
) -> int:
    """Largest batch b (a multiple of ``multiple_of``, at most ``upper``) with ``fit(b) <= budget_bytes``; 0 if none."""
    if multiple_of < 1:
        raise ValueError(f"multiple_of must be >= 1, got {multiple_of}")
    real = fit.largest_batch_within(budget_bytes)
    if upper is not None:
        real = min(real, upper)
    if not math.isfinite(real):
        raise ValueError("memory does not grow with the batch: give an upper bound")
    batch = int(math.floor(real + 1e-9)) // multiple_of * multiple_of
    # guard against rounding at the boundary: the answer must really fit
    while batch > 0 and fit.predict_bytes(batch) > budget_bytes:
        batch -= multiple_of
    return max(batch, 0)
