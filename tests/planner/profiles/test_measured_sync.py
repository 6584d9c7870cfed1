"""planner.profiles.measured_sync: a job's measured synchronisation is found by the same job (fingerprint,
gradient bytes, bucket cap, software) only, per ring shape, and a broken or foreign entry is ignored with a
problem line."""

from __future__ import annotations

import json

import pytest

from planner.errors import FieldError
from planner.profiles import measured
from planner.profiles.measured_sync import JobSync, find_job_sync, store_job_sync, sync_key_inputs
from tests.other_user import reachable_place

JOB = {"model": "resnet50", "optimizer": "sgd", "imgsz": 224, "input_shape": None, "seq_len": None}


def _sync(slowdown: float) -> JobSync:
    return JobSync(slowdown=slowdown, measured_exposed_s=0.01, predicted_exposed_s=0.004, compute_s=0.08, steps=5,
                   link="gloo, 1 node(s), 2 rank(s)", created="2026-12-02T08:00:00+00:00")


def _inputs(**changes) -> dict[str, str]:
    args = {"fingerprint": "abc", "gradient_bytes": 102_000_000, "bucket_cap_mb": None, **changes}
    return sync_key_inputs({**JOB, **changes.pop("job", {})}, **args)


def test_an_entry_answers_the_same_job_by_ring_shape_and_nothing_else(tmp_path, monkeypatch):
    path = store_job_sync(tmp_path, _inputs(), "ax2;intra a=pcie", _sync(2.0))
    store_job_sync(tmp_path, _inputs(), "ax2;bx2;network", _sync(5.0))
    assert path.parent.name == "sync"
    found, problems = find_job_sync(tmp_path, _inputs())
    assert problems == [] and {s: j.slowdown for s, j in found.items()} == {"ax2;intra a=pcie": 2.0, "ax2;bx2;network": 5.0}
    store_job_sync(tmp_path, _inputs(), "ax2;intra a=pcie", _sync(2.5))  # a later run of the same ring replaces it
    assert find_job_sync(tmp_path, _inputs())[0]["ax2;intra a=pcie"].slowdown == 2.5
    for other in (_inputs(fingerprint="changed"), _inputs(gradient_bytes=1), _inputs(bucket_cap_mb=50)):
        assert find_job_sync(tmp_path, other) == ({}, [])
    assert find_job_sync(None, _inputs()) == ({}, [])
    monkeypatch.setattr(measured, "software_version", lambda: "torch 0.0.1")
    assert find_job_sync(tmp_path, _inputs()) == ({}, [])


@pytest.mark.parametrize(("damage", "problem"), [
    (lambda d: {**d, "inputs": {**d["inputs"], "gradient_bytes": "1"}}, "not this job's"),
    (lambda d: {**d, "shapes": {"s": {**d["shapes"]["s"], "slowdown": -1.0}}}, "malformed"),
    (lambda d: {**d, "shapes": {"s": {"slowdown": 2.0}}}, "malformed"),
])
def test_a_broken_or_foreign_entry_is_ignored_with_a_problem_line(tmp_path, damage, problem):
    path = store_job_sync(tmp_path, _inputs(), "s", _sync(2.0))
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    found, problems = find_job_sync(tmp_path, _inputs())
    assert found == {} and len(problems) == 1 and problem in problems[0]
    path.write_text("{not json")
    assert "unreadable" in find_job_sync(tmp_path, _inputs())[1][0]


def test_job_sync_refuses_impossible_figures():
    with pytest.raises(ValueError, match="slowdown"):
        _sync(0.0)
    with pytest.raises(ValueError, match="steps"):
        JobSync(slowdown=1.0, measured_exposed_s=0.0, predicted_exposed_s=0.0, compute_s=0.1, steps=0, link="",
                created="")


def test_an_entry_others_could_write_is_ignored_with_a_problem_line_and_their_directory_refused():
    with reachable_place() as cache:  # where other users can reach it (pytest's tmp_path is private)
        path = store_job_sync(cache, _inputs(), "s", _sync(2.0))
        path.chmod(0o646)
        found, problems = find_job_sync(cache, _inputs())
        assert found == {} and len(problems) == 1 and f"{path} is writable by every user" in problems[0]
        path.chmod(0o644)
        (cache / "sync").chmod(0o777)
        with pytest.raises(FieldError, match=r"sync above it is writable by every user"):
            find_job_sync(cache, _inputs())
        with pytest.raises(FieldError, match=r"sync above it is writable by every user"):
            store_job_sync(cache, _inputs(), "s", _sync(2.0))
