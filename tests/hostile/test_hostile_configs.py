"""Hostile and careless cluster configs: limits are checked before anything is built and named in the error,
huge or deep YAML never reaches a traceback, and YAML's float quirks give what the user meant."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import ConfigError
from tests.planner.cli_helpers import REPO_ROOT, assert_user_error, cli_env, run_cli
from torchkit.units import GIB

#: address space for a CLI subprocess that must fail on a limit, not by filling the machine: enough to import
#: the planner, far too little to build a billion GPU objects
SUBPROCESS_ADDRESS_SPACE_BYTES = 2 * GIB


def _config(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_node(gpu_entry: str = "{type: T4, count: 1}", extra: str = "") -> str:
    return f"nodes:\n  - name: node-a\n{extra}    gpus: [{gpu_entry}]\n"


def _limited_cli(*args, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``batchplan ARGS`` with its address space capped, so a failure to check a limit cannot hurt the machine."""

    def cap_memory() -> None:
        resource.setrlimit(
            resource.RLIMIT_AS, (SUBPROCESS_ADDRESS_SPACE_BYTES, SUBPROCESS_ADDRESS_SPACE_BYTES)
        )

    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *map(str, args)],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=cap_memory,
    )


@pytest.mark.slow
@pytest.mark.parametrize("count", [1_000_000_000_000, 5_000_000, 257])
def test_a_huge_gpu_count_is_refused_before_any_gpu_is_built(tmp_path, count) -> None:
    path = _config(tmp_path, _one_node(f"{{type: T4, count: {count}}}"))
    for command in (
        ("devices", "--cluster", path),
        ("plan", "--no-ray", "--cluster", path, "--model", "resnet18"),
    ):
        assert_user_error(_limited_cli(*command, cwd=tmp_path), 2, "count", "256")


def test_counts_add_up_to_the_per_node_limit(tmp_path) -> None:
    path = _config(tmp_path, _one_node("{type: T4, count: 200}, {type: A10, count: 57}"))
    with pytest.raises(ConfigError, match=r"gpus\[1\]\.count.*256"):
        load_cluster(path)


def test_too_many_nodes_is_refused_naming_the_limit(tmp_path) -> None:
    nodes = ", ".join(f"{{name: n{i}, gpus: [{{type: T4}}]}}" for i in range(16_385))
    with pytest.raises(ConfigError, match="16384"):
        load_cluster(_config(tmp_path, f"nodes: [{nodes}]\n"))


def test_a_huge_config_file_is_refused_before_it_is_read(tmp_path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as handle:
        handle.truncate(200 << 20)  # sparse: no disk, and must cost no memory
    assert_user_error(_limited_cli("devices", "--cluster", path, cwd=tmp_path), 2, "over the limit")


def test_deeply_nested_yaml_is_an_error_naming_the_limit(tmp_path) -> None:
    path = _config(tmp_path, "nodes:\n  - name: a\n    gpus: " + "[" * 5000 + "]" * 5000 + "\n")
    assert_user_error(run_cli("devices", "--cluster", path, cwd=tmp_path), 2, "nested", "limit")


def test_a_float_that_overflows_is_an_error_naming_the_range(tmp_path) -> None:
    path = _config(tmp_path, _one_node(extra="    host_memory_gib: 1.0e+308\n"))
    assert_user_error(run_cli("devices", "--cluster", path, cwd=tmp_path), 2, "host_memory_gib", "at most")


@pytest.mark.parametrize(("written", "gib"), [("5.12e2", 512.0), ("1e3", 1000.0), ("2.5E+1", 25.0)])
def test_exponent_floats_that_yaml_1_1_reads_as_strings_are_numbers(tmp_path, written, gib) -> None:
    """YAML 1.1 (PyYAML) takes ``1e3`` and ``5.12e2`` for strings; a user writing them means numbers."""
    cluster = load_cluster(_config(tmp_path, _one_node(extra=f"    host_memory_gib: {written}\n")))
    assert cluster.nodes[0].host_memory_bytes == round(gib * GIB)


def test_a_huge_exponent_float_is_out_of_range_not_a_string(tmp_path) -> None:
    with pytest.raises(ConfigError, match="host_memory_gib.*at most") as info:
        load_cluster(_config(tmp_path, _one_node(extra="    host_memory_gib: 1.0e300\n")))
    assert "got str" not in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_mib", 10**40),
        ("fp16_tflops", "1.0e+308"),
        ("bandwidth_gb_s", "1e300"),
        ("fp32_tflops", ".inf"),
    ],
)
def test_config_gpu_types_with_absurd_figures_are_refused(tmp_path, field, value) -> None:
    entry = {
        "name": "MY-GPU",
        "memory_mib": 24576,
        "fp16_tflops": 71,
        "bf16_tflops": 71,
        "fp32_tflops": 35.6,
        "bandwidth_gb_s": 936,
    }
    entry[field] = value
    fields = ", ".join(f"{k}: {v}" for k, v in entry.items())
    path = _config(tmp_path, f"gpu_types:\n  - {{{fields}}}\n" + _one_node("{type: MY-GPU}"))
    with pytest.raises(ConfigError, match=field):
        load_cluster(path)


def test_a_huge_cpu_count_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cpu_count.*at most"):
        load_cluster(_config(tmp_path, _one_node(extra=f"    cpu_count: {10**30}\n")))


def test_the_shipped_configs_stay_within_every_limit() -> None:
    for path in sorted((REPO_ROOT / "cluster_configs").glob("*.yaml")):
        if path.name != "gpus.yaml":
            assert load_cluster(path).nodes
