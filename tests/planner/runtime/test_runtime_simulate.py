"""The simulation of slow devices inside the re-balancer's timing (``planner.runtime.simulate``), with a measured
per-sample time: what is timed as a simulated device's compute is the time declared, and the host's lateness in
waking from the sleep is the rank's wait. One process, a real tiny model."""

from __future__ import annotations

import time

import torch

from planner.runtime import rebalance
from planner.runtime.rebalance import Rebalancer
from planner.runtime.sampler import PlannedBatchSampler
from planner.runtime.simulate import SimulatedSpeed
from tests.plans import make_plan

LATE_S = 0.3  # how late the patched sleep wakes: far above anything the declared time or a loaded host adds


def test_a_sleep_that_wakes_late_is_timed_as_wait_not_compute(monkeypatch):
    """On a loaded machine a 0.2 ms sleep took 3-4 ms: every rank that slept looked like a device with a fixed
    cost deaf to its batch, and the re-balancer moved samples away from it for nothing."""
    real_sleep = time.sleep

    def late_sleep(seconds: float) -> None:
        real_sleep(seconds + LATE_S)

    monkeypatch.setattr(rebalance.time, "sleep", late_sleep)
    plan = make_plan((8,), nodes=(("node-a", 1),))
    model = torch.nn.Linear(4, 1)
    sampler = PlannedBatchSampler(64, [8], 0, seed=0)
    measured = SimulatedSpeed(factors=(2.0,))
    measured.agree(0.001)  # as after the warm-up: 2 × 1 ms × batch 8 = 16 ms, the real compute part of it
    rebalancer = Rebalancer.from_plan(plan, sampler, model, simulate=measured)
    x = torch.randn(64, 4)
    for _, indices in zip(range(3), sampler, strict=False):
        with rebalancer.compute():
            (model(x[indices]).square().mean() * rebalancer.loss_weight).backward()
        rebalancer.step_done()
    for measure in rebalancer.measures:
        assert 0.016 <= measure.compute_s[0] < LATE_S  # the declared 16 ms (the real compute inside it)
        assert measure.sync_wait_s[0] >= LATE_S - 0.001  # the lateness is waiting
