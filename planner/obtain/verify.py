"""What the profile cache trusts, checked on request: a cached profile against a fresh estimate of the same
job on the same GPU type (``--verify-cache``).

The cache's own checks (``planner.profiles.cache``) prove an entry was not damaged by accident and is
physically possible on its GPU; they cannot tell a right profile from a plausible wrong one: a forged entry
with a valid checksum whose step time is 5× off passes all of them. Only profiling again does. An estimate
takes a second or so for most models, anywhere (no GPU), so ``--verify-cache`` makes one for every profile
read from the cache and compares, at the largest batch the cached profile was probed at:

- an **estimate** entry is the same computation under the same key (job, GPU, torch, estimator and
  calibration identity are all in it), so it must agree within ``REDERIVED_TOLERANCE`` (float noise);
- a **measured** entry (``measure``, or ``job``: measured in a running job) may differ from an estimate by
  the estimator's own error: its step time within the estimator's stated range for that GPU type,
  ``exp(±COVERAGE_SIGMAS · time_log_sigma)`` (README, "How it decides": 95% of cross-validated errors lie
  within 2σ; ±62% for a T4, ±21% for an A100), and its memory within ``MEASURED_MEMORY_FACTOR``.

An entry outside its range is *suspicious*: it is refused (a warning with both figures), and the profile is
made again, as if the cache had none; an entry inside it is used, and the plan says it was checked.

Known limitations: an entry wrong by less than its range passes (a measured T4 entry 1.5× slow is within
the T4's ±62%); the estimate is no check of what it cannot model (a custom CUDA kernel's speed); and a
measured entry is compared with an estimate, not measured again, so a GPU that really is far from its
estimate (thermal throttling, a shared card) has its true measurement refused as suspicious and measured
again on every verified run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.profiles.profile import DeviceProfile

#: how far a re-derived estimate may be from the cached estimate it repeats: the same computation, so only
#: float noise (fits of the same three points); 2% leaves room for a torch patch release's kernels counted
#: the same under another summation order
REDERIVED_TOLERANCE = 0.02
#: the width of the estimator's stated step-time range in its own sigmas: README ("Every estimated profile
#: carries the model's uncertainty ... calibrated for coverage (95% of cross-validated errors within 2σ)")
COVERAGE_SIGMAS = 2.0
#: the smallest log-sigma a range is built from (an estimate without one: the calibrated A10's 0.076, rounded)
MIN_LOG_SIGMA = 0.08
#: how far a measured memory curve may be from the estimate's, either way. No measured-vs-estimated memory
#: range is stated yet (bench/README.md §6: gpu_check has not run on a GPU; the CUDA overheads are documented
#: priors), so this is wide: the largest estimator miss recorded (README: attention dropout, 2.7× too large,
#: since modelled as CUDA runs it) would have passed within 3×, and a 5× forgery does not
MEASURED_MEMORY_FACTOR = 3.0


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A cached profile against a fresh estimate of the same job and GPU type, at one batch each."""

    time_batch: int
    cached_step_time_s: float
    fresh_step_time_s: float
    memory_batch: int
    cached_memory_bytes: float
    fresh_memory_bytes: float
    allowed_time_factor: float
    """largest ratio, either way, of the cached step time to the fresh one"""
    allowed_memory_factor: float

    @property
    def time_factor(self) -> float:
        return _factor(self.cached_step_time_s, self.fresh_step_time_s)

    @property
    def memory_factor(self) -> float:
        return _factor(self.cached_memory_bytes, self.fresh_memory_bytes)

    @property
    def agrees(self) -> bool:
        return (
            self.time_factor <= self.allowed_time_factor and self.memory_factor <= self.allowed_memory_factor
        )

    def describe(self) -> str:
        """Both figures of both quantities, and the range each was held to."""
        return (
            f"step time at batch {self.time_batch} {self.cached_step_time_s * 1000:.4g} ms cached vs "
            f"{self.fresh_step_time_s * 1000:.4g} ms estimated now (×{self.time_factor:.2f}, allowed "
            f"×{self.allowed_time_factor:.2f}); memory at batch {self.memory_batch} "
            f"{self.cached_memory_bytes / 2**20:.4g} MiB cached vs {self.fresh_memory_bytes / 2**20:.4g} MiB "
            f"(×{self.memory_factor:.2f}, allowed ×{self.allowed_memory_factor:.2f})"
        )


def _factor(a: float, b: float) -> float:
    """How many times the larger of two positive figures is the smaller (1.0: equal)."""
    if not (a > 0 and b > 0):
        return math.inf
    return max(a, b) / min(a, b)


def compare_with_estimate(cached: DeviceProfile, fresh: DeviceProfile) -> Comparison:
    """``cached`` against ``fresh`` (an estimate of the same job and GPU type), at the largest batch ``cached``
    was probed at, each quantity held to the range of the module docstring."""
    if cached.method == "estimate":
        time_factor = memory_factor = 1.0 + REDERIVED_TOLERANCE
    else:
        time_factor = math.exp(COVERAGE_SIGMAS * max(fresh.time_log_sigma or 0.0, MIN_LOG_SIGMA))
        memory_factor = MEASURED_MEMORY_FACTOR
    time_batch = max(b for b, _ in cached.time_points)
    memory_batch = max(b for b, _ in cached.memory_points)
    return Comparison(
        time_batch=time_batch,
        cached_step_time_s=cached.step_time_s(time_batch),
        fresh_step_time_s=fresh.step_time_s(time_batch),
        memory_batch=memory_batch,
        cached_memory_bytes=cached.memory_bytes(memory_batch),
        fresh_memory_bytes=fresh.memory_bytes(memory_batch),
        allowed_time_factor=time_factor,
        allowed_memory_factor=memory_factor,
    )
