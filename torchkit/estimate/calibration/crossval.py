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
