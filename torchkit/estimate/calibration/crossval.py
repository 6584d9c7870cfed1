"""Observations from measured rows, and cross-validated errors of the fit.

``held_out_predictions`` refits without each group of rows (one row, one GPU type, one architecture, one
model) and predicts the rows left out: the error the model makes on a configuration it has not seen, which
is what the uncertainty attached to a profile and the benchmark's held-out figures are made of.
``cross_validate`` runs the four scenarios ``calibration/uncertainty.py`` states a profile's σ from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torchkit.estimate.calibration.data import MeasuredRow
from torchkit.estimate.calibration.fit import CalibrationFit, Observation, fit_calibration, predict
from torchkit.estimate.calibration.stacks import REFERENCE_STACK
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
                stack=r.stack,
            )
        )
    return out


def held_out_predictions(
    observations: Sequence[Observation],
    prior: TimeConstants,
    group_of: Callable[[Observation], str],
) -> dict[str, float]:
    """Row id -> predicted samples/s (in the row's own stack) from a fit without that row's whole group
    (``group_of``). A row whose stack the rest does not show has no prediction (nothing relates its stack to
    eager PyTorch then)."""
    out: dict[str, float] = {}
    for group in sorted({group_of(o) for o in observations}):
        rest = [o for o in observations if group_of(o) != group]
        left = [o for o in observations if group_of(o) == group]
        if not rest:
            continue
        result: CalibrationFit = fit_calibration(rest, prior)
        for o in left:
            if o.stack == REFERENCE_STACK or o.stack in result.stack_terms:
                out[o.id] = predict(o, result.global_constants, result.arch_constants, result.stack_terms)
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


def coverage_scale(
    errors: Sequence[float], sigmas: Sequence[float], target: float = COVERAGE_TARGET
) -> float:
    """The smallest factor ``c >= 1`` such that ``within(errors, c · sigmas) >= target``: how much a fitted σ
    (an RMS) must grow to cover ``target`` of the errors at 2σ. RMS errors under-cover when the errors are
    heavy-tailed, which cross-validated ones across models and cards are."""
    ratios = sorted(abs(e) / (COVERAGE_SIGMAS * s) for e, s in zip(errors, sigmas, strict=True))
    if not ratios:
        return 1.0
    needed = ratios[max(0, math.ceil(target * len(ratios)) - 1)]
    return max(1.0, needed)


@dataclass(frozen=True, kw_only=True)
class CrossValidation:
    """Cross-validated log errors (predicted / measured) by scenario; row id -> error."""

    loo: Mapping[str, float]
    """leave one row out (every fit row)"""
    type: Mapping[str, float]
    """leave one GPU type out, where its architecture keeps other types' rows"""
    transfer: Mapping[str, float]
    """an architecture's eager rows left out, it stays in the fit through other stacks"""
    unseen: Mapping[str, float]
    """leave one architecture out (every stack)"""


def _refit_and_predict(
    rest: Sequence[Observation],
    left: Sequence[Observation],
    prior: TimeConstants,
    start: dict[str, float] | None,
) -> dict[str, float]:
    """Row id -> log(predicted / measured) of ``left`` (in its own stack) from a fit of ``rest`` alone; rows
    whose stack ``rest`` does not show are left out (nothing relates their stack to eager PyTorch)."""
    if not rest or not left:
        return {}
    result = fit_calibration(rest, prior, start=start)
    out = {}
    for o in left:
        if o.stack == REFERENCE_STACK or o.stack in result.stack_terms:
            predicted = predict(o, result.global_constants, result.arch_constants, result.stack_terms)
            out[o.id] = math.log(predicted / o.samples_per_s)
    return out


def cross_validate(
    observations: Sequence[Observation],
    prior: TimeConstants,
    start: dict[str, float] | None = None,
    progress: Callable[[str], None] | None = None,
) -> CrossValidation:
    """The four cross-validations ``calibration/uncertainty.py`` states σ from (one refit per row, GPU type
    and architecture; ``start``: the full fit's coordinates, from which each refit converges in a few steps)."""
    say = progress or (lambda _: None)
    loo: dict[str, float] = {}
    for k, o in enumerate(observations, 1):
        say(f"leave one row out {k}/{len(observations)}")
        loo.update(_refit_and_predict([x for x in observations if x.id != o.id], [o], prior, start))
    by_type: dict[str, float] = {}
    for gpu in sorted({o.gpu.name for o in observations}):
        rest = [x for x in observations if x.gpu.name != gpu]
        left = [x for x in observations if x.gpu.name == gpu]
        if any(
            x.arch == left[0].arch for x in rest
        ):  # its architecture stays seen: a new type of a known arch
            say(f"leave GPU type {gpu} out")
            by_type.update(_refit_and_predict(rest, left, prior, start))
    transfer: dict[str, float] = {}
    unseen: dict[str, float] = {}
    for arch in sorted({o.arch for o in observations}):
        mine = [x for x in observations if x.arch == arch]
        eager = [x for x in mine if x.stack == REFERENCE_STACK]
        if eager and len(eager) < len(mine):  # seen in eager and in another stack: drop its eager rows
            say(f"architecture {arch} through other stacks only")
            transfer.update(
                _refit_and_predict([x for x in observations if x not in eager], eager, prior, start)
            )
        say(f"leave architecture {arch} out")
        unseen.update(_refit_and_predict([x for x in observations if x.arch != arch], mine, prior, start))
    return CrossValidation(loo=loo, type=by_type, transfer=transfer, unseen=unseen)
