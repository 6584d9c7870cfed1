"""Observations from measured rows, and cross-validated errors of the fit.

``held_out_predictions`` refits without each group of rows (one row, one GPU type, one architecture, one
model) and predicts the rows left out: the error the model makes on a configuration it has not seen, which
is what the uncertainty attached to a profile and the benchmark's held-out figures are made of.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torchkit.estimate.calibration.data import MeasuredRow
from torchkit.estimate.calibration.fit import FitResult, Observation, fit, predict
from torchkit.estimate.calibration.tables import table_key
from torchkit.estimate.roofline import KernelTable, TimeConstants
from torchkit.estimate.time_model import architecture
from torchkit.hardware.catalog import GpuCatalog


def observations_from_rows(
    rows: Sequence[MeasuredRow], tables: dict[str, KernelTable], catalog: GpuCatalog
) -> list[Observation]:
    out = []
    for r in rows:
        gpu = catalog.get(r.gpu)
        out.append(
            Observation(
                id=r.id,
                table=tables[table_key(r.model, r.batch, r.amp)],
                gpu=gpu,
                arch=architecture(gpu),
                batch=r.batch,
                channels_last=r.channels_last,
                samples_per_s=r.samples_per_s,
            )
        )
    return out


def held_out_predictions(
    observations: Sequence[Observation],
    prior: TimeConstants,
    group_of: Callable[[Observation], str],
) -> dict[str, float]:
    """Row id -> predicted samples/s from a fit without that row's whole group (``group_of``)."""
    out: dict[str, float] = {}
    for group in sorted({group_of(o) for o in observations}):
        rest = [o for o in observations if group_of(o) != group]
        left = [o for o in observations if group_of(o) == group]
        if not rest:
            continue
        result: FitResult = fit(rest, prior)
        for o in left:
            out[o.id] = predict(o, result.global_constants, result.arch_constants)
    return out


def log_errors(observations: Sequence[Observation], predictions: dict[str, float]) -> dict[str, float]:
    """Row id -> log(predicted / measured) for the rows with a prediction."""
    return {o.id: math.log(predictions[o.id] / o.samples_per_s) for o in observations if o.id in predictions}


def rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


COVERAGE_TARGET = 0.95
"""share of cross-validated errors a stated σ must cover within ``COVERAGE_SIGMAS`` (a Gaussian's 2σ)"""
COVERAGE_SIGMAS = 2.0


def within(errors: Sequence[float], sigmas: Sequence[float], k: float = COVERAGE_SIGMAS) -> float:
    """Share of ``errors`` with ``|error| <= k · sigma`` (their own sigma each)."""
    pairs = list(zip(errors, sigmas, strict=True))
    return sum(abs(e) <= k * s for e, s in pairs) / len(pairs) if pairs else 1.0


def coverage_scale(errors: Sequence[float], sigmas: Sequence[float], target: float = COVERAGE_TARGET) -> float:
    """The smallest factor ``c >= 1`` such that ``within(errors, c · sigmas) >= target``: how much a fitted σ
    (an RMS) must grow to cover ``target`` of the errors at 2σ. RMS errors under-cover when the errors are
    heavy-tailed, which cross-validated ones across models and cards are."""
    ratios = sorted(abs(e) / (COVERAGE_SIGMAS * s) for e, s in zip(errors, sigmas, strict=True))
    if not ratios:
        return 1.0
    needed = ratios[max(0, math.ceil(target * len(ratios)) - 1)]
    return max(1.0, needed)
