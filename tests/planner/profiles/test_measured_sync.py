"""planner.profiles.measured_sync: a job's measured synchronisation is found by the same job (fingerprint,
gradient bytes, bucket cap, software) only, per ring shape, and a broken or foreign entry is ignored with a
problem line."""

from __future__ import annotations

import json

import pytest

from planner.errors import FieldError
from planner.job import JobSpec
from planner.profiles import measured
from planner.profiles.measured_sync import JobSync, find_job_sync, store_job_sync, sync_key_inputs
from planner.store import CacheStore, checksum
from tests.other_user import reachable_place

JOB = {"model": "resnet50", "optimizer": "sgd", "imgsz": 224}


def _sync(slowdown: float) -> JobSync:
    return JobSync(
        slowdown=slowdown,
        measured_exposed_s=0.01,
        predicted_exposed_s=0.004,
        compute_s=0.08,
        steps=5,
        link="gloo, 1 node(s), 2 rank(s)",
        created="2026-12-02T08:00:00+00:00",
    )


def _inputs(**changes) -> dict[str, str]:
    args = {"fingerprint": "abc", "gradient_bytes": 102_000_000, "bucket_cap_mb": None, **changes}
    job = JobSpec(**{**JOB, **args.pop("job", {})})
    return sync_key_inputs(job, **args)


def test_an_entry_answers_the_same_job_by_ring_shape_and_nothing_else(tmp_path, monkeypatch):
    store = CacheStore(tmp_path)
    path = store_job_sync(store, _inputs(), "ax2;intra a=pcie", _sync(2.0))
    store_job_sync(store, _inputs(), "ax2;bx2;network", _sync(5.0))
    assert path.parent.name == "sync"
    found = find_job_sync(store, _inputs())
    assert {s: j.slowdown for s, j in found.items()} == {"ax2;intra a=pcie": 2.0, "ax2;bx2;network": 5.0}
    store_job_sync(
        store, _inputs(), "ax2;intra a=pcie", _sync(2.5)
    )  # a later run of the same ring replaces it
    assert find_job_sync(store, _inputs())["ax2;intra a=pcie"].slowdown == 2.5
    for other in (_inputs(fingerprint="changed"), _inputs(gradient_bytes=1), _inputs(bucket_cap_mb=50)):
        assert find_job_sync(store, other) == {}
    assert find_job_sync(None, _inputs()) == {}
    monkeypatch.setattr(measured, "software_version", lambda: "torch 0.0.1")
    assert find_job_sync(store, _inputs()) == {}
    assert store.problems == []


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda d: {**d, "inputs": {**d["inputs"], "gradient_bytes": "1"}},
            "its key recomputed from its own inputs",
        ),
        (lambda d: {**d, "shapes": {"s": {**d["shapes"]["s"], "slowdown": -1.0}}}, "checksum mismatch"),
        (
            lambda d: {
                **d,
                "shapes": {"s": {"slowdown": 2.0}},
                "checksum": checksum({"s": {"slowdown": 2.0}}),
            },
            "shapes['s'] lacks the field 'measured_exposed_s'",
        ),
        (
            lambda d: {
                "inputs": d["inputs"],
                "shapes": {"s": {**d["shapes"]["s"], "slowdown": -1.0}},
            },  # the old form
            "shapes['s']: JobSync.slowdown must be a finite number >= 0, got -1.0",
        ),
    ],
)
def test_a_broken_or_foreign_entry_is_ignored_with_a_problem_line(tmp_path, damage, problem):
    store = CacheStore(tmp_path)
    path = store_job_sync(store, _inputs(), "s", _sync(2.0))
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    assert find_job_sync(store, _inputs()) == {}
    assert len(store.problems) == 1 and problem in store.problems[0] and "ignoring it" in store.problems[0]
    path.write_text("{not json")
    assert find_job_sync(store, _inputs()) == {} and "not valid JSON" in store.problems[-1]


def test_an_entry_of_the_release_before_the_store_still_answers(tmp_path):
    store = CacheStore(tmp_path)
    path = store_job_sync(store, _inputs(), "s", _sync(2.0))
    entry = json.loads(path.read_text())
    path.write_text(
        json.dumps({"inputs": entry["inputs"], "shapes": entry["shapes"]})
    )  # as that release wrote it
    assert find_job_sync(store, _inputs())["s"].slowdown == 2.0 and not store.problems


def test_job_sync_refuses_impossible_figures():
    with pytest.raises(ValueError, match="slowdown"):
        _sync(0.0)
    with pytest.raises(ValueError, match="steps"):
        JobSync(
            slowdown=1.0,
            measured_exposed_s=0.0,
            predicted_exposed_s=0.0,
            compute_s=0.1,
            steps=0,
            link="",
            created="",
        )


def test_an_entry_others_could_write_is_ignored_with_a_problem_line_and_their_directory_refused():
    with reachable_place() as cache:  # where other users can reach it (pytest's tmp_path is private)
        store = CacheStore(cache)
        path = store_job_sync(store, _inputs(), "s", _sync(2.0))
        path.chmod(0o646)
        assert find_job_sync(store, _inputs()) == {}
        assert len(store.problems) == 1 and f"{path} is writable by every user" in store.problems[0]
        assert "not trusted; ignoring it" in store.problems[0]
        path.chmod(0o644)
        (cache / "sync").chmod(0o777)
        with pytest.raises(FieldError, match=r"/sync (above it )?is writable by every user"):
            find_job_sync(CacheStore(cache), _inputs())
        with pytest.raises(FieldError, match=r"/sync (above it )?is writable by every user"):
            store_job_sync(CacheStore(cache), _inputs(), "s", _sync(2.0))
