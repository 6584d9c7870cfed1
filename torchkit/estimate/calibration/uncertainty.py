"""How far a predicted eager step time may be off on a GPU type, from cross-validated errors.

A profile's σ (log throughput) depends on what the calibration knows of its GPU type, one scenario each, and
each scenario's σ is the RMS of the cross-validated errors of the same situation:

* **the type has eager rows** (``pytorch-eager``, one GPU): the leave-one-row-out errors of its
  architecture's eager rows (``loo``);
* **the type has no rows, its architecture has**: that, and in quadrature the error of a GPU type left out
  whose architecture keeps other types' rows (``type``: leave one GPU type out, any stack);
* **its architecture is seen only in another stack** (per GPU of an MLPerf run, a compiled script): the error
  of predicting an architecture's eager rows from a fit that sees that architecture only in the other stacks
  (``transfer``: for every architecture with rows in both, its eager rows left out), the worst
  architecture's RMS (its rows share one bias, so pooling them with others' would understate it); a type
  without rows of its own adds the ``type`` term;
* **its architecture has no rows**: the worst architecture's RMS when each was left out whole (``unseen``).

One factor ``c ≥ 1`` then scales every σ so that 95% of all those cross-validated errors lie within 2cσ of the
σ their scenario states (``crossval.coverage_scale``): RMS under-covers heavy-tailed errors. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchkit.estimate.calibration.crossval import COVERAGE_TARGET, CrossValidation, coverage_scale, rms
from torchkit.estimate.calibration.fit import Observation
from torchkit.estimate.calibration.stacks import REFERENCE_STACK, STACKS

DATA_FLOOR_LOG_SIGMA = STACKS[REFERENCE_STACK].row_log_sigma
"""no σ is stated below one eager measurement's own noise"""


@dataclass(frozen=True, kw_only=True)
class Sigmas:
    """The stated σ of every scenario, after the coverage factor."""

    arch_eager: dict[str, float]
    """architecture with eager rows -> σ of a type with rows"""
    transfer: float
    """σ of an architecture seen only in other stacks"""
    type: float
    """the extra term of a type without rows of its own (in quadrature)"""
    unseen: float
    """σ of an architecture without rows"""
    coverage_factor: float
    """the factor ``c`` all of them were scaled by"""
    raw: dict[str, float]
    """the scenario RMS values before scaling, for the record (``arch:<name>``, ``transfer``, ``type``, ``unseen``)"""

    def arch(self, arch: str) -> float:
        """σ of a type of ``arch`` with the rows that define its scenario: eager rows where the architecture
        has them, else rows of another stack; the unseen σ for an architecture without rows."""
        if arch in self.arch_eager:
            return self.arch_eager[arch]
        return self.transfer

    def for_gpu(self, arch: str, *, gpu_eager_rows: bool, gpu_rows: bool, arch_rows: bool) -> float:
        """σ of a GPU type of architecture ``arch`` (module docstring): its architecture's σ where the type
        has the rows that define it (eager rows in an architecture that has them, any rows in one seen only
        through other stacks), that and the type term in quadrature where not."""
        if not arch_rows:
            return self.unseen
        own = gpu_eager_rows if arch in self.arch_eager else gpu_rows
        return self.arch(arch) if own else math.hypot(self.arch(arch), self.type)


def _worst_arch_rms(errors: Mapping[str, float], arch_of: Mapping[str, str]) -> float:
    arches = {arch_of[i] for i in errors}
    return max((rms([e for i, e in errors.items() if arch_of[i] == a]) for a in arches), default=0.0)


def stated_sigmas(cv: CrossValidation, fit_obs: Sequence[Observation]) -> Sigmas:
    """Every scenario's σ from the cross-validated errors, scaled for 95% coverage at 2σ."""
    arch_of = {o.id: o.arch for o in fit_obs}
    eager = {o.id for o in fit_obs if o.stack == REFERENCE_STACK}
    raw: dict[str, float] = {}
    for arch in sorted({o.arch for o in fit_obs if o.id in eager}):
        errors = [e for i, e in cv.loo.items() if i in eager and arch_of[i] == arch]
        raw[f"arch:{arch}"] = max(rms(errors), DATA_FLOOR_LOG_SIGMA)
    raw["transfer"] = max(_worst_arch_rms(cv.transfer, arch_of), DATA_FLOOR_LOG_SIGMA)
    raw["type"] = max(rms(list(cv.type.values())), DATA_FLOOR_LOG_SIGMA)
    raw["unseen"] = max(_worst_arch_rms(cv.unseen, arch_of), raw["transfer"])
    # every cross-validated error against the σ its scenario states before scaling
    errors, sigmas = [], []
    for i, e in cv.loo.items():
        if i in eager:
            errors.append(e)
            sigmas.append(raw[f"arch:{arch_of[i]}"])
    for i, e in cv.type.items():
        base = raw.get(f"arch:{arch_of[i]}", raw["transfer"])
        errors.append(e)
        sigmas.append(math.hypot(base, raw["type"]))
    for e in cv.transfer.values():
        errors.append(e)
        sigmas.append(raw["transfer"])
    for e in cv.unseen.values():
        errors.append(e)
        sigmas.append(raw["unseen"])
    c = coverage_scale(errors, sigmas, COVERAGE_TARGET)
    return Sigmas(
        arch_eager={k.removeprefix("arch:"): c * v for k, v in raw.items() if k.startswith("arch:")},
        transfer=c * raw["transfer"],
        type=c * raw["type"],
        unseen=c * raw["unseen"],
        coverage_factor=c,
        raw=raw,
    )
