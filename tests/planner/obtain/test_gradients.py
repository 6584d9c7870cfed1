"""The gradient layout of a job's model: built on the meta device once, then read from the store's ``gradients``
namespace; an entry that does not read is refused with a problem line and rebuilt."""

from __future__ import annotations

import json

from planner.job import JobSpec
from planner.obtain import job_fingerprint
from planner.obtain.gradients import GRADIENTS, gradient_layout
from planner.store import CacheStore
from tests.planner.tiny_models import convnet

JOB = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32))


def test_layout_is_the_models_gradient_bytes_and_is_cached(tmp_path):
    identity = job_fingerprint(JOB)
    store = CacheStore(tmp_path)
    sizes, source = gradient_layout(JOB, identity, store)
    model = convnet()
    assert sizes == tuple(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    assert "built on the meta device" in source
    again, cached_source = gradient_layout(JOB, identity, store)
    assert again == sizes and cached_source == source  # a warm plan says what a cold one says
    entry = next((tmp_path / "gradients").glob("*.json"))
    data = json.loads(entry.read_text())
    assert data["schema"] == GRADIENTS.schema and data["grad_bytes"] == list(sizes) and data["inputs"]["model"] == JOB.model
    assert not store.problems
    entry.write_text("{not json")
    rebuilt, source = gradient_layout(JOB, identity, store)  # a broken entry is rebuilt, not trusted
    assert rebuilt == sizes and "built on the meta device" in source
    assert len(store.problems) == 1 and entry.name in store.problems[0] and "building the model" in store.problems[0]
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
