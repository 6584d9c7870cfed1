"""The small things a new user trips over (issue #15, item 9), each checked as the user meets it: --debug after
the command, ``profile`` refusing plan-only flags, a config's ``gpu_types`` copied from gpus.yaml, config
errors reported together, a node without ``cpu_count``, uniform left out with the reason, the README's schema.
(The progress wording over Ray and the ``--address`` node count are in ``test_cli_running_ray.py``.)
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from planner.cli.devices import render_nodes
from planner.cluster import load_cluster
from planner.errors import ConfigError
from planner.probing.inventory import HostInfo
from planner.probing.node_entry import NodeEntry
from tests.planner.cli_helpers import (
    CONFIGS,
    DEMO_MIXED,
    REPO_ROOT,
    TINY_MODEL,
    assert_ok,
    assert_user_error,
    describe,
    run_cli,
)


def test_debug_is_accepted_after_the_command(tmp_path: Path) -> None:
    result = run_cli(
        "plan", "--debug", "--no-ray", "--cluster", tmp_path / "missing.yaml", *TINY_MODEL, cwd=tmp_path
    )
    assert result.returncode == 2, describe(result)
    assert "Traceback" in result.stderr  # --debug took effect
    assert result.stderr.strip().splitlines()[-1].startswith("error: cluster config")


def test_debug_before_the_command_still_works(tmp_path: Path) -> None:
    result = run_cli(
        "--debug", "plan", "--no-ray", "--cluster", tmp_path / "missing.yaml", *TINY_MODEL, cwd=tmp_path
    )
    assert result.returncode == 2 and "Traceback" in result.stderr, describe(result)


@pytest.mark.parametrize(
    "flag",
    [
        ("--mode", "max"),
        ("--gpus", "-1,-1"),
        ("--global-batch", "64"),
        ("--min-batch", "4"),
        ("--max-utilization", "0.2"),
    ],
)
def test_profile_refuses_flags_that_only_shape_a_plan(flag: tuple[str, str], tmp_path: Path) -> None:
    result = run_cli("profile", "--gpu", "T4", *TINY_MODEL, *flag, cwd=tmp_path)
    assert_user_error(result, 2, f"{flag[0]} applies to plan and preflight, not to profile", "batchplan plan")


def test_a_gpu_types_entry_copied_from_the_catalog_file_works(tmp_path: Path) -> None:
    catalog = yaml.safe_load((CONFIGS / "gpus.yaml").read_text())["gpus"]
    entry = {**catalog["T4"], "aliases": ["Tesla T4 custom"]}  # gpus.yaml's form: name -> entry
    config = tmp_path / "lab.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gpu_types": {"T4-CUSTOM": entry},
                "nodes": [{"name": "n0", "gpus": [{"type": "T4-CUSTOM", "count": 2}]}],
            }
        )
    )
    cluster = load_cluster(config)
    assert [g.spec.name for g in cluster.nodes[0].gpus] == ["T4-CUSTOM", "T4-CUSTOM"]
    assert cluster.catalog.resolve("Tesla T4 custom").name == "T4-CUSTOM"
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        config,
        *TINY_MODEL,
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        cwd=tmp_path,
    )
    assert_ok(result)
    assert "T4-CUSTOM" in result.stdout


def test_config_errors_are_reported_together(tmp_path: Path) -> None:
    config = tmp_path / "lab.yaml"
    config.write_text(
        textwrap.dedent("""\
        nodes:
          - name: a
            gpus: [{type: A100-80, count: 2}]
          - name: b
            cpus: 8
            gpus: [{type: T4}]
          - name: c
            gpus: [{type: T4, count: 0}]
        """)
    )
    with pytest.raises(ConfigError) as info:
        load_cluster(config)
    message = str(info.value)
    assert message.startswith(f"{config}: 3 problems: [1] nodes[0].gpus[0].type: GPU type 'A100-80'")
    assert "[2] nodes[1].cpus: unknown key 'cpus'" in message and "[3] nodes[2].gpus[0].count" in message
    result = run_cli("plan", "--no-ray", "--cluster", config, *TINY_MODEL, cwd=tmp_path)
    assert_user_error(result, 2, "3 problems", "nodes[0]", "nodes[1]", "nodes[2]")


def test_a_node_without_cpu_count_does_not_print_none(capsys: pytest.CaptureFixture[str]) -> None:
    node = NodeEntry(
        name="n0",
        simulated=True,
        ray_node_id=None,
        probe_pid=None,
        driver=None,
        host=HostInfo(hostname="n0", cpu="simulated", cpu_count=None, memory_total_bytes=None),
        devices=(),
        selected=(),
        skipped=(),
        warnings=(),
    )
    render_nodes([node], select="all", explicit=False)
    out = capsys.readouterr().out
    assert "None" not in out
    assert out.startswith("n0: simulated, CPU count unknown, memory unknown")


def test_uniform_left_out_of_the_comparison_says_why(tmp_path: Path) -> None:
    # 6 ranks, global batch 1000: no equal split, so plain DDP cannot be compared, and the plan says so
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        DEMO_MIXED,
        *TINY_MODEL,
        "--global-batch",
        "1000",
        "--cache-dir",
        tmp_path / "cache",
        "--no-write",
        cwd=tmp_path,
    )
    assert_ok(result)
    notes = result.stdout.split("\nnotes:\n", 1)[1]
    assert (
        "'uniform' (plain DDP) is not compared: global batch 1000 does not split into 6 equal per-rank batches "
        "(a multiple of 6 would, e.g. 996 or 1002)"
    ) in notes


def test_readme_documents_the_cluster_config_schema_no_ray_and_global_options() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    schema = readme[readme.index("## Cluster configs") :]
    for key in (
        "name:",
        "gpu_types:",
        "nodes:",
        "cpu_count:",
        "host_memory_gib:",
        "gpus:",
        "type:",
        "count:",
        "used_memory_gib:",
        "utilization:",
    ):
        assert key in schema, key
    for flag in ("--no-ray", "--debug", "--version", "--max-utilization", "--min-memory-fraction"):
        assert re.search(rf"`[^`]*{flag}[^`]*`", readme), flag
