"""AutoBatch's decision: probe points ``(batch, peak bytes or None)`` -> the batch to train with.

Pure numpy (no torch): used by ``torchkit.seed_api.autobatch`` on measured points, and usable with points from the
fake-tensor estimator. ``choose_batch`` has four rules:
- ``affine`` (default) and ``loglog``: ours, on a ``torchkit.step.fit`` curve;
- ``seed-linear`` (ultralytics 8.4.190) and ``seed-loglog`` (8.3.51): the seed's own rules, quirks included
  (shared/reference/ultralytics-behaviour.md §1.2, §1.5), kept for comparison (``bench/bench_fit.py``).

Where ours differs from the seed, and why (shared/reference/ultralytics-behaviour.md §1.4, §5):
- memory is fitted in bytes with ``torchkit.step.fit``: points that do not grow are dropped with their reason
  (compared with the last kept point, not the previous raw probe); a single point gives a proportional fit
  (it over-estimates the per-sample cost), not numpy's minimum-norm line (seed: [0.25, 0.25] -> 17 -> 1);
- a failed probe above a fit that says it fits within the budget contradicts the fit: instead of dropping to
  the previous probe (seed: fit 22 -> 8, 23 % of memory) the batch is read off the chord from the last probe
  that ran to the failed one at the whole available memory (-> 11, 51 %);
- a curve whose largest probes stop growing (reserved-memory caching, cudnn.benchmark; yolov5#9287) is not
  extrapolated beyond the largest batch that ran (seed: 53 on an 8 GB card; ours: 16, which the user ran);
- ``multiple_of`` rounds down, and every adjustment is returned in ``warnings``.
The budget rule itself (``fraction`` × available; ``DEFAULT_FRACTION``) is the engine's, ``torchkit.step.budget``,
re-exported here.
Shared with the newest seed: a probe at or above the device total is dropped and is no ceiling, failures
below the smallest batch that ran are ignored, the batch is clamped to [first fit, 1024] and to
``dataset_size``, and nothing usable raises the seed's RuntimeError.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from torchkit.step.budget import DEFAULT_FRACTION, memory_budget_bytes, memory_target_bytes
from torchkit.step.fit import (
    AffineMemoryFit,
    DroppedPoint,
    LogLogMemoryFit,
    MemoryFit,
    fit_memory,
    max_batch_within,
)
from torchkit.units import GIB

PREFIX = "AutoBatch: "

#: returned when AutoBatch cannot run (seed: ``DEFAULT_CFG.batch``)
DEFAULT_BATCH = 16
#: upper clamp (seed, newest: clamp to [first fit, 1024]; older versions fell back to 16 above it)
MAX_BATCH = 1024
#: probe sizes (seed §1.2 step 4); the two largest only on cards of 16 GiB or more
PROBES_SMALL_GPU = (1, 2, 4, 8, 16)
PROBES_LARGE_GPU = (1, 2, 4, 8, 16, 32, 64)
LARGE_GPU_BYTES = 16 * GIB

FitMethod = Literal["affine", "loglog", "seed-linear", "seed-loglog"]
FIT_METHODS: tuple[str, ...] = ("affine", "loglog", "seed-linear", "seed-loglog")
LimitedBy = Literal[
    "budget", "oom-ceiling", "largest-probe", "first-fit", "max-batch", "dataset-size", "default"
]


@dataclass(frozen=True, kw_only=True)
class BatchChoice:
    """The batch chosen from probe points, with everything that shaped it."""

    batch: int
    """the chosen per-device batch size"""
    predicted_bytes: int
    """predicted peak memory at ``batch`` (the fit, or the chord under an OOM ceiling)"""
    predicted_fraction_of_total: float
    """``predicted_bytes / total_bytes``, as the seed prints it"""
    budget_bytes: int
    """``fraction × available_bytes``: what the batch was allowed to use"""
    fit: FitMethod
    """the decision rule used"""
    memory_fit: MemoryFit | None
    """the fitted curve (in bytes); None when the seed fell back to the default before fitting"""
    used_points: tuple[tuple[int, int], ...]
    """``(batch, peak_bytes)`` points the fit used"""
    dropped: tuple[DroppedPoint, ...] = ()
    """probe points left out, with the reason (failed probes have a NaN value)"""
    outliers: tuple[DroppedPoint, ...] = ()
    """used points further than ``torchkit.step.fit.OUTLIER_RELATIVE_TOLERANCE`` from the fit (logged, still used)"""
    oom_ceiling: int | None = None
    """first failed probe above the smallest one that ran: the batch stays below it"""
    limited_by: LimitedBy = "budget"
    """what set the batch: the memory budget, the OOM ceiling, the largest probe that ran, the clamp to the
    first fit, ``max_batch``, ``dataset_size``, or the seed's fallback to the default batch"""
    warnings: tuple[str, ...] = ()
    """things the user should know (fallbacks, contradicted fits); the edge logs each one"""


def probe_list(total_bytes: int, dataset_size: int = 0) -> list[int]:
    """The seed's probe sizes for a device of ``total_bytes``, without those larger than the dataset."""
    batches = PROBES_SMALL_GPU if total_bytes < LARGE_GPU_BYTES else PROBES_LARGE_GPU
    return [b for b in batches if dataset_size <= 0 or b <= dataset_size]


def no_usable_batch_message(probe_batches: Sequence[int]) -> str:
    """The seed's RuntimeError text (PR #25739) when no probe gave a usable point."""
    return (
        f"{PREFIX}no usable batch size found while profiling batch={list(probe_batches)}. See the errors "
        "above, free GPU memory, reduce imgsz, or set batch explicitly."
    )


def choose_batch(
    probe_batches: Sequence[int],
    probe_peak_bytes: Sequence[float | None],
    *,
    total_bytes: int,
    available_bytes: int,
    fraction: float = DEFAULT_FRACTION,
    fit: FitMethod = "affine",
    dataset_size: int = 0,
    multiple_of: int = 1,
    max_batch: int = MAX_BATCH,
    default_batch: int = DEFAULT_BATCH,
) -> BatchChoice:
    """Choose a batch from probe points: the largest whose predicted peak fits ``fraction × available``.

    Args:
        probe_batches: probed batch sizes, strictly increasing.
        probe_peak_bytes: peak memory of each probe in bytes; None where the probe failed (out of memory or
            another error). Measured or estimated points alike.
        total_bytes: the device's total memory.
        available_bytes: memory this process may use: driver-free memory + what it already reserves.
        fraction: share of ``available_bytes`` to fill, in (0, 1].
        fit: ``affine`` (ours, default), ``loglog`` (ours with the seed's log-log curve), ``seed-linear``
            (ultralytics 8.4.190's rule) or ``seed-loglog`` (8.3.51's rule). The seed rules ignore
            ``multiple_of`` (it must be 1); ``seed-loglog`` predates ``dataset_size`` (it must be 0).
        dataset_size: when > 0, the batch is at most this.
        multiple_of: the batch is rounded down to a multiple of this.
        max_batch: upper clamp (the seed's 1024).
        default_batch: what the seed rules fall back to on an error or, for 8.3.51, outside [1, max_batch].

    Raises:
        RuntimeError: no probe gave a usable point (the seed's message), or no multiple of ``multiple_of``
            fits.
        ValueError: inconsistent arguments.
    """
    batches = [int(b) for b in probe_batches]
    peaks = [None if p is None else float(p) for p in probe_peak_bytes]
    _check_arguments(batches, peaks, total_bytes, available_bytes, fraction, fit, dataset_size, multiple_of)
    if fit in ("seed-linear", "seed-loglog"):
        return _choose_seed(
            batches,
            peaks,
            total_bytes=total_bytes,
            available_bytes=available_bytes,
            fraction=fraction,
            loglog=fit == "seed-loglog",
            dataset_size=dataset_size,
            max_batch=max_batch,
            default_batch=default_batch,
        )
    return _choose_ours(
        batches,
        peaks,
        total_bytes=total_bytes,
        available_bytes=available_bytes,
        fraction=fraction,
        kind=fit,
        dataset_size=dataset_size,
        multiple_of=multiple_of,
        max_batch=max_batch,
    )


def _check_arguments(batches, peaks, total_bytes, available_bytes, fraction, fit, dataset_size, multiple_of):
    if len(batches) != len(peaks):
        raise ValueError(f"{len(batches)} probe batches but {len(peaks)} peak values")
    if any(b < 1 for b in batches) or any(b2 <= b1 for b1, b2 in zip(batches, batches[1:], strict=False)):
        raise ValueError(f"probe batches must be positive and strictly increasing, got {batches}")
    if total_bytes <= 0 or available_bytes <= 0:
        raise ValueError(
            f"total and available memory must be positive, got {total_bytes} and {available_bytes}"
        )
    check_options(fit, fraction=fraction, dataset_size=dataset_size, multiple_of=multiple_of)


def check_options(
    fit: str, *, fraction: float = DEFAULT_FRACTION, dataset_size: int = 0, multiple_of: int = 1
) -> None:
    """Raise ValueError for an unknown rule, a bad option, or one the rule lacks (before any probe is spent)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fit not in FIT_METHODS:
        raise ValueError(f"unknown fit {fit!r} (use one of {', '.join(FIT_METHODS)})")
    if dataset_size < 0 or multiple_of < 1:
        raise ValueError(
            f"dataset_size must be >= 0 and multiple_of >= 1, got {dataset_size} and {multiple_of}"
        )
    if fit in ("seed-linear", "seed-loglog") and multiple_of != 1:
        raise ValueError(f"the seed's rule {fit!r} has no multiple_of (got {multiple_of}; use fit='affine')")
    if fit == "seed-loglog" and dataset_size > 0:
        raise ValueError(
            "the seed's 8.3.51 rule 'seed-loglog' has no dataset_size clamp (use dataset_size=0)"
        )


def _usable_points(
    batches, peaks, total_bytes
) -> tuple[list[tuple[int, float]], list[DroppedPoint], list[int]]:
    """The (batch, peak) points a fit can use, the points dropped with why, and the batches whose probe failed."""
    dropped: list[DroppedPoint] = []
    points: list[tuple[int, float]] = []
    failed: list[int] = []
    for batch, peak in zip(batches, peaks, strict=True):
        if peak is None:
            failed.append(batch)
            dropped.append(DroppedPoint(batch=batch, value=math.nan, reason="probe failed"))
        elif not (math.isfinite(peak) and peak > 0):
            dropped.append(DroppedPoint(batch=batch, value=peak, reason="not a positive finite peak"))
        elif peak >= total_bytes:
            # impossible as a measurement (it would have run out of memory); not a ceiling either (seed §1.4)
            dropped.append(
                DroppedPoint(
                    batch=batch,
                    value=peak,
                    reason=f"peak {peak / GIB:.2f}G >= device total {total_bytes / GIB:.2f}G",
                )
            )
        else:
            points.append((batch, peak))
    return points, dropped, failed


def _below_ceiling(
    points,
    ceiling: int,
    budget: float,
    available_bytes: float,
    first_fit: int,
    predict: Callable[[float], float],
) -> tuple[int, Callable[[float], float], str]:
    """The batch below an out-of-memory ``ceiling`` the fit wrongly allowed, the curve used and why."""
    # The fit says `ceiling` fits within fraction × available, yet it ran out of the whole available
    # memory: memory grows faster than fitted above the last probe that ran. Read the batch off the chord
    # from that probe to (ceiling, available) instead of trusting the fit (or dropping to the last probe).
    last, last_bytes = max((b, p) for b, p in points if b < ceiling)
    slope = (available_bytes - last_bytes) / (ceiling - last)
    if budget >= last_bytes and slope > 0:
        batch = min(last + math.floor((budget - last_bytes) / slope), ceiling - 1)
    else:
        within = [b for b, p in points if b < ceiling and p <= budget]
        batch = max(within) if within else first_fit
    note = (
        f"batch {ceiling} ran out of memory although the fit predicts {predict(ceiling) / GIB:.2f}G for it: "
        f"using the chord from batch {last} ({last_bytes / GIB:.2f}G) to batch {ceiling} "
        f"({available_bytes / GIB:.2f}G available)"
    )
    return batch, _chord(last, last_bytes, slope), note


def _choose_ours(
    batches, peaks, *, total_bytes, available_bytes, fraction, kind, dataset_size, multiple_of, max_batch
) -> BatchChoice:
    budget = memory_target_bytes(fraction, available_bytes)
    notes: list[str] = []
    points, dropped, failed = _usable_points(batches, peaks, total_bytes)
    if not points:
        raise RuntimeError(no_usable_batch_message(batches))
    first_fit = points[0][0]
    if below := [b for b in failed if b < first_fit]:
        notes.append(
            f"probes at batch {below} failed below the smallest batch that ran ({first_fit}): ignored"
        )
    above = [b for b in failed if b > first_fit]
    ceiling = min(above) if above else None

    result = fit_memory(points, kind=kind)
    curve = result.fit
    dropped.extend(result.dropped)
    used = dict(result.used_points)
    predict: Callable[[float], float] = curve.predict_bytes

    upper, upper_reason = max_batch, "max-batch"
    if 0 < dataset_size < upper:
        upper, upper_reason = dataset_size, "dataset-size"
    batch = max_batch_within(curve, budget, 1, upper=upper)
    limited_by: LimitedBy = "budget" if batch < upper else upper_reason

    if ceiling is not None and batch >= ceiling:
        batch, predict, note = _below_ceiling(points, ceiling, budget, available_bytes, first_fit, predict)
        notes.append(note)
        limited_by = "oom-ceiling"

    ran = [b for b, _ in points if ceiling is None or b < ceiling]
    largest_ran = max(ran)
    if largest_ran not in used and batch > largest_ran:
        flat = sorted(b for b in ran if b not in used)
        notes.append(
            f"memory did not grow at batch {flat} (cached reserved memory or cudnn.benchmark?): not "
            f"extrapolating beyond the largest batch that ran ({largest_ran}, the fit said {batch})"
        )
        batch, limited_by = largest_ran, "largest-probe"

    if batch < first_fit:
        batch, limited_by = first_fit, "first-fit"
        if predict(batch) > budget:
            notes.append(
                f"the smallest batch that ran ({first_fit}) needs {predict(batch) / GIB:.2f}G, over the "
                f"{budget / GIB:.2f}G budget: using it anyway (it ran while probing)"
            )
    rounded = batch // multiple_of * multiple_of
    if rounded < max(first_fit, 1):
        raise RuntimeError(
            f"{PREFIX}no batch that is a multiple of {multiple_of} fits: the largest that fits is {batch} "
            f"(reduce multiple_of, imgsz or the model, or free GPU memory)"
        )
    predicted = int(round(predict(rounded)))
    return BatchChoice(
        batch=rounded,
        predicted_bytes=predicted,
        predicted_fraction_of_total=predicted / total_bytes,
        budget_bytes=int(budget),
        fit=kind,
        memory_fit=curve,
        used_points=tuple((b, int(round(v))) for b, v in result.used_points),
        dropped=tuple(dropped),
        outliers=result.outliers,
        oom_ceiling=ceiling,
        limited_by=limited_by,
        warnings=tuple(notes),
    )


def _chord(batch0: int, bytes0: float, bytes_per_sample: float) -> Callable[[float], float]:
    return lambda batch: bytes0 + (batch - batch0) * bytes_per_sample


def _seed_points(batches, mems, total_gib: float) -> tuple[list[tuple[int, float]], list[DroppedPoint]]:
    """The seed's point filter (GiB): in (0, total) and above the previous raw result; the others dropped."""
    xy: list[tuple[int, float]] = []
    dropped: list[DroppedPoint] = []
    for i, (b, m) in enumerate(zip(batches, mems, strict=True)):
        if m is None:
            dropped.append(DroppedPoint(batch=b, value=math.nan, reason="probe failed"))
        elif not 0 < m < total_gib:
            dropped.append(
                DroppedPoint(batch=b, value=m * GIB, reason=f"{m:.3f}G not in (0, {total_gib:.2f}G)")
            )
        elif i == 0 or mems[i - 1] is None or m > mems[i - 1]:  # compared with the previous *raw* result
            xy.append((b, m))
        else:
            dropped.append(
                DroppedPoint(
                    batch=b, value=m * GIB, reason=f"not above the previous probe ({mems[i - 1]:.3f}G)"
                )
            )
    return xy, dropped


def _seed_polyfit(xy, loglog: bool) -> tuple[np.ndarray, MemoryFit]:
    """The seed's polyfit (linear or log-log, in GiB) and its curve. Raises what numpy raises on a degenerate
    fit (the seed then falls back to the default batch)."""
    x = np.array([b for b, _ in xy], dtype=float)
    y = np.array([m for _, m in xy], dtype=float)
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", np.exceptions.RankWarning)  # one point: minimum-norm solution
        if loglog:
            if x.size and not x[x != 1].size:
                # log(1) = 0 for every point: numpy's least squares fails in LAPACK (which also prints to
                # stderr); raise what numpy raises, without the noise
                raise np.linalg.LinAlgError("SVD did not converge in Linear Least Squares")
            p = np.polyfit(np.log(x), np.log(y), deg=1)
            return p, LogLogMemoryFit(log_slope=float(p[0]), log_intercept=float(p[1]) + math.log(GIB))
        p = np.polyfit(x, y, deg=1)
        return p, AffineMemoryFit(intercept_bytes=float(p[1]) * GIB, bytes_per_sample=float(p[0]) * GIB)


def _seed_batch(p: np.ndarray, loglog: bool, target_gib: float) -> int:
    """The batch the seed reads off its fit at ``target_gib`` (``int(round())`` log-log, ``int()`` linear)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if loglog:
            return int(round(np.exp((np.log(target_gib) - p[1]) / p[0])))
        return int((target_gib - p[1]) / p[0])


def _seed_fallback(
    error: str, curve: MemoryFit | None, *, name: str, default_batch: int, used, dropped, budget_bytes: int
) -> BatchChoice:
    """The seed's answer when its arithmetic fails: the default batch, with its "error detected" warning."""
    return BatchChoice(
        batch=default_batch,
        predicted_bytes=0,
        predicted_fraction_of_total=0.0,
        budget_bytes=budget_bytes,
        fit=name,
        memory_fit=curve,
        used_points=used,
        dropped=tuple(dropped),
        oom_ceiling=None,
        limited_by="default",
        warnings=(f"error detected: {error},  using default batch-size {default_batch}.",),
    )


def _choose_seed(
    batches, peaks, *, total_bytes, available_bytes, fraction, loglog, dataset_size, max_batch, default_batch
) -> BatchChoice:
    """The seed's decision, step by step, in GiB as the seed computes it (shared/reference/ultralytics-behaviour.md §1.2 steps 7-8, §1.5).

    ``seed-linear`` (8.4.190): linear polyfit, ``int()`` truncation, ceiling at the first failure above the
    smallest fitted batch -> the probe before it, clamp to [first fit, max_batch], then the dataset clamp.
    ``seed-loglog`` (8.3.51): log-log polyfit, ``int(round())``, ceiling at the first failure anywhere
    (``results.index(None)``; a failed batch-1 probe forces batch 1), outside [1, max_batch] -> default.
    Both: any arithmetic error -> the default batch with the seed's "error detected" warning. Deliberately
    not ``torchkit.step.fit``: the seed's point filter and numpy's minimum-norm single-point fit are the point.
    """
    name = "seed-loglog" if loglog else "seed-linear"
    t, f = total_bytes / GIB, available_bytes / GIB
    mems = [None if p is None else p / GIB for p in peaks]
    xy, dropped = _seed_points(batches, mems, t)
    used = tuple((b, int(round(m * GIB))) for b, m in xy)
    if not xy and not loglog:
        raise RuntimeError(no_usable_batch_message(batches))

    notes: list[str] = []
    curve: MemoryFit | None = None
    try:
        p, curve = _seed_polyfit(xy, loglog)
        b = _seed_batch(p, loglog, f * fraction)
    except (TypeError, ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
        return _seed_fallback(
            str(exc),
            curve,
            name=name,
            default_batch=default_batch,
            used=used,
            dropped=dropped,
            budget_bytes=memory_budget_bytes(fraction, available_bytes),
        )

    limited_by: LimitedBy = "budget"
    ceiling = None
    if loglog:
        if None in mems:
            i = mems.index(None)
            ceiling = batches[i]
            if b >= batches[i]:
                b, limited_by = batches[max(i - 1, 0)], "oom-ceiling"
        if b < 1 or b > max_batch:
            notes.append(f"batch={b} outside safe range, using default batch-size {default_batch}.")
            b, limited_by = default_batch, "default"
        predicted_gib = float(np.exp(np.polyval(p, np.log(b))))
    else:
        first = xy[0][0]
        oom = next((i for i, m in enumerate(mems) if m is None and batches[i] > first), None)
        if oom is not None:
            ceiling = batches[oom]
            if b >= batches[oom]:
                b, limited_by = batches[oom - 1], "oom-ceiling"
        if b < first:
            b, limited_by = first, "first-fit"
        elif b > max_batch:
            b, limited_by = max_batch, "max-batch"
        if dataset_size > 0 and b > dataset_size:
            b, limited_by = dataset_size, "dataset-size"
        predicted_gib = float(np.polyval(p, b))
    return BatchChoice(
        batch=b,
        predicted_bytes=int(round(predicted_gib * GIB)),
        predicted_fraction_of_total=predicted_gib / t,
        budget_bytes=memory_budget_bytes(fraction, available_bytes),
        fit=name,
        memory_fit=curve,
        used_points=used,
        dropped=tuple(dropped),
        oom_ceiling=ceiling,
        limited_by=limited_by,
        warnings=tuple(notes),
    )
