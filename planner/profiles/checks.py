"""Is a device profile physically possible? Checked wherever a profile comes from a file (plan.json, the
profile cache), because a checksum only proves that a file was not damaged by accident, never that its
numbers make sense: anyone can recompute a plain hash. The profile's shape (its fields and their types) is
its declaration's (``planner.profiles.profile``, read by ``planner.codec``); these are the rules between its
numbers.

A training step's memory and time are positive and finite, memory grows with the batch (weights, gradients
and optimizer state are fixed; activations grow per sample), and a batch that ran out of memory lies above
a batch that did not. A profile breaking one of these would give nonsense caps: a negative
``bytes_per_sample`` made an A100's cap 65,536 and ``oom_batch: 0`` excluded every A100.

Against the GPU it is for (``check_against_gpu``, where the GPU type is known): a step is no faster than
writing its activations once at the card's memory bandwidth (the activations a step keeps for the backward
pass are written in the forward; ``s_per_sample 1e-15`` is refused), and no memory point lies below the
weights, gradients and optimizer state the profile's own breakdown lists.

Known limitations: a profile that is physically possible but measured on another GPU is not detected here;
the cache catches that by recomputing the entry's key from the job and GPU it records. A slower GPU's curve
filed under a faster one's name passes every physical bound; only profiling again tells them apart.
"""

from __future__ import annotations

import math

from planner.codec import encode
from planner.errors import ConfigError
from planner.profiles.profile import DeviceProfile
from torchkit.hardware.catalog import GpuSpec
from torchkit.step.fit import fit_memory, fit_time

#: more device memory than any GPU has (H200: 141 GB) by far: 1 PiB
MAX_DEVICE_BYTES = 2**50
#: no training step takes a day
MAX_STEP_SECONDS = 86_400.0
#: margin of the bandwidth bound: a step may be this many times faster than writing its activations once at
#: peak bandwidth before it is refused (the memory curve's per-sample bytes include allocator overheads, not
#: all of them written). Every estimate in the caches of the test machines was 3.4× slower or more than the bound.
BANDWIDTH_BOUND_MARGIN = 2.0
#: how far a stored fit may be from the fit of its points (float noise of ``numpy.polyfit`` is ~1e-12)
FIT_AGREEMENT = 1e-3
#: breakdown categories every step holds whatever the batch
FIXED_CATEGORIES = ("parameters", "gradients", "optimizer_state")


def check_profile(profile: DeviceProfile, where: str) -> None:
    """The physics of a profile (see the module docstring); ``where`` names it in messages.

    Raises:
        ConfigError: the first rule broken, naming ``where`` and the field.
    """
    if not profile.gpu.strip():
        raise ConfigError(f"{where}.gpu is empty")
    for batch, num_bytes in profile.memory_points:
        _check_point(where, "memory_points", batch, num_bytes, MAX_DEVICE_BYTES, "bytes")
    for batch, seconds in profile.time_points:
        _check_point(where, "time_points", batch, seconds, MAX_STEP_SECONDS, "seconds")
    _check_memory_fit(profile, where)
    _check_fits_are_their_points(profile, where)
    fit = profile.time_fit
    if (
        not (_finite(fit.intercept_s) and _finite(fit.s_per_sample))
        or fit.intercept_s < 0
        or fit.s_per_sample < 0
    ):
        raise ConfigError(
            f"{where}.time_fit must have finite intercept_s >= 0 and s_per_sample >= 0, got {encode(fit)}"
        )
    if not profile.step_time_s(1) > 0:
        raise ConfigError(
            f"{where}.time_fit predicts {profile.step_time_s(1)} s for one sample; a step takes time"
        )
    if not 0 <= profile.min_memory_bytes <= MAX_DEVICE_BYTES:
        raise ConfigError(
            f"{where}.min_memory_bytes {profile.min_memory_bytes} is not in 0..{MAX_DEVICE_BYTES}"
        )
    if profile.oom_batch is not None:
        smallest = min(b for b, _ in profile.memory_points)
        if profile.oom_batch <= smallest:
            raise ConfigError(
                f"{where}.oom_batch {profile.oom_batch} is not above the smallest probed batch {smallest} (a batch "
                "that ran out of memory lies above one that fitted)"
            )
    for name, num_bytes in (profile.breakdown_bytes or {}).items():
        if not 0 <= num_bytes <= MAX_DEVICE_BYTES:
            raise ConfigError(f"{where}.breakdown_bytes.{name} {num_bytes} is not in 0..{MAX_DEVICE_BYTES}")


def _check_memory_fit(profile: DeviceProfile, where: str) -> None:
    fit = profile.memory_fit
    values = list(encode(fit).values())[1:]
    if not all(_finite(v) for v in values):
        raise ConfigError(f"{where}.memory_fit must hold finite numbers, got {encode(fit)}")
    if fit.kind == "affine":
        grows = fit.bytes_per_sample > 0 and fit.intercept_bytes >= 0
    else:
        grows = fit.log_slope > 0 and abs(fit.log_intercept) < math.log(MAX_DEVICE_BYTES)
    if not grows:
        raise ConfigError(
            f"{where}.memory_fit {encode(fit)} does not grow with the batch from a non-negative base "
            "(activations make every extra sample cost memory)"
        )
    if not 0 < fit.predict_bytes(1) <= MAX_DEVICE_BYTES:
        raise ConfigError(f"{where}.memory_fit predicts {fit.predict_bytes(1):.4g} bytes at batch 1")


def _check_fits_are_their_points(profile: DeviceProfile, where: str) -> None:
    """A profile's fits are what its points fit to (``DeviceProfile.fitted``, ``torchkit.step.fit``): compared at
    its largest probed batch, within :data:`FIT_AGREEMENT`. An entry whose fit contradicts its own points
    (``bytes_per_sample: 1.0`` beside points of 7 GB at batch 128: an A100 cap of 65,536) is refused. A time
    fit a running job measured (method ``job``) is pooled with the plan's prior (``planner.runtime``), so only
    its memory is compared."""
    try:
        memory = fit_memory(profile.memory_points, kind=profile.memory_fit.kind).fit
        time = fit_time(profile.time_points).fit
    except ValueError as exc:
        raise ConfigError(f"{where}: its points fit no curve ({exc})") from None
    largest = max(b for b, _ in profile.memory_points)
    pairs = [
        ("memory_fit", memory.predict_bytes(largest), profile.memory_fit.predict_bytes(largest), "bytes")
    ]
    if profile.method != "job":
        largest_time = max(b for b, _ in profile.time_points)
        pairs.append(("time_fit", time.predict_s(largest_time), profile.step_time_s(largest_time), "s"))
    for name, from_points, stored, unit in pairs:
        if not math.isclose(stored, from_points, rel_tol=FIT_AGREEMENT):
            raise ConfigError(
                f"{where}.{name} predicts {stored:.4g} {unit} at its largest probed batch where its own points fit "
                f"{from_points:.4g} {unit}: the fit is not the fit of its points"
            )


def _check_point(where: str, name: str, batch: int, value: float, limit: float, unit: str) -> None:
    if batch < 1 or not _finite(value) or not 0 < value <= limit:
        raise ConfigError(
            f"{where}.{name} has the point [{batch}, {value}]: batches must be >= 1 and values positive, finite "
            f"and at most {limit:g} {unit}"
        )


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def check_against_gpu(profile: DeviceProfile, gpu: GpuSpec, where: str) -> None:
    """The bounds the GPU's own figures put on a profile (see the module docstring).

    Raises:
        ConfigError: a step faster than the card's memory bandwidth allows, or memory below the fixed part.
    """
    batches = sorted(b for b, _ in profile.memory_points)
    low, high = batches[0], batches[-1]
    if high > low:
        per_sample_bytes = (
            profile.memory_fit.predict_bytes(high) - profile.memory_fit.predict_bytes(low)
        ) / (high - low)
        write_once_s = per_sample_bytes * high / gpu.memory_bandwidth_bytes_per_s
        if profile.step_time_s(high) * BANDWIDTH_BOUND_MARGIN < write_once_s:
            raise ConfigError(
                f"{where}: a step of batch {high} in {profile.step_time_s(high):.3g} s is faster than a {gpu.name} "
                f"can write its {per_sample_bytes * high / 2**30:.3g} GiB of activations once "
                f"({write_once_s:.3g} s at {gpu.memory_bandwidth_bytes_per_s / 1e9:g} GB/s)"
            )
    fixed = sum((profile.breakdown_bytes or {}).get(name, 0) for name in FIXED_CATEGORIES)
    for batch, num_bytes in profile.memory_points:
        if num_bytes < fixed:
            raise ConfigError(
                f"{where}.memory_points: batch {batch} needs {num_bytes} bytes, less than the {fixed} bytes of "
                "weights, gradients and optimizer state its breakdown lists"
            )
