"""planner.runtime.sync_feedback: the slowest rank's wait per step, set against the plan's model of the same
ring at the compute that ran, gives back the slowdown the waits came from; a simulated run, a one-rank plan
and a plan without a comm section give nothing to file, each saying why."""

from __future__ import annotations

import pytest

from planner.plan.build import build_plan
from planner.plan.comm import section_ring
from planner.plan.sections import CommSection, StepMeasure
from planner.runtime.sync_feedback import job_sync_of, measured_exposed, sync_entry
from tests.planner.plan.test_plan_comm import JOB, PROFILES, _slot, _sync
from torchkit.estimate.ddp_sync import RingCost, exposed_sync_s


def _comm() -> CommSection:
    slots = [_slot("a", i, "a100") for i in range(2)]
    return build_plan(JOB, slots, PROFILES, sync=_sync()).comm


def _measures(comm: CommSection, slowdown: float, split=(64, 64), steps: int = 7) -> list[StepMeasure]:
    ring, buckets = section_ring(comm)
    slowed = RingCost(
        num_ranks=ring.num_ranks,
        num_nodes=ring.num_nodes,
        intra=ring.intra,
        network=ring.network,
        slowdown=slowdown,
    )
    out = []
    for step in range(1, steps + 1):
        compute = 0.05 + 0.001 * step  # rank 1 the slowest; rank 0 waits for it as well
        exposed = exposed_sync_s(buckets, slowed, compute_s=compute, backward_share=comm.backward_share)
        out.append(
            StepMeasure(
                step=step,
                batches=split,
                compute_s=(compute - 0.01, compute),
                sync_wait_s=(exposed + 0.01, exposed),
            )
        )
    return out


def test_the_waits_of_a_slowed_ring_give_back_its_slowdown_for_the_plans_ring_shape():
    comm = _comm()
    shape, sync = job_sync_of(comm, _measures(comm, 4.0), (64, 64), 1, "gloo, 1 node(s), 2 rank(s)")
    assert shape == comm.ring_shape
    assert sync.slowdown == pytest.approx(4.0, rel=1e-3) and sync.steps == 7
    assert sync.compute_s == pytest.approx(0.054)  # the slowest rank's median
    assert sync.measured_exposed_s > sync.predicted_exposed_s > 0
    assert sync.source.startswith("measured in the job (gloo, 1 node(s), 2 rank(s); 7 steps")


def test_the_last_split_is_measured_alone_once_it_has_enough_steps_and_accumulation_divides_the_compute():
    comm = _comm()
    early = _measures(comm, 1.0, split=(80, 48), steps=4)
    late = _measures(comm, 1.0, split=(64, 64), steps=2)
    exposed, compute, steps = measured_exposed(early + late, (64, 64), accumulate=2)
    assert steps == 6  # two steps at the last split are too few: all of them
    assert compute == pytest.approx(0.052 / 2)  # median of 51, 51, 52, 52, 53, 54 ms, per micro-step


def test_nothing_is_filed_for_a_simulated_run_one_rank_or_a_plan_without_comm():
    comm = _comm()
    simulated = sync_entry(comm, _measures(comm, 4.0), (64, 64), 1, "gloo", "simulated speeds [1.0, 2.0]")
    assert simulated.ring_shape is None and "simulated speeds" in simulated.why
    assert sync_entry(None, [], (8,), 1, "none", None).why.startswith(
        "not filed: the plan has no synchronisation"
    )
    single = build_plan(JOB, [_slot("a", 0, "a100")], PROFILES, sync=_sync()).comm
    assert sync_entry(single, [], (8,), 1, "none", None).why == "not filed: one rank: nothing synchronised"
    no_waits = [StepMeasure(step=1, batches=(64, 64), compute_s=(0.05, 0.05))]
    assert "no step recorded" in sync_entry(comm, no_waits, (64, 64), 1, "gloo", None).why
    filed = sync_entry(comm, _measures(comm, 2.0), (64, 64), 1, "gloo", None)
    assert filed.ring_shape == comm.ring_shape and filed.filed.slowdown == pytest.approx(2.0, rel=1e-3)
