"""Device profiles: how a training step's memory and time grow with the per-device batch on one GPU type.

A profile holds the points it was made from (measured or estimated), the fitted curves, and the range in
which the memory curve is trusted: at or below the first batch that ran out of memory. Pure numpy; the
fits are ``torchkit.step.fit``'s (one home for them). A profile is a record of plan.json and of the profile
cache, declared here once (``planner.codec`` reads and writes it in field order); whether its numbers are
physically possible is ``planner.profiles.checks``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

from planner.codec import OMIT_DEFAULT, Meta
from torchkit.step.fit import AffineTimeFit, MemoryFit, fit_memory, fit_time, max_batch_within
from torchkit.step.options import AmpMode

ProfileMethod = Literal[
    "measure", "estimate", "job"
]  # job: measured inside a running job (planner.profiles.measured)

#: largest per-rank batch a plan ever proposes, as Ultralytics' AutoBatch clamp (autobatch.py: 1024)
#: raised for small models on large cards; a curve extrapolated beyond this is not trusted
MAX_PLANNED_BATCH = 65536
#: most points a profile holds (the estimator uses 3, a measurement about 10): a bound for hostile files
MAX_PROFILE_POINTS = 1024
#: most notes a profile holds: far above what profiling writes
MAX_PROFILE_NOTES = 1024

Points = Annotated[tuple[tuple[int, int], ...], Meta(min_length=1, max_length=MAX_PROFILE_POINTS)]
TimePoints = Annotated[tuple[tuple[int, float], ...], Meta(min_length=1, max_length=MAX_PROFILE_POINTS)]
Note = Annotated[str, Meta(description="be a string")]


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """Memory and step-time curves of one (workload, input, amp, optimizer, GPU type)."""

    gpu: str
    """catalog type name (or the NVML name of a GPU not in the catalog)"""
    method: ProfileMethod
    """how the points were obtained"""
    amp: AmpMode = "off"
    """AMP mode the profile was made with (fp16, bf16 or off)"""
    memory_points: Points
    """(batch, device bytes): what the device needs for a training step at that batch"""
    memory_fit: MemoryFit
    time_points: TimePoints
    """(batch, seconds of one training step)"""
    time_fit: AffineTimeFit
    oom_batch: int | None = None
    """smallest probed batch that ran out of memory; the curve is not trusted at or above it"""
    notes: Annotated[tuple[Note, ...], Meta(max_length=MAX_PROFILE_NOTES)] = ()
    """dropped or off-the-line points and other remarks, shown to the user as warnings"""
    min_memory_bytes: int = 0
    """no batch needs less than this: the optimizer step's peak, which does not shrink with the batch (an
    affine fit through larger probes can fall below it at small batches)"""
    breakdown_bytes: dict[str, int] | None = None
    """memory by category (parameters, gradients, optimizer_state, activations, ...) at the largest probe,
    where the method gives one (the estimator does)"""
    time_log_sigma: float = 0.0
    """one-sigma error of the log step time: for an estimate, the calibrated time model's error on this GPU
    type's architecture (``torchkit.estimate.time_model``); 0 for a measurement"""
    time_model: str = ""
    """where the step times come from: the calibration and the basis of ``time_log_sigma`` for an
    estimate, ``measured`` for a measurement"""
    backward_share: float | None = field(default=None, metadata=OMIT_DEFAULT)
    """share of a step's forward + backward time that is backward, where the method tells the passes apart
    (the estimator prices each pass's kernels: ``torchkit.estimate.estimator.backward_share``; a measurement
    times them: ``torchkit.step.measure.PhaseTimer``); None: not known"""

    def __post_init__(self) -> None:
        if self.backward_share is not None and not 0.0 < self.backward_share < 1.0:
            raise ValueError(f"backward_share must be in (0, 1), got {self.backward_share!r}")

    @classmethod
    def from_points(
        cls,
        *,
        gpu: str,
        method: ProfileMethod,
        amp: str,
        memory_points: Sequence[tuple[int, int]],
        time_points: Sequence[tuple[int, float]],
        oom_batch: int | None = None,
        fit: Literal["affine", "loglog"] = "affine",
        notes: Sequence[str] = (),
        breakdown_bytes: dict[str, int] | None = None,
        min_memory_bytes: int = 0,
        time_log_sigma: float = 0.0,
        time_model: str = "",
        backward_share: float | None = None,
    ) -> DeviceProfile:
        """Fit the curves; dropped and outlying points become notes (never silently used or lost)."""
        memory = fit_memory([(int(b), float(v)) for b, v in memory_points], kind=fit)
        time = fit_time([(int(b), float(t)) for b, t in time_points])
        remarks = list(notes)
        for point in memory.dropped:
            remarks.append(f"{gpu}: memory point at batch {point.batch} dropped: {point.reason}")
        for point in memory.outliers:
            remarks.append(f"{gpu}: memory point at batch {point.batch} is {point.reason}")
        for point in time.dropped:
            remarks.append(f"{gpu}: time point at batch {point.batch} dropped: {point.reason}")
        return cls(
            gpu=gpu,
            method=method,
            amp=amp,
            memory_points=tuple((int(b), int(v)) for b, v in memory_points),
            time_points=tuple((int(b), float(t)) for b, t in time_points),
            memory_fit=memory.fit,
            time_fit=time.fit,
            oom_batch=oom_batch,
            notes=tuple(remarks),
            breakdown_bytes=dict(breakdown_bytes) if breakdown_bytes else None,
            min_memory_bytes=int(min_memory_bytes),
            time_log_sigma=float(time_log_sigma),
            time_model=str(time_model),
            backward_share=None if backward_share is None else float(backward_share),
        )

    def memory_bytes(self, batch: int) -> int:
        """Predicted device bytes of a training step at ``batch``: the fit, but never below the floor."""
        return max(int(round(self.memory_fit.predict_bytes(batch))), self.min_memory_bytes)

    def step_time_s(self, batch: int) -> float:
        """Predicted seconds of one training step at ``batch``."""
        return float(self.time_fit.predict_s(batch))

    def max_batch(self, budget_bytes: int, multiple_of: int = 1) -> int:
        """Largest batch (a multiple of ``multiple_of``) whose predicted memory fits ``budget_bytes``.

        Never at or above ``oom_batch`` (a probe that ran out of memory beats any fit), never above
        ``MAX_PLANNED_BATCH``; 0 when not even ``multiple_of`` samples fit.
        """
        if self.min_memory_bytes > budget_bytes:
            return 0
        upper = MAX_PLANNED_BATCH if self.oom_batch is None else min(MAX_PLANNED_BATCH, self.oom_batch - 1)
        return max_batch_within(self.memory_fit, budget_bytes, multiple_of=multiple_of, upper=upper)
