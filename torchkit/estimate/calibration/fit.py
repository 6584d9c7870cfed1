"""Least squares on log throughput: the roofline's efficiencies from measured rows.

The parameters are coordinates (logit for efficiencies, log otherwise) of
:class:`~torchkit.estimate.roofline.TimeConstants` fields: six global
ones (tensor-core, TF32, FP32 and bandwidth efficiency, layout-conversion factor, grouped-convolution
efficiency) and, for every
architecture with rows, a deviation of its tensor-core, bandwidth and grouped-convolution efficiency from the
global value (the architecture-level term: Hopper and Ada reach another share of their peaks than Ampere),
and for an architecture in ``SM_STREAM_PRIORS`` (Hopper) the SM side of its streaming bandwidth.
An architecture's tensor-core efficiency is a share of its *achievable* matmul rate where one is measured
(``TENSOR_CORE_CEILINGS``): the logistic coordinate maps to (0, ceiling), so no fit can price a kernel above
the best matmul the card runs.

Rows of another software stack than eager PyTorch (``calibration/stacks.py``) are priced by the same
constants and their stack's two terms: a throughput factor (log coordinate) and, for a fusing stack, the
share of the elementwise kernels' bytes it still moves (logit). Those rows thus say how GPU types compare
inside their stack, never what eager PyTorch reaches on them.

The residual of a row is ``log(predicted) − log(measured)`` samples/s over its stack's noise
(``Stack.row_log_sigma``); a Gaussian prior
adds ``(θ − prior) / σ`` per parameter (weak on the globals and the stack terms, ``ARCH_PRIOR_LOG_SIGMA`` on the
deviations), so parameters the rows do not determine stay at their priors and one card cannot drag its
architecture far.
Minimised by Levenberg-Marquardt with a forward-difference Jacobian (a few dozen parameters, tens of rows).
Pure numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from torchkit.estimate.calibration.stacks import REFERENCE_STACK, STACKS
from torchkit.estimate.roofline import KernelTable, PlacedTable, TimeConstants
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
DATA_LOG_SIGMA = STACKS[REFERENCE_STACK].row_log_sigma
"""assumed noise of one eager-PyTorch measurement in log throughput (``calibration/stacks.py`` says why)"""
GLOBAL_PRIOR_LOG_SIGMA = 1.0
"""weak prior on the global constants, in their coordinates (log or logit): about a factor e either way"""
ARCH_PRIOR_LOG_SIGMA = 0.5
"""prior spread of an architecture's deviation from the global constant, in the same coordinates (±0.5 in
logit around 0.6 is about ±20%)"""
FIT_TOLERANCE = 1e-9
"""the fit stops when a step lowers the cost by less than this share (constants move by far less than the
data's noise then)"""
STACK_PRIOR_LOG_SIGMA = 1.0
"""weak prior on a stack's terms (a factor e either way): the anchors decide them"""
STACK_PRIOR_MEMORY_TRAFFIC = 0.5
"""prior share of the elementwise bytes a fusing stack still moves (its logit 0, the middle of (0, 1))"""

TENSOR_CORE_CEILINGS: dict[str, tuple[float, str]] = {
    "ampere-ga100": (0.869, "A100-SXM best BF16 matmul 271.2 of 312 TFLOP/s (86.9%)"),
    "hopper": (0.803, "H100-SXM best BF16 matmul 794.5 of 989 TFLOP/s (80.3%; H200 the same)"),
}
"""architecture -> (the best share of the dense 16-bit peak a matmul reaches after warm-up, source): a bound on
its tensor-core efficiency. Measured by stas00/ml-engineering compute/accelerator/README.md (table of
"maximum achievable matmul FLOPS"); architectures without a measurement are bounded by the datasheet peak."""

SM_STREAM_PRIORS: dict[str, tuple[float, float, str]] = {
    "hopper": (
        0.050,
        1.0,
        "H100 SXM and H200 have the same SMs (132 at 1.98 GHz, 66.9 TFLOP/s FP32) and 3.35 vs 4.8 TB/s of DRAM, "
        "the H100 PCIe 114 SMs and 2.0 TB/s: MLPerf Training ResNet-50 (one stack, one submitter) measures the "
        "H200 1.13x the H100 SXM where a DRAM-only roofline that fits the H100 SXM/PCIe ratio (1.55) gives 1.25-1.30. "
        "Prior: the SMs can stream what the architecture's first card's DRAM delivers (H100 SXM: 3350 GB/s per "
        "66.9 TFLOP/s = 0.050 B/FLOP, 12.8 B per SM-clock), a factor e either way",
    ),
}
"""architecture -> (prior bytes per FP32 FLOP, prior log sigma, why) of its SM-side streaming limit
(``TimeConstants.sm_stream_bytes_per_flop``), fitted only for the architectures listed: those whose GPU types
in the data share their SMs but not their DRAM bandwidth, so the rows can tell the SM side from the DRAM side
(Hopper: the H200 is the H100 SXM's SMs with 1.43x its DRAM). Every other architecture streams at its DRAM
rate alone (no limit): its rows cannot separate the two, and a limit they cannot see would be the prior's."""


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
    stack: str = REFERENCE_STACK
    """the row's software stack (``calibration/stacks.py``)"""

    @functools.cached_property
    def placed(self) -> PlacedTable:
        """the row's kernel table on its GPU and layout, priced many times by the fit"""
        return PlacedTable.of(self.table, self.gpu, channels_last=self.channels_last)


@dataclass(frozen=True, kw_only=True)
class StackTerms:
    """How one software stack's throughput relates to eager PyTorch's on the same GPU."""

    throughput_factor: float = 1.0
    """its speed relative to eager PyTorch, every kernel priced alike"""
    memory_traffic: float = 1.0
    """share of the elementwise/normalisation kernels' bytes it still moves (1: no fusion)"""
    cuda_graphs: bool = False
    """no per-operator CPU dispatch bounds its step"""


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    global_constants: TimeConstants
    arch_constants: dict[str, TimeConstants]
    stack_terms: dict[str, StackTerms]
    """stack -> its terms (the reference stack has none)"""
    params: dict[str, float]
    """parameter name -> fitted coordinate (``global.x``, ``<arch>.x``: the deviation from it, or
    ``stack:<name>.x``)"""
    log_residuals: dict[str, float]
    """row id -> log(predicted / measured) throughput at the fit"""
    iterations: int


STACK_PARAMS: tuple[str, ...] = ("throughput_factor", "memory_traffic")


SM_STREAM_PARAM = "sm_stream_bytes_per_flop"


def param_names(arches: Sequence[str], stacks: Sequence[str] = ()) -> list[str]:
    names = [f"global.{p}" for p in GLOBAL_PARAMS] + [f"{a}.{p}" for a in arches for p in ARCH_PARAMS]
    names += [f"{a}.{SM_STREAM_PARAM}" for a in arches if a in SM_STREAM_PRIORS]
    for stack in stacks:
        names.append(f"stack:{stack}.throughput_factor")
        if STACKS[stack].fused:
            names.append(f"stack:{stack}.memory_traffic")
    return names


def _to_value(field: str, z: float, ceiling: float = 1.0) -> float:
    """A parameter's value from its unconstrained coordinate: logistic for fractions of a peak (they cannot
    exceed ``ceiling``, the achievable share), exponential for the rest."""
    bounded = field in BOUNDED_PARAMS or field == "memory_traffic"
    return ceiling / (1.0 + math.exp(-z)) if bounded else math.exp(z)


def _to_coordinate(field: str, value: float) -> float:
    bounded = field in BOUNDED_PARAMS or field == "memory_traffic"
    return math.log(value / (1.0 - value)) if bounded else math.log(value)


def ceiling_of(arch: str, field: str) -> float:
    """The bound on ``field`` of architecture ``arch``: its achievable matmul share for the tensor-core
    efficiency where measured, else 1 (the datasheet peak)."""
    if field == "tensor_core_efficiency" and arch in TENSOR_CORE_CEILINGS:
        return TENSOR_CORE_CEILINGS[arch][0]
    return 1.0


def constants_from(
    theta: np.ndarray, names: Sequence[str], base: TimeConstants
) -> tuple[TimeConstants, dict[str, TimeConstants], dict[str, StackTerms]]:
    """(global constants, arch -> constants, stack -> terms) from a parameter vector (an architecture's
    coordinate is the global one plus its deviation, mapped under that architecture's ceiling)."""
    values = dict(zip(names, theta, strict=True))
    glob = replace(base, **{p: _to_value(p, values[f"global.{p}"]) for p in GLOBAL_PARAMS})
    arches = sorted({n.split(".")[0] for n in names if not n.startswith(("global.", "stack:"))})
    per_arch = {
        a: replace(
            glob,
            **{
                p: _to_value(p, values[f"global.{p}"] + values[f"{a}.{p}"], ceiling_of(a, p))
                for p in ARCH_PARAMS
            },
            **(
                {SM_STREAM_PARAM: math.exp(values[f"{a}.{SM_STREAM_PARAM}"])}
                if f"{a}.{SM_STREAM_PARAM}" in values
                else {}
            ),
        )
        for a in arches
    }
    stacks = sorted({n.split(".")[0].removeprefix("stack:") for n in names if n.startswith("stack:")})
    terms = {
        st: StackTerms(
            throughput_factor=_to_value("throughput_factor", values[f"stack:{st}.throughput_factor"]),
            memory_traffic=(
                _to_value("memory_traffic", values[f"stack:{st}.memory_traffic"])
                if f"stack:{st}.memory_traffic" in values
                else 1.0
            ),
            cuda_graphs=STACKS[st].cuda_graphs,
        )
        for st in stacks
    }
    return glob, per_arch, terms


def predict(
    obs: Observation,
    glob: TimeConstants,
    per_arch: dict[str, TimeConstants],
    stacks: dict[str, StackTerms] | None = None,
) -> float:
    """Predicted samples/s of one observation (in its own stack where ``stacks`` has its terms; eager PyTorch
    otherwise)."""
    constants = per_arch.get(obs.arch, glob)
    terms = (stacks or {}).get(obs.stack)
    if terms is None:
        return obs.batch / obs.placed.time_s(constants)
    step_s = obs.placed.time_s(constants, memory_traffic=terms.memory_traffic, cuda_graphs=terms.cuda_graphs)
    return terms.throughput_factor * obs.batch / step_s


def _data_residuals(
    theta: np.ndarray, names: list[str], observations: Sequence[Observation], prior: TimeConstants
) -> np.ndarray:
    """Each observation's ``(log predicted − log measured) / its stack's noise``."""
    glob, per_arch, stacks = constants_from(theta, names, prior)
    return np.array(
        [
            (math.log(predict(o, glob, per_arch, stacks)) - math.log(o.samples_per_s))
            / STACKS[o.stack].row_log_sigma
            for o in observations
        ]
    )


def _rows_moved_by(name: str, observations: Sequence[Observation]) -> np.ndarray:
    """Indices of the observations parameter ``name`` changes: all for a global, an architecture's rows for
    its deviation, a stack's rows for its terms (the Jacobian is sparse; pricing only these is the speed-up)."""
    scope = name.split(".")[0]
    if scope == "global":
        return np.arange(len(observations))
    if scope.startswith("stack:"):
        stack = scope.removeprefix("stack:")
        return np.array([i for i, o in enumerate(observations) if o.stack == stack], dtype=int)
    return np.array([i for i, o in enumerate(observations) if o.arch == scope], dtype=int)


def fit(
    observations: Sequence[Observation],
    prior: TimeConstants,
    *,
    global_prior_log_sigma: float = GLOBAL_PRIOR_LOG_SIGMA,
    arch_prior_log_sigma: float = ARCH_PRIOR_LOG_SIGMA,
    max_iterations: int = 200,
    start: dict[str, float] | None = None,
    fixed: dict[str, float] | None = None,
) -> CalibrationFit:
    """Fit the constants to ``observations`` (see the module docstring); ``prior`` gives the prior means and
    the fields that are not fitted (launch gap, dispatch time). ``start``: coordinates to start from (another
    fit's ``params``; a cross-validation refit converges in a few steps from the full fit's), else the prior.
    ``fixed``: coordinates held at these values (``fit_calibration``'s second stage)."""
    if not observations:
        raise ValueError("a fit needs at least one observation")
    arches = sorted({o.arch for o in observations})
    stacks = sorted({o.stack for o in observations} - {REFERENCE_STACK})
    names = param_names(arches, stacks)
    mu = np.array([_prior_coordinate(n, prior) for n in names])
    sigma = np.array(
        [
            global_prior_log_sigma
            if n.startswith("global.")
            else STACK_PRIOR_LOG_SIGMA
            if n.startswith("stack:")
            else SM_STREAM_PRIORS[n.split(".")[0]][1]
            if n.endswith(f".{SM_STREAM_PARAM}")
            else arch_prior_log_sigma
            for n in names
        ]
    )
    moved = [_rows_moved_by(n, observations) for n in names]
    theta = np.array([(fixed or {}).get(n, (start or {}).get(n, m)) for n, m in zip(names, mu, strict=True)])
    free = [j for j, n in enumerate(names) if n not in (fixed or {})]

    def residuals(t: np.ndarray) -> np.ndarray:
        return np.concatenate([_data_residuals(t, names, observations, prior), (t - mu) / sigma])

    r = residuals(theta)
    cost, lam, iterations, n_data = float(r @ r), 1e-3, 0, len(observations)
    for iterations in range(1, max_iterations + 1):  # noqa: B007  (the count is reported)
        jac = np.zeros((r.size, theta.size))
        for j in free:
            step = np.zeros_like(theta)
            step[j] = 1e-6
            rows = moved[j]
            if rows.size:
                subset = [observations[i] for i in rows]
                jac[rows, j] = (_data_residuals(theta + step, names, subset, prior) - r[rows]) / 1e-6
            jac[n_data + j, j] = 1.0 / sigma[j]
        jac = jac[:, free]
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        while lam < 1e10:
            delta = np.zeros_like(theta)
            delta[free] = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-12), -jtr)
            r_new = residuals(theta + delta)
            if float(r_new @ r_new) < cost:
                theta, r, improved = theta + delta, r_new, True
                old, cost, lam = cost, float(r_new @ r_new), max(lam / 10, 1e-9)
                break
            lam *= 10
        if not improved or old - cost < FIT_TOLERANCE * max(old, 1.0):
            break
    glob, per_arch, terms = constants_from(theta, names, prior)
    residuals_by_id = {
        o.id: math.log(predict(o, glob, per_arch, terms) / o.samples_per_s) for o in observations
    }
    return CalibrationFit(
        global_constants=glob,
        arch_constants=per_arch,
        stack_terms=terms,
        params=dict(zip(names, (float(t) for t in theta), strict=True)),
        log_residuals=residuals_by_id,
        iterations=iterations,
    )


def fit_calibration(
    observations: Sequence[Observation],
    prior: TimeConstants,
    *,
    start: dict[str, float] | None = None,
    **prior_sigmas: float,
) -> CalibrationFit:
    """The calibration's fit, in two stages: the eager rows alone first (global constants and the
    architectures they show, as if no other stack existed), then every row with those held, which fits only
    the other stacks' terms and the architectures seen nowhere but in them. So the per-GPU-of-N and compiled
    rows count as ratios to the eager-calibrated anchors inside their stack; they cannot move an eager
    architecture's constants (an A100 or V100 plan is what its eager rows say). Without eager rows: one fit.
    ``prior_sigmas``: ``fit``'s prior widths, for both stages."""
    eager = [o for o in observations if o.stack == REFERENCE_STACK]
    if not eager or len(eager) == len(observations):
        return fit(observations, prior, start=start, **prior_sigmas)
    first = fit(eager, prior, start=start, **prior_sigmas)
    return fit(observations, prior, start=start, fixed=first.params, **prior_sigmas)


def _prior_coordinate(name: str, prior: TimeConstants) -> float:
    """The prior mean of parameter ``name`` in its coordinate: the prior constants for the globals, no
    deviation for an architecture, eager speed and half the elementwise bytes for a stack."""
    scope, field = name.split(".")[:2]
    if name.startswith("global."):
        return _to_coordinate(field, getattr(prior, field))
    if name.startswith("stack:"):
        return _to_coordinate(field, STACK_PRIOR_MEMORY_TRAFFIC if field == "memory_traffic" else 1.0)
    if field == SM_STREAM_PARAM:
        return math.log(SM_STREAM_PRIORS[scope][0])
    return 0.0
