"""``batchplan advise`` as a user runs it: the --json front, the table with its plan lines, --pick writing a
plan that ``batchplan show`` reads, a front point's plan line reproducing that plan when run, --plot, and bad
input as one error line with exit 2."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.planner.cli_helpers import (
    PNG_MAGIC,
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    check_plan,
    parse_json_stdout,
    run_cli,
)

OFFERS = """\
networks:
  ib: {gbps: 400, latency_us: 14}
  slow: {gbps: 1, latency_us: 50}
offers:
  - {name: big, gpu: A100-SXM4-80GB, gpus_per_node: 4, max_nodes: 2, price_per_node_hour: 11.16, network: ib,
     source: "test price", date: 2026-11-09}
  - {name: small, gpu: T4, gpus_per_node: 1, max_nodes: 3, price_per_node_hour: 0.35, network: ib, intra: pcie,
     source: "test price", date: 2026-11-09}
  - {name: cheap, gpu: L4, gpus_per_node: 1, max_nodes: 3, price_per_node_hour: 0.8, network: slow,
     source: "test price", date: 2026-11-09}
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("advise")
    (path / "offers.yaml").write_text(OFFERS)
    return path


def _advise(workdir, *extra, **kwargs):
    return run_cli(
        "advise",
        "--offers",
        "offers.yaml",
        *TINY_MODEL,
        "--cache-dir",
        "cache",
        *extra,
        cwd=workdir,
        **kwargs,
    )


@pytest.fixture(scope="module")
def picked(workdir):
    result = _advise(workdir, "--json", "--pick", "1", "-o", "picked.json", "--epoch-samples", "50000")
    assert_ok(result)
    return parse_json_stdout(result)


def test_json_gives_the_front_with_counts_and_plan_lines(picked):
    doc = picked
    assert doc["schema"] == "batchplan/advise@1"
    # big: 0-2 nodes, small: 0-3 (at most 16 GPUs), cheap: 1-3 on its own network
    assert doc["candidates"] == 3 * 4 - 1 + 3
    assert (
        1 <= doc["evaluated"] <= doc["candidates"] and doc["evaluated"] + doc["pruned"] == doc["candidates"]
    )
    front = doc["front"]
    assert front and [p["rank"] for p in front] == list(range(1, len(front) + 1))
    for point in front:
        for key in (
            "cluster",
            "gpus",
            "time_per_epoch_s",
            "cost_per_epoch_usd",
            "samples_per_s",
            "plan_command",
            "time_per_epoch_range_s",
            "uncalibrated",
            "cluster_file",
        ):
            assert key in point
        assert point["time_per_epoch_s"] == pytest.approx(50000 / point["samples_per_s"])
        assert point["cost_per_epoch_usd"] == pytest.approx(
            point["time_per_epoch_s"] * point["price_per_hour_usd"] / 3600
        )
        assert shlex.split(point["plan_command"])[:2] == ["batchplan", "plan"]
    times = [p["time_per_epoch_s"] for p in front]
    costs = [p["cost_per_epoch_usd"] for p in front]
    assert times == sorted(times) and costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    assert isinstance(doc["rejected"], list)


def test_pick_writes_a_plan_that_show_reads(workdir, picked):
    plan = check_plan(json.loads((workdir / "picked.json").read_text()))
    assert plan["world_size"] == picked["front"][0]["gpus"]
    assert plan["throughput_samples_per_s"] == pytest.approx(picked["front"][0]["samples_per_s"], rel=1e-12)
    assert_ok(run_cli("show", "picked.json", cwd=workdir))


@pytest.mark.slow
def test_a_front_points_plan_line_reproduces_its_plan(workdir, picked):
    point = picked["front"][-1]  # the cheapest
    argv = shlex.split(point["plan_command"])
    result = run_cli(*argv[1:], cwd=workdir, console_script=True)
    assert_ok(result)
    plan = check_plan(json.loads((workdir / argv[argv.index("-o") + 1]).read_text()))
    assert plan["throughput_samples_per_s"] == pytest.approx(point["samples_per_s"], rel=1e-12)
    assert plan["world_size"] == point["gpus"]
    assert plan["global_batch"] == point["global_batch"]


def test_the_table_lists_the_front_its_plan_lines_and_the_counts(workdir):
    result = _advise(workdir, "--budget-per-hour", "5", "--write-clusters", "table-clusters")
    assert_ok(result)
    out = result.stdout
    assert "Pareto front for tests.planner.tiny_models:convnet" in out
    assert "#1: batchplan plan --cluster table-clusters/" in out
    assert "over --budget-per-hour 5" in out  # the big offer's candidates, one line each
    assert out.strip().splitlines()[-1].startswith("candidates 14, planned")
    assert "planned" in result.stderr and "profile of" in result.stderr


def test_plot_writes_a_png(workdir):
    pytest.importorskip("matplotlib")
    assert_ok(_advise(workdir, "--plot", "front.png", "--json"))
    assert (workdir / "front.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize(
    ("offers", "words"),
    [
        (OFFERS.replace("max_nodes: 2", "max_nodez: 2"), ("offers.yaml: offers[0].max_nodez", "unknown key")),
        (OFFERS.replace("network: slow", "network: fast"), ("offers[2].network", "not one of networks")),
        (OFFERS.replace("gpu: T4", "gpu: T9"), ("offers[1].gpu", "T9")),
    ],
)
def test_a_bad_offers_file_is_one_error_line_and_exit_2(tmp_path, offers, words):
    (tmp_path / "offers.yaml").write_text(offers)
    assert_user_error(_advise(tmp_path), 2, *words)
    assert not (tmp_path / "advise-clusters").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--max-gpus", "0"), ("--max-gpus 0",)),
        (("--deadline", "-1"), ("--deadline",)),
        (("--epoch-samples", "0"), ("--epoch-samples",)),
        (("--gpus", "0"), ("--gpus", "whole rented nodes")),
    ],
)
def test_bad_flags_are_one_error_line_and_exit_2(workdir, flags, words):
    assert_user_error(_advise(workdir, *flags), 2, *words)


def test_a_missing_offers_file_and_a_pick_past_the_front_are_exit_2(tmp_path, workdir):
    assert_user_error(
        run_cli("advise", "--offers", "none.yaml", *TINY_MODEL, cwd=tmp_path),
        2,
        "none.yaml",
        "does not exist",
    )
    assert_user_error(_advise(workdir, "--pick", "99", "-o", "never.json"), 2, "--pick 99")
    assert not (workdir / "never.json").exists()
