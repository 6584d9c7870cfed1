"""planner.cli.options: parsing --input-shape and naming JobSpec fields by their flags."""

from __future__ import annotations

import pytest

from planner.cli.options import flag_of, parse_input_shape
from planner.errors import ConfigError
from planner.job import JobFieldError, JobSpec


def test_every_job_field_error_is_shown_with_the_flag_the_user_typed():
    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", global_batch=100, multiple_of=8)
    assert info.value.render(flag_of) == "--global-batch 100 is invalid (it must be a multiple of --multiple-of 8: try 96 or 104)"
    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", min_free_memory_fraction=2.0)
    assert info.value.render(flag_of).startswith("--min-memory-fraction 2.0 is invalid")


def test_a_job_field_error_survives_pickling_as_it_crosses_ray():
    import pickle

    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", mode="fast")
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.field, str(again), again.render(flag_of)) == ("mode", str(info.value), info.value.render(flag_of))


# ---------------------------------------------------------------------------------------------- parse_input_shape


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("3,224,224", (3, 224, 224)),
        ("3x32x32", (3, 32, 32)),
        ("64", (64,)),
        (" 3, 32 , 32 ", (3, 32, 32)),
    ],
)
def test_parse_input_shape_accepts_comma_or_x_separated_positive_integers(text, shape):
    assert parse_input_shape(text) == shape


@pytest.mark.parametrize(
    "text", ["", ",", "a,b", "3,-1", "0", "3.5,2", "3,32,0", "three", "3,x,2", "3,,32", "3,32,32,"]
)
def test_parse_input_shape_rejects_anything_else_with_the_flag_and_an_example(text):
    with pytest.raises(ConfigError) as info:
        parse_input_shape(text)
    assert str(info.value) == f"--input-shape {text!r} is invalid (use positive integers like 3,224,224)"


def test_a_parsed_input_shape_makes_a_valid_job():
    job = JobSpec(model="pkg.mod:factory", input_shape=parse_input_shape("3x32x32"))
    assert job.input_shape == (3, 32, 32)
