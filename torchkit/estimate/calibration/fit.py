"""Least squares on log throughput: the roofline's efficiencies from measured rows.

The parameters are coordinates (logit for efficiencies, log otherwise) of
:class:`~torchkit.estimate.roofline.TimeConstants` fields: six global
ones (tensor-core, TF32, FP32 and bandwidth efficiency, layout-conversion factor, grouped-convolution
efficiency) and, for every
architecture with rows, a deviation of its tensor-core, bandwidth and grouped-convolution efficiency from the
global value. The
residual of a row is ``log(predicted) − log(measured)`` samples/s over ``DATA_LOG_SIGMA``; a Gaussian prior
adds ``(θ − prior) / σ`` per parameter (weak on the globals, ``ARCH_PRIOR_LOG_SIGMA`` on the deviations), so
parameters the rows do not determine stay at their priors and one card cannot drag its architecture far.
Minimised by Levenberg-Marquardt with a forward-difference Jacobian (a dozen parameters, tens of rows:
milliseconds per iteration). Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from torchkit.estimate.roofline import KernelTable, TimeConstants, table_time_s
from torchkit.hardware.catalog import GpuSpec

GLOBAL_PARAMS: tuple[str, ...] = (
    "tensor_core_efficiency",
    "tf32_efficiency",
    "fp32_efficiency",
    "bandwidth_efficiency",
    "layout_conversion_factor",
    "grouped_conv_efficiency",
)
ARCH_PARAMS: tuple[str, ...] = ("tensor_core_efficiency", "bandwidth_efficiency", "grouped_conv_efficiency")
"""fields that get a per-architecture deviation: the ones the evidence shows differ by card class (HBM vs
GDDR bandwidth reached, tensor-core generation, cuDNN's grouped kernels per generation) *and* that every
calibrated architecture's rows determine (each has dense and grouped models). The layout factor stays
global: the A100 rows have no NCHW/NHWC pair at one precision, so a GA100 layout factor would only trade
off against its TF32 efficiency. Chosen by leave-one-architecture-out error on the fit rows
(bench/README.md, section 8, has the candidates' figures)."""
BOUNDED_PARAMS: frozenset[str] = frozenset(
    {"tensor_core_efficiency", "tf32_efficiency", "fp32_efficiency", "bandwidth_efficiency"}
)
"""fractions of a datasheet peak: fitted in logit coordinates, so they stay in (0, 1) (an unbounded fit let
one constant exceed its peak to make up for another's error); the others in log coordinates"""
DATA_LOG_SIGMA = 0.05
"""assumed noise of one measurement in log throughput: repeats of one configuration in the data differ by
~4% (DeepLearningExamples V100 16 GB vs 32 GB AMP 1200 vs 1156 img/s; sandeepkumar-skb vs DLE V100 AMP
NHWC 1154 vs 1200)"""
GLOBAL_PRIOR_LOG_SIGMA = 1.0
"""weak prior on the global constants, in their coordinates (log or logit): about a factor e either way"""
ARCH_PRIOR_LOG_SIGMA = 0.5
"""prior spread of an architecture's deviation from the global constant, in the same coordinates (±0.5 in
logit around 0.6 is about ±20%)"""


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One measured row, ready to price."""

    id: str
    table: KernelTable
    gpu: GpuSpec
    arch: str
    batch: int
    channels_last: bool
    samples_per_s: float


@dataclass(frozen=True, kw_only=True)
class FitResult:
    global_constants: TimeConstants
    arch_constants: dict[str, TimeConstants]
    params: dict[str, float]
    """parameter name -> fitted coordinate (``global.x``, or ``<arch>.x``: the deviation from it)"""
    log_residuals: dict[str, float]
    """row id -> log(predicted / measured) throughput at the fit"""
    iterations: int


def param_names(arches: Sequence[str]) -> list[str]:
    return [f"global.{p}" for p in GLOBAL_PARAMS] + [f"{a}.{p}" for a in arches for p in ARCH_PARAMS]


def _to_value(field: str, z: float) -> float:
    """A parameter's value from its unconstrained coordinate: logistic for fractions of a peak (they cannot
    exceed 1), exponential for the rest."""
    return 1.0 / (1.0 + math.exp(-z)) if field in BOUNDED_PARAMS else math.exp(z)


def _to_coordinate(field: str, value: float) -> float:
    return math.log(value / (1.0 - value)) if field in BOUNDED_PARAMS else math.log(value)


def constants_from(theta: np.ndarray, names: Sequence[str], base: TimeConstants) -> tuple[TimeConstants, dict]:
    """(global constants, arch -> constants) from a parameter vector (an architecture's coordinate is the
    global one plus its deviation)."""
    values = dict(zip(names, theta, strict=True))
    glob = replace(base, **{p: _to_value(p, values[f"global.{p}"]) for p in GLOBAL_PARAMS})
    arches = sorted({n.split(".")[0] for n in names if not n.startswith("global.")})
    per_arch = {
        a: replace(
            glob, **{p: _to_value(p, values[f"global.{p}"] + values[f"{a}.{p}"]) for p in ARCH_PARAMS}
        )
        for a in arches
    }
    return glob, per_arch


def predict(obs: Observation, glob: TimeConstants, per_arch: dict[str, TimeConstants]) -> float:
    """Predicted samples/s of one observation."""
    constants = per_arch.get(obs.arch, glob)
    return obs.batch / table_time_s(obs.table, obs.gpu, constants, channels_last=obs.channels_last)


def _residuals(
    theta: np.ndarray, names: list[str], observations: Sequence[Observation], prior: TimeConstants, mu: np.ndarray,
    sigma: np.ndarray,
) -> np.ndarray:
    glob, per_arch = constants_from(theta, names, prior)
    data = [(math.log(predict(o, glob, per_arch)) - math.log(o.samples_per_s)) / DATA_LOG_SIGMA for o in observations]
    return np.concatenate([np.asarray(data), (theta - mu) / sigma])


def fit(
    observations: Sequence[Observation],
    prior: TimeConstants,
    *,
    global_prior_log_sigma: float = GLOBAL_PRIOR_LOG_SIGMA,
    arch_prior_log_sigma: float = ARCH_PRIOR_LOG_SIGMA,
    max_iterations: int = 200,
) -> FitResult:
    """Fit the constants to ``observations`` (see the module docstring); ``prior`` gives the starting point,
    the prior means and the fields that are not fitted (launch gap, dispatch time)."""
    if not observations:
        raise ValueError("a fit needs at least one observation")
    arches = sorted({o.arch for o in observations})
    names = param_names(arches)
    mu = np.array(
        [_to_coordinate(n.split(".")[1], getattr(prior, n.split(".")[1])) if n.startswith("global.") else 0.0 for n in names]
    )
    sigma = np.array([global_prior_log_sigma if n.startswith("global.") else arch_prior_log_sigma for n in names])
    theta = mu.copy()
    r = _residuals(theta, names, observations, prior, mu, sigma)
    cost, lam, iterations = float(r @ r), 1e-3, 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007  (the count is reported)
        jac = np.empty((r.size, theta.size))
        for j in range(theta.size):
            step = np.zeros_like(theta)
            step[j] = 1e-6
            jac[:, j] = (_residuals(theta + step, names, observations, prior, mu, sigma) - r) / 1e-6
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e10:
            delta = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
            r_new = _residuals(theta + delta, names, observations, prior, mu, sigma)
            if float(r_new @ r_new) < cost:
                theta, r, improved = theta + delta, r_new, True
                old, cost, lam = cost, float(r_new @ r_new), max(lam / 10, 1e-9)
                break
            lam *= 10
        if not improved or old - cost < 1e-12 * max(old, 1.0):
            break
    glob, per_arch = constants_from(theta, names, prior)
    residuals = {o.id: math.log(predict(o, glob, per_arch) / o.samples_per_s) for o in observations}
    return FitResult(
        global_constants=glob,
        arch_constants=per_arch,
        params=dict(zip(names, (float(t) for t in theta), strict=True)),
        log_residuals=residuals,
        iterations=iterations,
    )
