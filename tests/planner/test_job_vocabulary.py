"""planner.job's vocabulary: mode, amp and method are enums, one spelling each, whose members are the strings
plan.json has always held."""

from __future__ import annotations

import json

import pytest

from planner.codec import convert, encode
from planner.errors import ConfigError
from planner.job import AMP_CHOICES, METHODS, MODES, AmpChoice, JobSpec, Method, Mode
from torchkit.hardware.catalog import load_catalog


@pytest.mark.parametrize(("enum", "names"), [(Mode, MODES), (AmpChoice, AMP_CHOICES), (Method, METHODS)])
def test_each_choice_is_an_enum_whose_values_are_the_vocabulary(enum, names):
    assert tuple(member.value for member in enum) == names
    assert all(member == member.value and str(member) == member.value for member in enum)


def test_a_job_holds_enum_members_and_writes_the_plain_strings():
    job = JobSpec(model="m", mode="max", amp="fp16", method="estimate")
    assert (job.mode, job.amp, job.method) == (Mode.MAX, AmpChoice.FP16, Method.ESTIMATE)
    assert json.loads(json.dumps(encode(job)))["mode"] == "max"
    assert convert(JobSpec, json.loads(json.dumps(encode(job))), where="job") == job


def test_amp_for_a_gpu_is_a_plain_string():
    t4 = load_catalog().get("T4")
    assert JobSpec(model="m").amp_for(t4) == "fp16" and type(JobSpec(model="m", amp="off").amp_for(t4)) is str
    with pytest.raises(ConfigError, match="no bf16 support"):
        JobSpec(model="m", amp="bf16").amp_for(t4)


@pytest.mark.parametrize(("field", "value"), [("mode", "fastest"), ("amp", "fp8"), ("mode", ["max"])])
def test_a_word_outside_the_vocabulary_is_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"{field} .* is invalid \(use one of"):
        JobSpec(model="m", **{field: value})
