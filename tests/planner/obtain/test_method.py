"""planner.obtain.method: the one meaning of ``auto``, decided in the process that holds the GPU.

On this machine torch is the CPU build: ``auto`` at a named device estimates with a note and ``measure``
refuses; where CUDA is usable (a lent GPU) the same calls measure."""

from __future__ import annotations

import pytest

from planner.errors import FieldError
from planner.job import METHODS, Method
from planner.obtain.method import cuda_usable, planned_method, resolve_method


def test_the_method_enum_is_the_jobs_vocabulary():
    assert tuple(m.value for m in Method) == METHODS == ("auto", "measure", "estimate")
    assert Method("auto") is Method.AUTO and str(Method.MEASURE) == "measure"


@pytest.mark.parametrize(
    ("requested", "device", "planned"),
    [
        (Method.ESTIMATE, None, Method.ESTIMATE),
        (Method.ESTIMATE, 0, Method.ESTIMATE),
        (Method.AUTO, None, Method.ESTIMATE),
        (Method.AUTO, 0, Method.MEASURE),
        (Method.MEASURE, 0, Method.MEASURE),
        (Method.MEASURE, None, Method.MEASURE),
    ],
)
def test_the_planned_method_is_what_auto_gives_where_cuda_works(requested, device, planned):
    assert planned_method(requested, device) is planned


def test_auto_without_a_device_estimates_without_a_note():
    assert resolve_method(Method.AUTO, None, "T4").method is Method.ESTIMATE
    assert resolve_method(Method.AUTO, None, "T4").note is None
    assert resolve_method(Method.ESTIMATE, 0, "T4").method is Method.ESTIMATE


def test_auto_at_a_device_cuda_cannot_use_estimates_with_a_note():
    if cuda_usable(0):
        assert resolve_method(Method.AUTO, 0, "T4").method is Method.MEASURE
        return
    resolved = resolve_method(Method.AUTO, 0, "T4")
    assert resolved.method is Method.ESTIMATE
    assert (
        resolved.note
        == "T4: no free GPU of this type to measure on (CUDA cannot use device 0 here); estimated"
    )


def test_measure_where_cuda_cannot_be_used_names_the_setting_not_a_flag():
    if cuda_usable(0):
        pytest.skip("CUDA is usable here: measure measures")
    with pytest.raises(FieldError) as info:
        resolve_method(Method.MEASURE, 0, "T4")
    assert info.value.field == "method"
    assert str(info.value).startswith("method measure needs a CUDA GPU of type T4 (device 0)")
    assert info.value.render(lambda f: f"--{f}").endswith("(use --method estimate or auto)")
