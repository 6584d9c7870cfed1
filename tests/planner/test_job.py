"""planner.job: JobSpec validation (one ConfigError per bad option, naming the flag and the fix), amp_for,
the JSON round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.codec import convert, encode
from planner.job import (
    AMP_CHOICES,
    DEFAULT_FRACTION,
    FIT_KINDS,
    METHODS,
    MODES,
    OPTIMIZERS,
    JobSpec,
)
from torchkit.errors import ConfigError, UserError


def test_defaults_are_valid_and_documented_values():
    job = JobSpec(model="resnet50")
    assert (job.amp, job.optimizer, job.mode, job.method, job.fit) == (
        "auto",
        "sgd",
        "balanced",
        "auto",
        "affine",
    )
    assert job.fraction == DEFAULT_FRACTION == 0.60
    assert (job.global_batch, job.multiple_of, job.min_batch, job.gpus) == (None, 1, 1, "all")
    # a shared machine's defaults (planner.probing.busy): the seed's 20% free memory, at most half busy
    assert (job.min_free_memory_fraction, job.max_utilization_fraction) == (0.2, 0.5)
    assert job.channels_last is False


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("model", "", "package.module:factory"),
        ("model", "   ", "package.module:factory"),
        ("model", 3, "package.module:factory"),
        ("imgsz", 0, "positive integer"),
        ("imgsz", -32, "positive integer"),
        ("imgsz", True, "positive integer"),
        ("imgsz", 224.0, "positive integer"),
        ("seq_len", 0, "positive integer"),
        ("input_shape", (), "positive integers"),
        ("input_shape", (3, 0, 32), "positive integers"),
        ("input_shape", (3, True), "positive integers"),
        ("input_shape", (3, 32.0), "positive integers"),
        ("input_shape", "3,32,32", "positive integers"),
        ("amp", "fp8", "auto, fp16, bf16, off"),
        ("optimizer", "adam", "sgd, adamw"),
        ("mode", "fast", "balanced, max, uniform"),
        ("method", "guess", "auto, measure, estimate"),
        ("fit", "cubic", "affine, loglog"),
        ("fraction", 0, "(0, 1]"),
        ("fraction", 0.0, "(0, 1]"),
        ("fraction", 1.5, "(0, 1]"),
        ("fraction", -0.1, "(0, 1]"),
        ("fraction", True, "(0, 1]"),
        ("fraction", "0.5", "(0, 1]"),
        ("min_free_memory_fraction", -0.1, "[0, 1]"),
        ("min_free_memory_fraction", 1.01, "[0, 1]"),
        ("min_free_memory_fraction", True, "[0, 1]"),
        ("max_utilization_fraction", 2, "[0, 1]"),
        ("multiple_of", 0, ">= 1"),
        ("multiple_of", True, ">= 1"),
        ("multiple_of", 8.0, ">= 1"),
        ("min_batch", 0, ">= 1"),
        ("min_batch", -1, ">= 1"),
        ("global_batch", 0, "positive integer"),
        ("global_batch", True, "positive integer"),
        ("global_batch", 256.0, "positive integer"),
        ("gpus", "", "-1,-1"),
        ("gpus", " ", "-1,-1"),
        ("gpus", None, "-1,-1"),
        ("channels_last", 1, "true or false"),
        ("channels_last", "yes", "true or false"),
    ],
    ids=lambda v: repr(v),
)
def test_an_invalid_option_is_a_config_error_naming_the_flag_value_and_fix(field, value, fix):
    fields = {"model": "resnet50", field: value}
    with pytest.raises(ConfigError) as info:
        JobSpec(**fields)
    message = str(info.value)
    assert info.value.field == field
    assert message.startswith(f"{field} {value!r} is invalid")  # the core names fields, not CLI flags
    assert fix in message
    assert isinstance(info.value, UserError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("fraction", [1, 1.0, 0.01, 0.6])
def test_fraction_accepts_shares_in_the_half_open_interval(fraction):
    assert JobSpec(model="m", fraction=fraction).fraction == fraction


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1, 1.0])
def test_threshold_fractions_accept_the_closed_interval(value):
    job = JobSpec(model="m", min_free_memory_fraction=value, max_utilization_fraction=value)
    assert job.min_free_memory_fraction == job.max_utilization_fraction == value


def test_global_batch_must_be_a_multiple_of_multiple_of_and_the_error_names_the_neighbours():
    with pytest.raises(ConfigError) as info:
        JobSpec(model="m", global_batch=100, multiple_of=8)
    message = str(info.value)
    assert message.startswith("global_batch 100 is invalid")
    assert "multiple of multiple_of 8" in message
    assert info.value.render(lambda f: "--" + f.replace("_", "-")).startswith(
        "--global-batch 100 is invalid (it must be a multiple of --multiple-of 8"
    )
    assert "try 96 or 104" in message


def test_a_global_batch_that_is_a_multiple_is_accepted():
    assert JobSpec(model="m", global_batch=96, multiple_of=8).global_batch == 96


def test_a_global_batch_below_multiple_of_suggests_one_size_not_the_same_twice():
    with pytest.raises(ConfigError) as info:
        JobSpec(model="m", global_batch=5, multiple_of=8)
    message = str(info.value)
    assert "try 8" in message
    assert "8 or 8" not in message


# ---------------------------------------------------------------------------------------------- amp_for


@pytest.mark.parametrize(
    ("amp", "gpu", "expected"),
    [
        ("auto", "A100-SXM4-80GB", "bf16"),
        ("auto", "T4", "fp16"),
        ("auto", "V100-SXM2-16GB", "fp16"),
        ("fp16", "A100-SXM4-80GB", "fp16"),
        ("fp16", "T4", "fp16"),
        ("bf16", "A100-SXM4-80GB", "bf16"),
        ("off", "A100-SXM4-80GB", "off"),
        ("off", "T4", "off"),
    ],
)
def test_amp_for_resolves_auto_by_bf16_support(catalog, amp, gpu, expected):
    assert JobSpec(model="m", amp=amp).amp_for(catalog.get(gpu)) == expected


def test_amp_for_bf16_on_a_gpu_without_bf16_is_a_config_error_with_the_fix(catalog):
    with pytest.raises(ConfigError, match=r"amp bf16 asked for, but T4 has no bf16 support \(use amp auto"):
        JobSpec(model="m", amp="bf16").amp_for(catalog.get("T4"))


# ---------------------------------------------------------------------------------------------- JSON


def test_to_json_is_plain_json_with_every_field():
    job = JobSpec(
        model="tests.planner.tiny_models:convnet",
        input_shape=(3, 32, 32),
        global_batch=512,
        multiple_of=8,
        amp="fp16",
        optimizer="adamw",
    )
    data = encode(job)
    assert set(data) == set(JobSpec.__dataclass_fields__)
    assert data["input_shape"] == [3, 32, 32]
    assert data["global_batch"] == 512
    assert json.loads(json.dumps(data)) == data


def test_to_json_keeps_a_missing_input_shape_as_null():
    assert encode(JobSpec(model="resnet50"))["input_shape"] is None


jobs = st.builds(
    JobSpec,
    model=st.sampled_from(["resnet50", "gpt2-small", "pkg.mod:factory"]),
    imgsz=st.one_of(st.none(), st.integers(1, 2048)),
    input_shape=st.one_of(st.none(), st.lists(st.integers(1, 512), min_size=1, max_size=4).map(tuple)),
    seq_len=st.one_of(st.none(), st.integers(1, 8192)),
    amp=st.sampled_from(AMP_CHOICES),
    optimizer=st.sampled_from(OPTIMIZERS),
    fraction=st.floats(min_value=0.01, max_value=1.0),
    mode=st.sampled_from(MODES),
    multiple_of=st.just(4),
    global_batch=st.one_of(st.none(), st.integers(1, 10_000).map(lambda n: 4 * n)),
    min_batch=st.integers(1, 64),
    method=st.sampled_from(METHODS),
    gpus=st.sampled_from(["all", "-1,-1", "0,2"]),
    min_free_memory_fraction=st.floats(min_value=0.0, max_value=1.0),
    max_utilization_fraction=st.floats(min_value=0.0, max_value=1.0),
    fit=st.sampled_from(FIT_KINDS),
    channels_last=st.booleans(),
)


@given(jobs)
@settings(max_examples=100, deadline=None)
def test_json_round_trip_gives_the_same_job(job):
    assert convert(JobSpec, json.loads(json.dumps(encode(job))), where="job") == job


def test_from_json_rejects_unknown_fields_and_lists_the_known_ones():
    data = {**encode(JobSpec(model="m")), "batch": 64, "epochs": 3}
    with pytest.raises(ConfigError, match=r"job has unknown fields \['batch', 'epochs'\] \(known: \["):
        convert(JobSpec, data, where="job")


def test_from_json_validates_the_values_it_reads():
    with pytest.raises(ConfigError, match="mode 'fast' is invalid"):
        convert(JobSpec, {"model": "m", "mode": "fast"}, where="job")


def test_from_json_without_the_model_is_a_config_error():
    with pytest.raises(ConfigError, match="model"):
        convert(JobSpec, {"imgsz": 224}, where="job")


def test_input_dtypes_are_the_estimators_own() -> None:
    from planner.job import INPUT_DTYPES
    from torchkit.workloads import INPUT_DTYPES as TORCHKIT_INPUT_DTYPES

    assert INPUT_DTYPES == TORCHKIT_INPUT_DTYPES


def test_token_input_options_round_trip_and_are_checked() -> None:
    from planner.job import JobSpec

    job = JobSpec(model="pkg.mod:lstm", seq_len=32, vocab_size=1000, input_dtype="int64")
    assert convert(JobSpec, encode(job), where="job") == job
    with pytest.raises(ConfigError, match=r"vocab_size 0 is invalid"):
        JobSpec(model="pkg.mod:lstm", seq_len=32, vocab_size=0)
    with pytest.raises(ConfigError, match=r"input_dtype .int8. is invalid \(use one of float32"):
        JobSpec(model="pkg.mod:lstm", input_shape=(4,), input_dtype="int8")


def test_channels_last_and_the_time_model_are_part_of_an_estimated_profiles_key(catalog):
    from planner.profiles.key import job_key_inputs, key_of_inputs

    gpu = catalog.get("T4")

    def key(job: JobSpec, method: str = "estimate", time_model: str = "tm1") -> str:
        return key_of_inputs(
            job_key_inputs(job, gpu, method=method, fingerprint="f", torch_version="2", time_model=time_model)
        )

    nchw, nhwc = JobSpec(model="resnet50"), JobSpec(model="resnet50", channels_last=True)
    assert key(nchw) != key(nhwc)
    assert key(nchw) != key(nchw, time_model="tm2")  # a new calibration is a new estimate
    assert key(nchw, "measure") == key(
        nchw, "measure", time_model="tm2"
    )  # a measurement does not depend on it
