"""Joining a Ray cluster started with ``ray start`` (issue #23, item 1): with Ray's token authentication on
(and off), by ``--address HOST:PORT``, ``--address auto`` and with no ``--address``; a cluster that wants a
token none of which is found here is one error line with the fix, at once, not 20 s of ``InvalidAuthToken``.

The cluster is a real head and a second raylet, each started by ``ray start --block`` on 127.0.0.1 with a
private HOME and TMPDIR (``tests/planner/ray_start.py``), stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.planner.cli_helpers import TINY_MODEL, describe, parse_json_stdout, run_cli_process
from tests.planner.ray_start import RayStartCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[RayStartCluster]:
    cluster = RayStartCluster(auth=True, num_workers=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def test_plan_by_host_port_joins_both_raylets_with_the_token_file(
    auth_cluster: RayStartCluster, tmp_path: Path
) -> None:
    result = run_cli_process(
        "plan",
        "--address",
        auth_cluster.address,
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        cwd=tmp_path,
        env=auth_cluster.env(),
        timeout=300,
    )
    # this machine has no GPU: both nodes are probed and the plan is infeasible (exit 1), said in one line
    assert result.returncode == 1, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert "InvalidAuthToken" not in result.stderr, describe(result)
    assert "uses token authentication: joining with the token from" in result.stderr, describe(result)
    assert _last_line(result.stderr).startswith("error: no usable GPU"), describe(result)


def test_devices_by_auto_sees_both_nodes(auth_cluster: RayStartCluster, tmp_path: Path) -> None:
    result = run_cli_process(
        "devices", "--address", "auto", "--json", cwd=tmp_path, env=auth_cluster.env(), timeout=300
    )
    assert result.returncode == 0, describe(result)
    assert "InvalidAuthToken" not in result.stderr, describe(result)
    report = parse_json_stdout(result)
    assert len(report["nodes"]) == 2, report
    assert len({node["ray_node_id"] for node in report["nodes"]}) == 2, report  # two raylets, one host


def test_plan_without_address_joins_the_running_cluster_with_its_token(
    auth_cluster: RayStartCluster, tmp_path: Path
) -> None:
    result = run_cli_process(
        "plan",
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        cwd=tmp_path,
        env=auth_cluster.env(),
        timeout=300,
    )
    assert result.returncode == 1, describe(result)
    assert f"found a running Ray cluster at {auth_cluster.address}" in result.stderr, describe(result)
    assert "InvalidAuthToken" not in result.stderr, describe(result)
    assert _last_line(result.stderr).startswith("error: no usable GPU"), describe(result)


def test_a_missing_token_is_one_line_that_says_where_to_put_it(
    auth_cluster: RayStartCluster, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "home-without-token"
    elsewhere.mkdir()
    result = run_cli_process(
        "plan",
        "--address",
        auth_cluster.address,
        *TINY_MODEL,
        "--no-write",
        cwd=tmp_path,
        env={**auth_cluster.env(), "HOME": str(elsewhere)},
        timeout=120,
    )
    assert result.returncode == 2, describe(result)
    assert "InvalidAuthToken" not in result.stderr and "gcs_client" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(
        f"error: the Ray cluster at '{auth_cluster.address}' requires an authentication token"
    ), describe(result)
    assert "RAY_AUTH_TOKEN" in lines[-1] and str(elsewhere / ".ray" / "auth_token") in lines[-1]
    assert "firewall" not in result.stderr


def test_a_wrong_token_is_named_as_rejected(auth_cluster: RayStartCluster, tmp_path: Path) -> None:
    result = run_cli_process(
        "devices",
        "--address",
        auth_cluster.address,
        cwd=tmp_path,
        env={**auth_cluster.env(), "RAY_AUTH_TOKEN": "0" * 64},
        timeout=120,
    )
    assert result.returncode == 2, describe(result)
    assert _last_line(result.stderr).startswith(
        f"error: the Ray cluster at '{auth_cluster.address}' rejected the authentication token from "
        "RAY_AUTH_TOKEN"
    ), describe(result)


def test_a_cluster_without_auth_is_joined_by_host_port_as_before(tmp_path: Path) -> None:
    cluster = RayStartCluster(auth=False, num_workers=0)
    try:
        result = run_cli_process(
            "devices", "--address", cluster.address, "--json", cwd=tmp_path, env=cluster.env(), timeout=300
        )
    finally:
        cluster.stop()
    assert result.returncode == 0, describe(result)
    assert len(parse_json_stdout(result)["nodes"]) == 1
