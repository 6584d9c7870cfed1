"""The gradient layout of a job's model: its parameter shapes, from the model template (built on the meta device,
or on the CPU where the constructor reads values), once, then read from the store's ``gradients`` namespace; an
entry that does not read is refused with a problem line and rebuilt."""

from __future__ import annotations

import json

import pytest

from planner.errors import FieldError
from planner.job import JobSpec
from planner.obtain import job_fingerprint
from planner.obtain.gradients import GRADIENTS, gradient_layout
from planner.store import CacheStore
from tests.library_models import CASES, require_library, write_tiny_gpt2_config
from tests.other_user import reachable_place
from tests.planner.tiny_models import convnet, stride_probing_convnet

JOB = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32))


def test_layout_is_the_models_gradient_bytes_and_is_cached(tmp_path):
    identity = job_fingerprint(JOB)
    store = CacheStore(tmp_path)
    sizes, source = gradient_layout(JOB, identity, store)
    model = convnet()
    assert sizes == tuple(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert "parameter shapes" in source
    again, cached_source = gradient_layout(JOB, identity, store)
    assert again == sizes and cached_source == source  # a warm plan says what a cold one says
    entry = next((tmp_path / "gradients").glob("*.json"))
    data = json.loads(entry.read_text())
    assert (
        data["schema"] == GRADIENTS.schema
        and data["grad_bytes"] == list(sizes)
        and data["inputs"]["model"] == JOB.model
    )
    assert not store.problems
    entry.write_text("{not json")
    rebuilt, source = gradient_layout(JOB, identity, store)  # a broken entry is rebuilt, not trusted
    assert rebuilt == sizes and "parameter shapes" in source
    assert (
        len(store.problems) == 1
        and entry.name in store.problems[0]
        and "building the model" in store.problems[0]
    )
    assert all(isinstance(s, int) and s > 0 for s in sizes)


def test_an_entry_of_the_release_before_the_store_is_read_as_it_is(tmp_path):
    store = CacheStore(tmp_path)
    sizes, _ = gradient_layout(JOB, job_fingerprint(JOB), store)
    entry = next((tmp_path / "gradients").glob("*.json"))
    entry.write_text(json.dumps({"grad_bytes": [1, 2, 3]}))  # bare, as that release wrote it
    assert gradient_layout(JOB, job_fingerprint(JOB), store)[0] == (1, 2, 3)
    entry.write_text(json.dumps({"grad_bytes": [1, -2]}))
    assert gradient_layout(JOB, job_fingerprint(JOB), store)[0] == sizes
    assert "grad_bytes[1] must be >= 1, got -2" in store.problems[-1]


def test_a_layout_others_could_write_is_built_again_and_their_directory_refused(caplog):
    identity = job_fingerprint(JOB)
    with reachable_place() as cache:  # where other users can reach it (pytest's tmp_path is private)
        store = CacheStore(cache)
        sizes, _ = gradient_layout(JOB, identity, store)
        entry = next((cache / "gradients").glob("*.json"))
        entry.write_text(json.dumps({"grad_bytes": [4]}))  # issue #34: a layout that makes the sync free
        entry.chmod(0o666)
        assert gradient_layout(JOB, identity, store)[0] == sizes
        assert f"{entry} is writable by every user" in caplog.text
        assert len(store.problems) == 1 and "not trusted; ignoring it" in store.problems[0]
        assert entry.stat().st_mode & 0o777 == 0o644  # rewritten, private
        (cache / "gradients").chmod(0o775)
        with pytest.raises(FieldError, match=r"/gradients (above it )?is writable by its group"):
            gradient_layout(JOB, identity, CacheStore(cache))


def test_a_model_whose_constructor_reads_values_is_laid_out():
    """As Ultralytics' stride probe: ``.item()`` at construction fails on the meta device; the layout needs
    parameter shapes only, so the model is built on the CPU and laid out (it was "not modelled")."""
    job = JobSpec(model="tests.planner.tiny_models:stride_probing_convnet", input_shape=(3, 32, 32))
    sizes, source = gradient_layout(job, job_fingerprint(job), None)
    expected = tuple(
        p.numel() * p.element_size() for p in stride_probing_convnet().parameters() if p.requires_grad
    )
    assert sizes == expected and "parameter shapes" in source


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id())
def test_every_model_source_is_laid_out(case, tmp_path):
    """Ultralytics' DetectionModel among them (its constructor runs a stride-probing forward)."""
    require_library(case)
    model = case.name_with(write_tiny_gpt2_config(tmp_path) if "{config}" in case.model else None)
    job = JobSpec(model=model, **case.options)
    sizes, _ = gradient_layout(job, job_fingerprint(job), None)
    assert len(sizes) > 0 and all(isinstance(s, int) and s > 0 for s in sizes)
