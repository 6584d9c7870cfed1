"""What a re-balanced job leaves behind cannot poison the next plan: a simulated run files no profile (not in
the default cache, not in a given one, never under the real model's key); a real run's profile is found only
by a planner running the same software, and is marked with the model, software and link. One process
(a one-rank job needs no process group), a real tiny model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from planner.codec import convert
from planner.job import JobSpec
from planner.profiles import measured
from planner.profiles.cache import ProfileCache
from planner.profiles.measured import find_measured
from planner.runtime.rebalance import Rebalancer
from planner.runtime.rebalance_feedback import measured_fingerprint
from planner.runtime.sampler import PlannedBatchSampler
from planner.runtime.simulate import SimulatedSpeed
from tests.plans import make_plan

STEPS = 8


def run_one_rank(tmp_path, simulate=None, cache_dir=None, model_name="mlp") -> tuple[dict, list]:
    plan = make_plan((8,), nodes=(("node-a", 1),))
    plan["job"] = {
        "model": model_name,
        "optimizer": "sgd",
        "imgsz": None,
        "input_shape": None,
        "seq_len": None,
    }
    model = torch.nn.Linear(4, 1)
    sampler = PlannedBatchSampler(64, [8], 0, seed=0)
    rebalancer = Rebalancer.from_plan(plan, sampler, model, simulate=simulate)
    x = torch.randn(64, 4)
    for _, indices in zip(range(STEPS), sampler, strict=False):
        with rebalancer.compute():
            (model(x[indices]).square().mean() * rebalancer.loss_weight).backward()
        rebalancer.step_done()
    plan_path = tmp_path / "trained.json"
    written = rebalancer.write_feedback(plan_path, cache_dir)
    return json.loads(plan_path.read_text()), written


def test_a_simulated_run_writes_no_profile_anywhere_and_marks_its_plan(tmp_path, monkeypatch):
    default = tmp_path / "default-cache"
    monkeypatch.setenv("BATCHPLAN_CACHE_DIR", str(default))
    given = tmp_path / "given-cache"
    for cache_dir in (None, given):
        trained, written = run_one_rank(tmp_path, SimulatedSpeed(factors=(2.0,), sample_s=0.001), cache_dir)
        assert written == [tmp_path / "trained.json"]
    assert not default.exists() or not any(default.iterdir())
    assert not given.exists() or not any(given.iterdir())
    assert trained["measured"]["simulated"].startswith("simulated speeds [2.0]")
    assert any("simulated speeds" in w for w in trained["warnings"])


def test_a_real_runs_profile_answers_the_same_job_and_software_only(tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    trained, written = run_one_rank(tmp_path, cache_dir=cache_dir)
    assert len(written) == 2  # the plan and one profile
    marks = trained["measured"]["marks"]
    assert (
        marks["model"] == "mlp"
        and marks["software"].startswith("torch ")
        and marks["link"].startswith("none, 1 node")
    )
    # per step after the 2 warm-up steps, compute and synchronisation wait apart (one rank: no wait)
    steps = trained["measured"]["step_times"]
    assert len(steps) == STEPS - 2 and all(s["compute_s"][0] > 0 and s["sync_wait_s"] == [0.0] for s in steps)
    cache = ProfileCache(cache_dir)
    job = convert(JobSpec, trained["job"], where="job")
    fingerprint = measured_fingerprint(job)
    found = find_measured(cache, job, "T4", "off", fingerprint=fingerprint)
    assert found is not None and found.method == "job"
    assert any("software torch" in note and "link none" in note for note in found.notes)
    other = dataclasses.replace(job, model="resnet18")
    assert (
        find_measured(cache, other, "T4", "off", fingerprint=measured_fingerprint(other)) is None
    )  # another model
    monkeypatch.setattr(measured, "software_version", lambda: "torch 0.0.1")  # a planner on other software
    assert find_measured(cache, job, "T4", "off", fingerprint=fingerprint) is None


@pytest.mark.parametrize(
    "simulate", [None, SimulatedSpeed(factors=(2.0,), sample_s=0.001)], ids=["real", "simulated"]
)
def test_a_model_the_job_cannot_import_still_gets_its_plan_written(tmp_path, simulate, caplog):
    # the plan named a module:factory importable where the planner ran, not from the job's working directory:
    # training finished, so the feedback must not fail it (it once ended rank 0 with exit 1 after its last step)
    cache_dir = tmp_path / "cache"
    trained, written = run_one_rank(tmp_path, simulate, cache_dir, model_name="no_such_module_here:factory")
    assert written == [tmp_path / "trained.json"] and trained["measured"]["step_times"]
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    not_filed = [r.getMessage() for r in caplog.records if "were not filed" in r.getMessage()]
    assert len(not_filed) == (0 if simulate else 1)
    assert all("no_such_module_here" in line for line in not_filed)


def test_the_collective_timeout_must_be_a_positive_number():
    plan = make_plan((8,), nodes=(("node-a", 1),))
    sampler = PlannedBatchSampler(64, [8], 0, seed=0)
    with pytest.raises(Exception, match="collective_timeout_s"):
        Rebalancer.from_plan(plan, sampler, torch.nn.Linear(4, 1), collective_timeout_s=0)


def test_a_rebalanced_plans_figures_are_its_new_batches_and_the_planned_advice_moves_aside():
    """It kept the old predicted memory, balance efficiency and advice ("dropping the 1 T4 rank would be 1.37×
    faster (0.007 s vs 0.010 s ...)") for batches that no longer ran."""
    from planner.codec import encode
    from planner.plan.sections import MeasuredRank, MeasuredSection, PlannedFigures, Switch
    from planner.plan.validate import plan_from_bytes, validate_plan
    from planner.runtime.rebalance_feedback import updated_plan
    from torchkit.step.fit import AffineTimeFit

    document = make_plan((5, 3, 8))
    document.update(
        alternatives={"balanced": 100.0, "uniform": 50.0},
        notes=["'balanced' is 2.00× faster than ..."],
        warnings=["dropping the 1 T4 rank (rank 1) would be 1.37× faster (...)"],
        balance_efficiency_range=[0.9, 1.0],
    )
    plan = validate_plan(document)
    fits = [AffineTimeFit(intercept_s=0.0, s_per_sample=s) for s in (0.001, 0.002, 0.004)]
    section = MeasuredSection(
        source="test",
        created="2026-01-01T00:00:00+00:00",
        steps=8,
        measured_steps=6,
        switches=(
            Switch(decided_at_step=3, batches=(9, 5, 2), predicted_step_s=0.01, previous_step_s=0.032),
        ),
        steps_to_balance=3,
        batches_first=(5, 3, 8),
        batches_last=(9, 5, 2),
        max_idle_first=None,
        max_idle_last=0.1,
        step_time_first_s=None,
        step_time_last_s=None,
        rollbacks=0,
        watch_overhead=None,
        compute_s_last=None,
        sync_wait_s_last=None,
        simulated=None,
        sync=None,
        marks={},
        ranks=tuple(
            MeasuredRank(rank=r, gpu="T4", time_points=(), time_fit=fit, peak_reserved_points=())
            for r, fit in enumerate(fits)
        ),
        step_times=(),
    )
    updated = updated_plan(plan, section)
    profile = plan.profiles["p0"]
    assert [r.predicted_memory_bytes for r in updated.ranks] == [profile.memory_bytes(b) for b in (9, 5, 2)]
    assert updated.predicted_step_time_s == pytest.approx(0.010)  # rank 1: 5 × 2 ms
    bound = sum(64 / (64 * s) for s in (0.001, 0.002, 0.004))  # every rank alone at its cap 64
    assert updated.balance_efficiency == pytest.approx(16 / 0.010 / bound)
    assert updated.balance_efficiency_range is None and updated.alternatives is None
    assert updated.warnings == (
        next(w for w in updated.warnings if w.startswith("re-balanced in the running job")),
    )
    assert (
        len(updated.notes) == 1 and "measured.planned" in updated.notes[0] and "[5, 3, 8]" in updated.notes[0]
    )
    assert updated.measured.planned == PlannedFigures(
        batches=(5, 3, 8),
        balance_efficiency=plan.balance_efficiency,
        alternatives=plan.alternatives,
        notes=plan.notes,
        warnings=plan.warnings,
    )
    again = plan_from_bytes(json.dumps(encode(updated)).encode(), where="re-balanced plan")
    assert (
        again.balance_efficiency == updated.balance_efficiency
        and again.measured.planned == updated.measured.planned
    )
