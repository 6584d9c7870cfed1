"""YAML that stays under the byte limit and would still explode: alias bombs, aliased huge values, huge flow
lists, the stated limits and one past them. Each is refused on the event stream, before a tree is composed,
with an error naming the limit; the memory that costs is measured (tracemalloc, so machine load cannot
change it), the time is a benchmark (``bench/bench_config_limits.py``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from planner.cluster import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE, MAX_NODES, load_cluster
from planner.errors import ConfigError
from planner.plan.validate import MAX_PLAN_RANKS
from tests.hostile.hostile_yaml import OVER_THE_LIMIT, nodes_of
from tests.hostile.test_hostile_configs import _limited_cli
from tests.planner.cli_helpers import assert_user_error
from torchkit.hardware.configio import parse_yaml_text
from torchkit.hardware.yaml_limits import MAX_YAML_ALIASES, DocumentLimits, TotalLimit

#: Python memory a refused config may cost (the goal is < 100 MiB for the whole process; its text is in it)
REFUSAL_PEAK_BYTES = 64 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(OVER_THE_LIMIT))
def test_an_over_the_limit_config_is_refused_on_the_event_stream(tmp_path, case) -> None:
    make, words = OVER_THE_LIMIT[case]
    path = tmp_path / "cluster.yaml"
    path.write_text(make())
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as info:
            load_cluster(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert len(message) < 400, message  # nothing of the expanded value is rendered
    assert peak < REFUSAL_PEAK_BYTES + 2 * path.stat().st_size, f"{case}: {peak / 2**20:.0f} MiB"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["alias bomb as node names", "16,384 aliases of a 1 MiB name"])
def test_the_cli_refuses_an_alias_bomb_in_one_line(tmp_path, case) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(OVER_THE_LIMIT[case][0]())
    for command in (
        ("devices", "--cluster", path),
        ("plan", "--no-ray", "--cluster", path, "--model", "resnet18"),
    ):
        assert_user_error(_limited_cli(*command, cwd=tmp_path), 2, "aliases", "limit")


def test_the_stated_limits_are_the_plans_limits() -> None:
    assert MAX_CLUSTER_GPUS == MAX_PLAN_RANKS
    assert MAX_NODES * 4 == MAX_CLUSTER_GPUS  # the largest config that plans: 16,384 nodes of 4 GPUs
    assert MAX_GPUS_PER_NODE == 256


@pytest.mark.slow
def test_a_config_at_every_limit_is_read(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(nodes_of(MAX_NODES, MAX_CLUSTER_GPUS // MAX_NODES))
    cluster = load_cluster(path)
    assert len(cluster.nodes) == MAX_NODES and cluster.num_gpus == MAX_CLUSTER_GPUS


def test_one_gpu_past_the_total_is_refused(tmp_path) -> None:
    text = nodes_of(MAX_NODES, MAX_CLUSTER_GPUS // MAX_NODES) + "  - {name: extra, gpus: [{type: T4}]}\n"
    with pytest.raises(ConfigError, match="GPUs in all.*65536"):
        load_cluster(_write(tmp_path, text))


def test_aliases_and_merge_keys_within_the_limits_still_work(tmp_path) -> None:
    text = (
        "nodes:\n"
        "  - &base {name: a, gpus: &pair [{type: T4, count: 2}]}\n"
        "  - {<<: *base, name: b}\n"
        "  - {name: c, gpus: *pair}\n"
    )
    cluster = load_cluster(_write(tmp_path, text))
    assert [(n.name, len(n.gpus)) for n in cluster.nodes] == [("a", 2), ("b", 2), ("c", 2)]


def test_the_alias_count_is_bounded_even_for_tiny_values() -> None:
    text = "a: &x 1\nb: [" + ", ".join(["*x"] * (MAX_YAML_ALIASES + 1)) + "]\n"
    with pytest.raises(ConfigError, match=f"more than {MAX_YAML_ALIASES} aliases"):
        parse_yaml_text(text, "t.yaml")


def test_entry_limits_name_the_place() -> None:
    limits = DocumentLimits(max_entries={"nodes[].gpus": 2}, default_max_entries=3)
    parse_yaml_text("nodes: [{gpus: [1, 2]}]\n", "t.yaml", limits=limits)
    with pytest.raises(ConfigError, match=r"nodes\[\]\.gpus holds more than 2 entries"):
        parse_yaml_text("nodes: [{gpus: [1, 2, 3]}]\n", "t.yaml", limits=limits)
    with pytest.raises(ConfigError, match="name holds more than 3 entries"):
        parse_yaml_text("name: [1, 2, 3, 4]\n", "t.yaml", limits=limits)
    with pytest.raises(ConfigError, match="top level holds more than 3"):
        parse_yaml_text("{a: 1, b: 2, c: 3, d: 4}\n", "t.yaml", limits=limits)


def test_a_total_counts_the_default_where_the_key_is_absent() -> None:
    limits = DocumentLimits(
        total=TotalLimit(entries="g[]", key="count", default=1, limit=3, max_each=3, what="GPUs")
    )
    parse_yaml_text("g: [{count: 2}, {type: x}]\n", "t.yaml", limits=limits)
    with pytest.raises(ConfigError, match="more than 3 GPUs"):
        parse_yaml_text("g: [{count: 2}, {type: x}, {}]\n", "t.yaml", limits=limits)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path
