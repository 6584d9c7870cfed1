"""Huge integer arguments are range-checked in the JobSpec, before any model or tensor is built: one line naming
the flag and its limit, exit 2 (``--imgsz 2**31`` once ended in a torch TypeError from the input builder)."""

from __future__ import annotations

import pytest

from planner.job import (
    MAX_BATCH_ARGUMENT,
    MAX_IMAGE_SIDE,
    MAX_INPUT_DIM,
    MAX_SAMPLE_ELEMENTS,
    MAX_SEQ_LEN,
    MAX_VOCAB_SIZE,
    JobFieldError,
    JobSpec,
)
from tests.planner.cli_helpers import assert_user_error, run_cli


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("imgsz", MAX_IMAGE_SIDE),
        ("seq_len", MAX_SEQ_LEN),
        ("vocab_size", MAX_VOCAB_SIZE),
        ("multiple_of", MAX_BATCH_ARGUMENT),
        ("min_batch", MAX_BATCH_ARGUMENT),
    ],
)
def test_a_size_one_past_its_limit_is_refused_and_the_limit_accepted(field, limit) -> None:
    JobSpec(model="pkg.mod:factory", **{field: limit})
    with pytest.raises(JobFieldError, match=f"at most {limit}") as info:
        JobSpec(model="pkg.mod:factory", **{field: limit + 1})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ((3, 2**31, 2**31), f"each dimension at most {MAX_INPUT_DIM}"),
        ((3, 2**20, 2**20), f"at most {MAX_SAMPLE_ELEMENTS} values"),
    ],
)
def test_an_input_shape_too_large_for_a_sample_is_refused(shape, words) -> None:
    with pytest.raises(JobFieldError, match=words):
        JobSpec(model="pkg.mod:factory", input_shape=shape)


@pytest.mark.parametrize(
    "flags",
    [
        ("--imgsz", str(2**31)),
        ("--input-shape", f"3,{2**31},{2**31}"),
        ("--seq-len", str(2**40)),
        ("--imgsz", str(10**400)),
    ],
)
def test_the_cli_refuses_huge_sizes_in_one_line(tmp_path, flags) -> None:
    result = run_cli("profile", "--gpu", "T4", "--model", "resnet18", *flags, "--no-cache", cwd=tmp_path)
    assert_user_error(result, 2, flags[0])
    assert "torch" not in result.stderr and "empty_strided" not in result.stderr
