"""A Ray that batchplan starts runs its workers at the planner's own priority, not Ray's niceness 15, which on
a loaded machine left the probes a few per cent of a core (planner.probing.session.WORKER_NICENESS)."""

from __future__ import annotations

import os

import pytest

from planner.probing.session import WORKER_NICENESS, WORKER_NICENESS_VARIABLE, started_ray_environment


def test_a_started_ray_gets_the_workers_niceness_and_keeps_the_workers_own_variables():
    env = started_ray_environment({"PYTHONPATH": "/src", "BATCHPLAN_CACHE_DIR": "/cache"})
    assert env == {
        "PYTHONPATH": "/src",
        "BATCHPLAN_CACHE_DIR": "/cache",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_worker_niceness": "0",
    }
    assert (WORKER_NICENESS_VARIABLE, WORKER_NICENESS) == ("RAY_worker_niceness", "0")
    assert started_ray_environment(None)[WORKER_NICENESS_VARIABLE] == "0"


@pytest.mark.ray
def test_the_workers_of_a_ray_started_with_that_environment_run_at_that_niceness(ray_cluster):
    # the suite's cluster is started with the same variable (tests/conftest.py): Ray applies it to every worker
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote(), timeout=120) == int(WORKER_NICENESS) + os.nice(0)
