"""batchplan next to a Ray cluster that already runs on the machine (issue #15, item 1): without
``--cluster``/``--address`` it joins that cluster and says so; with ``--cluster`` it starts its own beside it,
on other ports, and leaves the user's cluster and its address file as they were.

The "already running" cluster is started by the test itself (``tests/planner/running_ray.py``: its own
process, its own ``TMPDIR``, 127.0.0.1) and stopped by its own handle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    DEMO_MIXED,
    TINY_MODEL,
    assert_ok,
    check_plan,
    describe,
    parse_json_stdout,
    run_cli_process,
)
from tests.planner.running_ray import RunningRay

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def running_ray() -> Iterator[RunningRay]:
    cluster = RunningRay()
    try:
        yield cluster
    finally:
        cluster.stop()


def _still_up(cluster: RunningRay) -> bool:
    import socket

    host, port = cluster.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def test_plan_without_cluster_flags_joins_the_running_cluster_and_says_so(
    running_ray: RunningRay, tmp_path: Path
) -> None:
    result = run_cli_process(
        "plan",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        cwd=tmp_path,
        env=running_ray.env(),
        timeout=300,
    )
    # the cluster has no GPU (this machine has none): the plan is infeasible, exit 1, said in one line
    assert result.returncode == 1, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert "object_store_memory" not in result.stderr, describe(result)
    assert f"found a running Ray cluster at {running_ray.address}" in result.stderr, describe(result)
    assert "--address auto" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: no usable GPU"), describe(result)
    assert _still_up(running_ray)


def test_plan_of_a_config_starts_its_own_cluster_beside_the_running_one(
    running_ray: RunningRay, tmp_path: Path
) -> None:
    before = running_ray.address_file.read_text()
    # RAY_ADDRESS too: Ray itself would join that cluster instead of the one we start
    env = {**running_ray.env(), "RAY_ADDRESS": running_ray.address}
    result = run_cli_process(
        "plan",
        "--cluster",
        DEMO_MIXED,
        "--raylet-cap",
        "3",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        "--json",
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert_ok(result)
    plan = check_plan(parse_json_stdout(result))
    assert plan["probing"]["raylets"] == 3  # our own three raylets, not the running one-raylet cluster
    assert [n["name"] for n in plan["nodes"]] == ["node-a100", "node-v100", "node-t4"]
    assert "Overwriting previous Ray address" not in result.stderr, describe(result)
    assert "found a running Ray cluster" not in result.stderr
    assert running_ray.address_file.read_text() == before  # `ray status` still finds the user's cluster
    assert _still_up(running_ray)


def test_progress_over_ray_counts_the_nodes_and_says_what_profiling_does(
    running_ray: RunningRay, tmp_path: Path
) -> None:
    # --address: the nodes are whatever answers, and the progress line counts the probes it starts
    joined = run_cli_process(
        "preflight",
        "--address",
        running_ray.address,
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        cwd=tmp_path,
        timeout=300,
    )
    assert joined.returncode == 1, describe(joined)  # no GPU on the running cluster: gpus_present fails
    assert "probing 1 node\n" in joined.stderr and "probing ?" not in joined.stderr, describe(joined)
    assert "Overwriting previous Ray address" not in joined.stderr + joined.stdout
    # a simulated cluster, cold cache: each GPU type is estimated in one probe, and the line says so
    simulated = run_cli_process(
        "preflight",
        "--cluster",
        DEMO_MIXED,
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        cwd=tmp_path,
        env=running_ray.env(),
        timeout=300,
    )
    assert simulated.returncode in (0, 1), describe(simulated)
    assert "estimating T4 on fake tensors (in the probe on node-a100)" in simulated.stderr, describe(
        simulated
    )
    assert "(estimate) on" not in simulated.stderr
    assert "Overwriting previous Ray address" not in simulated.stderr + simulated.stdout
