"""planner.cli.options: parsing --input-shape and naming JobSpec fields by their flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from planner.cli.options import flag_of, parse_input_shape
from planner.errors import ConfigError
from planner.job import JobFieldError, JobSpec


def test_every_job_field_error_is_shown_with_the_flag_the_user_typed():
    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", global_batch=100, multiple_of=8)
    assert (
        info.value.render(flag_of)
        == "--global-batch 100 is invalid (it must be a multiple of --multiple-of 8: try 96 or 104)"
    )
    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", min_free_memory_fraction=2.0)
    assert info.value.render(flag_of).startswith("--min-memory-fraction 2.0 is invalid")


def test_a_job_field_error_survives_pickling_as_it_crosses_ray():
    import pickle

    with pytest.raises(JobFieldError) as info:
        JobSpec(model="m", mode="fast")
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.field, str(again), again.render(flag_of)) == (
        "mode",
        str(info.value),
        info.value.render(flag_of),
    )


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


# ------------------------------------------------------------------------------------ flags derived from JobSpec


def _job_actions(command: str) -> dict[str, object]:
    from planner.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {a.dest: a for a in sub._actions}


def test_every_job_field_is_a_flag_with_the_specs_default_and_choices():
    import dataclasses
    import typing

    from planner.job import AMP_CHOICES, FIT_KINDS, INPUT_DTYPES, METHODS, MODES, OPTIMIZERS

    actions = _job_actions("plan")
    for spec_field in dataclasses.fields(JobSpec):
        action = actions[spec_field.name]
        assert action.option_strings == [flag_of(spec_field.name)]
        wanted = None if spec_field.default is dataclasses.MISSING else spec_field.default
        assert action.default == wanted, spec_field.name
    choices = {
        "amp": AMP_CHOICES,
        "optimizer": OPTIMIZERS,
        "mode": MODES,
        "method": METHODS,
        "fit": FIT_KINDS,
        "input_dtype": INPUT_DTYPES,
    }
    for name, values in choices.items():
        assert tuple(actions[name].choices) == tuple(values), name
    assert typing.get_args(typing.get_type_hints(JobSpec)["input_dtype"])  # a Literal, not a bare str
    assert actions["model"].required


def test_the_parsed_default_flags_are_the_default_job():
    from planner.cli.main import build_parser
    from planner.cli.options import job_from_args

    args = build_parser().parse_args(["plan", "--model", "resnet18"])
    assert job_from_args(args) == JobSpec(model="resnet18")
    args = build_parser().parse_args(
        ["profile", "--model", "m:f", "--input-shape", "3x8x8", "--method", "estimate", "--channels-last"]
    )
    assert job_from_args(args) == JobSpec(
        model="m:f", input_shape=(3, 8, 8), method="estimate", channels_last=True
    )


@dataclass(frozen=True, kw_only=True)
class _NewSpec:
    """A spec as a new job option arrives: a field with its docstring and nothing else."""

    bucket_cap_mib: int = 25
    """DDP's gradient bucket size, MiB"""
    flavour: Literal["a", "b"] = "a"
    """which one"""
    quiet: bool = False


def test_a_field_without_a_cli_form_gets_its_flag_from_the_field_alone():
    import argparse

    from planner.cli.spec_flags import add_spec_flags, spec_from_args

    Spec = _NewSpec
    parser = argparse.ArgumentParser()
    add_spec_flags(parser.add_argument_group("x"), Spec, {})
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["bucket_cap_mib"] == "DDP's gradient bucket size, MiB (default 25)"
    assert spec_from_args(
        Spec, {}, parser.parse_args(["--bucket-cap-mib", "50", "--flavour", "b", "--quiet"])
    ) == (Spec(bucket_cap_mib=50, flavour="b", quiet=True))


def test_profile_refuses_the_flags_that_only_shape_a_plan_and_keeps_their_defaults():
    from planner.cli.options import JOB_FLAG_FORMS

    actions = _job_actions("profile")
    planning_only = {name for name, form in JOB_FLAG_FORMS.items() if form.planning_only}
    assert planning_only == {
        "mode",
        "global_batch",
        "min_batch",
        "gpus",
        "min_free_memory_fraction",
        "max_utilization_fraction",
        "bucket_cap_mb",
    }
    for name in planning_only:
        assert actions[name].help == "==SUPPRESS==" and actions[name].default == getattr(
            JobSpec(model="m"), name
        )


def test_preflight_thresholds_are_flags_of_their_type():
    from planner.preflight import Thresholds

    actions = _job_actions("preflight")
    assert (actions["max_imbalance"].default, actions["min_subset_gain"].default) == (0.15, 1.10)
    assert actions["expect_gpus"].option_strings == ["--expect-gpus"]
    assert Thresholds().max_imbalance == actions["max_imbalance"].default


def test_spec_argv_spells_a_job_that_the_flags_read_back() -> None:
    from planner.cli.main import build_parser
    from planner.cli.options import JOB_FLAG_FORMS, job_from_args
    from planner.cli.spec_flags import spec_argv
    from planner.job import JobSpec

    jobs = [
        JobSpec(model="resnet50"),
        JobSpec(
            model="tests.planner.tiny_models:convnet",
            input_shape=(3, 32, 32),
            global_batch=96,
            multiple_of=8,
            amp="bf16",
            optimizer="adamw",
            channels_last=True,
            fraction=0.5,
            mode="max",
            method="estimate",
            bucket_cap_mb=50.0,
        ),
    ]
    for job in jobs:
        argv = spec_argv(job, JOB_FLAG_FORMS)
        assert argv[:2] == ["--model", job.model]
        args = build_parser().parse_args(["plan", *argv])
        assert job_from_args(args) == job
    assert spec_argv(JobSpec(model="resnet50"), JOB_FLAG_FORMS) == ["--model", "resnet50"]
