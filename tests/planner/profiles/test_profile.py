"""planner.profiles.profile: DeviceProfile fitting, max_batch (budget, oom_batch, MAX_PLANNED_BATCH, multiple_of),
notes for dropped and outlying points, the JSON round trip, and profile_key stability."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.codec import convert, encode
from planner.profiles.key import profile_key
from planner.profiles.profile import MAX_PLANNED_BATCH, DeviceProfile
from torchkit.errors import ConfigError
from torchkit.step.fit import AffineMemoryFit, AffineTimeFit, LogLogMemoryFit, MemoryFit

GIB = 2**30
MIB = 2**20


def make_profile(
    intercept_bytes=2 * GIB, bytes_per_sample=64 * MIB, t0=0.01, t1=0.002, **kwargs
) -> DeviceProfile:
    """A profile from exactly affine points (batch 1..64)."""
    batches = (1, 8, 32, 64)
    return DeviceProfile.from_points(
        gpu=kwargs.pop("gpu", "T4"),
        method=kwargs.pop("method", "estimate"),
        amp=kwargs.pop("amp", "fp16"),
        memory_points=[(b, intercept_bytes + bytes_per_sample * b) for b in batches],
        time_points=[(b, t0 + t1 * b) for b in batches],
        **kwargs,
    )


# ---------------------------------------------------------------------------------------------- from_points


def test_from_points_fits_both_curves_and_keeps_the_points():
    profile = make_profile()
    assert isinstance(profile.memory_fit, AffineMemoryFit)
    assert profile.memory_fit.intercept_bytes == pytest.approx(2 * GIB)
    assert profile.memory_fit.bytes_per_sample == pytest.approx(64 * MIB)
    assert profile.time_fit.intercept_s == pytest.approx(0.01)
    assert profile.time_fit.s_per_sample == pytest.approx(0.002)
    assert profile.memory_points == (
        (1, 2 * GIB + 64 * MIB),
        (8, 2 * GIB + 512 * MIB),
        (32, 4 * GIB),
        (64, 6 * GIB),
    )
    assert all(isinstance(v, int) for _, v in profile.memory_points)
    assert profile.notes == ()
    assert profile.oom_batch is None
    assert profile.breakdown_bytes is None


def test_from_points_with_loglog_fit_uses_the_loglog_curve():
    profile = make_profile(fit="loglog")
    assert isinstance(profile.memory_fit, LogLogMemoryFit)


def test_memory_bytes_and_step_time_are_the_fits_at_a_batch():
    profile = make_profile()
    assert profile.memory_bytes(16) == 2 * GIB + 16 * 64 * MIB
    assert isinstance(profile.memory_bytes(16), int)
    assert profile.step_time_s(100) == pytest.approx(0.01 + 0.2)


def test_a_dropped_memory_point_becomes_a_note_naming_the_gpu_batch_and_reason():
    profile = DeviceProfile.from_points(
        gpu="T4",
        method="measure",
        amp="fp16",
        memory_points=[(1, 100 * MIB), (2, 200 * MIB), (4, 150 * MIB), (8, 800 * MIB)],
        time_points=[(1, 0.01), (2, 0.02), (4, 0.04), (8, 0.08)],
    )
    dropped = [n for n in profile.notes if "batch 4 dropped" in n]
    assert len(dropped) == 1
    assert dropped[0].startswith("T4: memory point at batch 4 dropped: not increasing")
    # the point is still recorded, only left out of the fit
    assert (4, 150 * MIB) in profile.memory_points


def test_an_outlying_memory_point_becomes_a_note():
    points = [(1, 100 * MIB), (2, 200 * MIB), (3, 300 * MIB), (4, 400 * MIB), (5, 500 * MIB), (6, 1000 * MIB)]
    profile = DeviceProfile.from_points(
        gpu="A10G", method="measure", amp="bf16", memory_points=points, time_points=[(1, 0.1), (6, 0.6)]
    )
    assert any(
        n.startswith("A10G: memory point at batch 6 is ") and "off the fit" in n for n in profile.notes
    )


def test_a_dropped_time_point_becomes_a_note():
    profile = DeviceProfile.from_points(
        gpu="L4",
        method="measure",
        amp="bf16",
        memory_points=[(1, GIB), (2, 2 * GIB)],
        time_points=[(1, 0.1), (2, 0.0), (4, 0.4)],
    )
    assert "L4: time point at batch 2 dropped: not a positive finite time" in profile.notes


def test_given_notes_come_first_and_are_kept():
    points = [(1, 100 * MIB), (2, 90 * MIB), (4, 400 * MIB)]
    profile = DeviceProfile.from_points(
        gpu="T4",
        method="estimate",
        amp="fp16",
        memory_points=points,
        time_points=[(1, 0.1)],
        notes=["estimated on fake tensors"],
    )
    assert profile.notes[0] == "estimated on fake tensors"
    assert len(profile.notes) == 2


def test_from_points_without_a_usable_memory_point_raises():
    with pytest.raises(ValueError, match="no usable memory point"):
        DeviceProfile.from_points(
            gpu="T4", method="estimate", amp="fp16", memory_points=[(1, 0)], time_points=[(1, 0.1)]
        )


# ---------------------------------------------------------------------------------------------- max_batch


def test_max_batch_is_the_largest_batch_within_the_budget():
    profile = make_profile()
    # half a sample of slack either side: the fitted coefficients are exact only up to float rounding
    assert profile.max_batch(2 * GIB + 100 * 64 * MIB + 32 * MIB) == 100
    assert profile.max_batch(2 * GIB + 100 * 64 * MIB - 32 * MIB) == 99
    assert profile.max_batch(2 * GIB + 100 * 64 * MIB + 32 * MIB, multiple_of=32) == 96


def test_max_batch_is_zero_when_not_even_the_fixed_memory_fits():
    profile = make_profile()
    assert profile.max_batch(2 * GIB) == 0
    assert profile.max_batch(2 * GIB + 10 * 64 * MIB, multiple_of=16) == 0


def test_max_batch_stays_below_the_batch_that_ran_out_of_memory():
    profile = make_profile(oom_batch=50)
    assert profile.max_batch(80 * GIB) == 49
    assert profile.max_batch(80 * GIB, multiple_of=8) == 48
    # a budget smaller than the OOM point still governs
    assert profile.max_batch(2 * GIB + 20 * 64 * MIB + 32 * MIB) == 20


def test_max_batch_is_zero_when_batch_one_ran_out_of_memory():
    assert make_profile(oom_batch=1).max_batch(80 * GIB) == 0


def test_max_batch_never_exceeds_max_planned_batch():
    tiny = make_profile(intercept_bytes=100 * MIB, bytes_per_sample=1)
    assert tiny.max_batch(80 * GIB) == MAX_PLANNED_BATCH
    assert tiny.max_batch(80 * GIB, multiple_of=3) == MAX_PLANNED_BATCH // 3 * 3


def test_max_batch_of_a_flat_memory_curve_is_bounded():
    profile = DeviceProfile(
        gpu="T4",
        method="estimate",
        amp="fp16",
        memory_points=((1, GIB),),
        time_points=((1, 0.1),),
        memory_fit=AffineMemoryFit(intercept_bytes=GIB, bytes_per_sample=0.0),
        time_fit=AffineTimeFit(intercept_s=0.0, s_per_sample=0.1),
    )
    assert profile.max_batch(2 * GIB) == MAX_PLANNED_BATCH
    assert profile.max_batch(GIB - 1) == 0


@given(
    intercept=st.integers(0, 20 * GIB),
    per_sample=st.integers(1, GIB),
    budget=st.integers(0, 160 * GIB),
    multiple_of=st.integers(1, 64),
    oom_batch=st.one_of(st.none(), st.integers(1, 100_000)),
)
@settings(max_examples=200, deadline=None)
def test_max_batch_fits_the_budget_and_respects_every_bound(
    intercept, per_sample, budget, multiple_of, oom_batch
):
    profile = DeviceProfile(
        gpu="X",
        method="estimate",
        amp="off",
        memory_points=((1, intercept + per_sample),),
        time_points=((1, 0.1),),
        memory_fit=AffineMemoryFit(intercept_bytes=float(intercept), bytes_per_sample=float(per_sample)),
        time_fit=AffineTimeFit(intercept_s=0.0, s_per_sample=0.1),
        oom_batch=oom_batch,
    )
    batch = profile.max_batch(budget, multiple_of=multiple_of)
    assert batch % multiple_of == 0
    assert 0 <= batch <= MAX_PLANNED_BATCH
    if oom_batch is not None:
        assert batch < oom_batch
    if batch:
        assert profile.memory_bytes(batch) <= budget
    following = batch + multiple_of
    bound = MAX_PLANNED_BATCH if oom_batch is None else min(MAX_PLANNED_BATCH, oom_batch - 1)
    assert following > bound or profile.memory_fit.predict_bytes(following) > budget


# ---------------------------------------------------------------------------------------------- JSON


def roundtrip(profile: DeviceProfile) -> DeviceProfile:
    return convert(DeviceProfile, json.loads(json.dumps(encode(profile))), where="profile")


def test_json_round_trip_gives_an_equal_profile():
    profile = make_profile(
        oom_batch=96, notes=["a remark"], breakdown_bytes={"parameters": 1000, "activations": 5}
    )
    profile = dataclasses.replace(profile, time_log_sigma=0.12, time_model="calibration X")
    again = roundtrip(profile)
    assert again == profile
    assert again.max_batch(10 * GIB, 8) == profile.max_batch(10 * GIB, 8)


def test_json_round_trip_of_a_loglog_profile_with_notes_from_dropped_points():
    profile = DeviceProfile.from_points(
        gpu="V100-SXM2-16GB",
        method="measure",
        amp="fp16",
        memory_points=[(1, 100 * MIB), (2, 90 * MIB), (4, 400 * MIB), (8, 700 * MIB)],
        time_points=[(1, 0.01), (4, 0.03), (8, 0.05)],
        fit="loglog",
    )
    assert profile.notes
    assert roundtrip(profile) == profile


def test_to_json_has_the_documented_shape():
    data = encode(make_profile())
    assert set(data) == {
        "gpu",
        "method",
        "amp",
        "memory_points",
        "memory_fit",
        "time_points",
        "time_fit",
        "oom_batch",
        "notes",
        "min_memory_bytes",
        "breakdown_bytes",
        "time_log_sigma",
        "time_model",
    }
    assert data["memory_points"][0] == [1, 2 * GIB + 64 * MIB]
    assert data["memory_fit"]["kind"] == "affine"
    assert set(data["time_fit"]) == {"kind", "intercept_s", "s_per_sample"}


def test_from_json_defaults_the_optional_fields():
    data = encode(make_profile())
    for key in (
        "amp",
        "oom_batch",
        "notes",
        "min_memory_bytes",
        "breakdown_bytes",
        "time_log_sigma",
        "time_model",
    ):
        del data[key]
    profile = convert(DeviceProfile, data, where="profile")
    assert (
        profile.amp,
        profile.oom_batch,
        profile.notes,
        profile.min_memory_bytes,
        profile.breakdown_bytes,
    ) == ("off", None, (), 0, None)
    assert (profile.time_log_sigma, profile.time_model) == (0.0, "")


def test_memory_never_falls_below_the_floor_and_a_floor_over_budget_fits_nothing():
    profile = DeviceProfile.from_points(
        gpu="T4",
        method="estimate",
        amp="fp16",
        memory_points=[(32, 4 * GIB), (128, 10 * GIB)],
        time_points=[(32, 0.1), (128, 0.3)],
        min_memory_bytes=3 * GIB,
    )
    # the line through the probes gives 2 GiB at batch 0: the floor holds instead
    assert profile.memory_bytes(1) == 3 * GIB
    assert profile.memory_bytes(128) == 10 * GIB
    assert profile.max_batch(3 * GIB - 1) == 0
    assert profile.max_batch(4 * GIB) == 32
    assert convert(DeviceProfile, encode(profile), where="profile").min_memory_bytes == 3 * GIB


def _without(key):
    def mutate(data):
        del data[key]

    return mutate


def _set(key, value):
    def mutate(data):
        data[key] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        (_without("gpu"), "lacks the field 'gpu'"),
        (_without("memory_points"), "lacks the field 'memory_points'"),
        (_without("memory_fit"), "lacks the field 'memory_fit'"),
        (_without("time_fit"), "lacks the field 'time_fit'"),
        (_set("memory_fit", {"kind": "spline"}), "memory_fit: kind 'spline' is not one of affine, loglog"),
        (
            _set("memory_fit", {"kind": "affine", "intercept_bytes": 1.0}),
            "memory_fit lacks the field 'bytes_per_sample'",
        ),
        (_set("time_fit", {"kind": "loglog"}), "time_fit.kind must be one of affine, got 'loglog'"),
        (_set("memory_points", [[1]]), "memory_points[0] must be of length 2, got [1]"),
        (_set("memory_points", [["one", 5]]), "memory_points[0][0] must be int, got 'one'"),
        (_set("memory_points", 7), "memory_points must be list, got 7"),
        (_set("time_points", None), "time_points must be list, got None"),
        (_set("oom_batch", "many"), "oom_batch must be int/null, got 'many'"),
        (
            _set("breakdown_bytes", {"parameters": "lots"}),
            "breakdown_bytes['parameters'] must be int, got 'lots'",
        ),
    ],
    ids=[
        "no gpu",
        "no memory_points",
        "no memory_fit",
        "no time_fit",
        "unknown fit kind",
        "fit missing field",
        "time fit kind",
        "short point",
        "text batch",
        "points not a list",
        "time points null",
        "oom text",
        "breakdown text",
    ],
)
def test_a_malformed_profile_is_a_config_error_naming_where_the_field_and_the_fix(mutate, words):
    data = encode(make_profile())
    mutate(data)
    with pytest.raises(ConfigError) as info:
        convert(DeviceProfile, data, where="plan.json", fix="regenerate it")
    message = str(info.value)
    assert message.startswith("plan.json") and words in message and message.endswith("(regenerate it)"), (
        message
    )


@pytest.mark.parametrize("data", [None, [], "profile", 3])
def test_a_profile_that_is_not_an_object_is_a_config_error(data):
    with pytest.raises(ConfigError, match=r"profile must be dict, got"):
        convert(DeviceProfile, data, where="profile")


# ---------------------------------------------------------------------------------------------- profile_key

KEY_PARTS = (
    "fp:abc123",
    224,
    (3, 224, 224),
    None,
    "bf16",
    "adamw",
    "A100-SXM4-80GB",
    "estimate",
    "affine",
    "2.4.0",
)


def test_profile_key_is_a_short_hex_digest_and_deterministic():
    key = profile_key(*KEY_PARTS)
    assert len(key) == 16
    assert int(key, 16) >= 0
    assert key == profile_key(*KEY_PARTS)


@pytest.mark.parametrize("position", range(len(KEY_PARTS)))
def test_profile_key_changes_with_every_part(position):
    parts = list(KEY_PARTS)
    parts[position] = f"other-{parts[position]}"
    assert profile_key(*parts) != profile_key(*KEY_PARTS)


def test_profile_key_depends_on_the_order_of_parts():
    assert profile_key("T4", "fp16") != profile_key("fp16", "T4")


def test_profile_key_is_the_same_in_another_process_with_another_hash_seed():
    code = f"from planner.profiles.key import profile_key; print(profile_key(*{KEY_PARTS!r}))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == profile_key(*KEY_PARTS)


@pytest.mark.parametrize(
    "fit",
    [
        AffineMemoryFit(intercept_bytes=1.5e9, bytes_per_sample=3.25e7),
        LogLogMemoryFit(log_slope=0.87, log_intercept=19.1),
    ],
    ids=["affine", "loglog"],
)
def test_a_memory_fit_is_written_kind_first_and_read_back_as_its_kind(fit):
    data = json.loads(json.dumps(encode(fit)))
    assert next(iter(data)) == "kind"
    assert convert(MemoryFit, data, where="fit") == fit


def test_a_fit_of_an_unknown_kind_or_missing_a_coefficient_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"memory_fit: kind 'spline' is not one of affine, loglog"):
        convert(DeviceProfile, {**encode(make_profile()), "memory_fit": {"kind": "spline"}}, where="p")
    with pytest.raises(ConfigError, match=r"time_fit.kind must be one of affine, got 'loglog'"):
        convert(
            DeviceProfile,
            {
                **encode(make_profile()),
                "time_fit": {"kind": "loglog", "intercept_s": 0.0, "s_per_sample": 1.0},
            },
            where="p",
        )
    with pytest.raises(ConfigError, match=r"memory_fit lacks the field 'bytes_per_sample'"):
        convert(
            DeviceProfile,
            {**encode(make_profile()), "memory_fit": {"kind": "affine", "intercept_bytes": 1.0}},
            where="p",
        )
