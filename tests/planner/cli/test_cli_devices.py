"""``batchplan devices``: on this driver-less machine (a real subprocess), and with the fake NVIDIA driver
(the fake ``pynvml`` module of tests/torchkit) through ``planner.cli.main.main`` in-process."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli.devices import SCHEMA, local_node_inventory
from planner.cli.main import main
from planner.codec import encode
from planner.probing.inventory import torch_cuda_build
from torchkit.hardware.nvml import NvmlUnavailableError, read_local_inventory


def _load_fake_pynvml():
    path = Path(__file__).resolve().parents[2] / "torchkit" / "fake_pynvml.py"
    spec = importlib.util.spec_from_file_location("fake_pynvml_for_cli", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fake_pynvml = _load_fake_pynvml()


def _has_nvml() -> bool:
    try:
        read_local_inventory()
    except NvmlUnavailableError:
        return False
    return True


needs_no_driver = pytest.mark.skipif(_has_nvml(), reason="this machine has an NVIDIA driver")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "devices", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.fixture
def four_gpus(monkeypatch):
    fake = fake_pynvml.FakeNvml(fake_pynvml.mixed_load_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    return fake


# ------------------------------------------------------------------------------------------------ no driver


@needs_no_driver
def test_without_a_driver_it_lists_the_host_and_says_why_on_one_line():
    from torchkit.seed_api.device import get_cpu_info

    result = run_cli()
    assert result.returncode == 0
    stderr_lines = result.stderr.strip().splitlines()
    assert len(stderr_lines) == 1
    assert stderr_lines[0].startswith("warning: no NVIDIA driver/NVML found, listing the host only: ")
    assert "NVML Shared Library Not Found" in stderr_lines[0]
    stdout_lines = result.stdout.strip().splitlines()
    assert stdout_lines[0].startswith(f"{os.uname().nodename}: {get_cpu_info()}, {os.cpu_count()} CPUs, ")
    assert stdout_lines[1] == "no GPUs"


@needs_no_driver
def test_without_a_driver_json_has_no_devices_and_a_warning():
    result = run_cli("--json")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert document["schema"] == SCHEMA
    [node] = document["nodes"]
    assert node["devices"] == [] and node["selected"] == [] and node["skipped"] == []
    assert node["driver"] is None
    assert node["ray_node_id"] is None
    assert isinstance(node["probe_pid"], int)
    assert node["host"]["cpu_count"] == os.cpu_count()
    assert node["host"]["memory_total_bytes"] > 0
    [warning] = node["warnings"]
    assert warning.startswith("no NVIDIA driver/NVML found")


# ------------------------------------------------------------------------------------------------ fake driver


def test_table_lists_the_gpus_and_what_minus_one_would_pick(four_gpus, capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "; NVIDIA driver 550.54.15, CUDA 12.4" in out[0]
    assert out[1].split() == [
        "idx",
        "name",
        "memory",
        "GiB",
        "util",
        "temp",
        "power",
        "W",
        "processes",
        "selection",
    ]
    rows = out[2:6]
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]
    assert rows[0].split()[1:6] == ["Tesla", "V100-SXM2-16GB", "12.0/16.0", "85%", "71C"]
    assert f"{os.getpid()} " in rows[0]  # the process holding GPU 0, named through psutil
    assert rows[3].split()[3:7] == ["0.1/16.0", "-", "-", "-"]  # unknown utilisation, temperature, power
    assert rows[1].endswith("picked")
    assert rows[2].endswith("less idle than the GPUs picked")
    assert out[6] == "-1 would pick: GPU 1 (Tesla V100-SXM2-16GB)"


def test_json_selection_with_thresholds_gives_reasons(four_gpus, capsys):
    assert main(["devices", "--json", "--select", "all", "--max-utilization", "0.5"]) == 0
    [node] = json.loads(capsys.readouterr().out)["nodes"]
    assert [d["index"] for d in node["devices"]] == [0, 1, 2, 3]
    assert node["devices"][0]["utilization"] == pytest.approx(0.85)
    assert node["devices"][0]["memory_used_bytes"] == 12 * 2**30
    assert node["driver"] == {
        "nvml_version": "12.550.54.15",
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
        "torch_version": importlib.metadata.version("torch"),
        "torch_cuda_version": torch_cuda_build()[1],  # torch's build, read without importing torch
    }
    assert node["selected"] == [1, 2]
    assert node["skipped"] == [
        {"device_index": 0, "reason": "busy: 85% utilisation > 50%"},
        {"device_index": 3, "reason": "utilisation unknown (limit 50%)"},
    ]
    assert node["warnings"] == []


def test_explicit_select_is_shown_as_picked(four_gpus, capsys):
    assert main(["devices", "--select", "-1,-1"]) == 0
    out = capsys.readouterr().out
    assert "--select -1,-1 picks: GPU 1 (Tesla V100-SXM2-16GB), GPU 2 (Tesla V100-SXM2-16GB)" in out


def test_an_unmet_selection_is_a_warning_not_a_failure(four_gpus, capsys):
    assert (
        main(
            [
                "devices",
                "--json",
                "--select",
                "-1,-1,-1,-1",
                "--min-memory-fraction",
                "0.3",
                "--max-utilization",
                "1",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    [node] = json.loads(captured.out)["nodes"]
    assert node["selected"] == []
    unmet = "not used: selection '-1,-1,-1,-1' cannot be met"
    assert {s["device_index"]: s["reason"] for s in node["skipped"]} == {
        0: "only 3.5 GiB of 16.0 GiB free (< 30%)",
        1: unmet,
        2: unmet,
        3: unmet,
    }
    [warning] = captured.err.strip().splitlines()
    assert warning.startswith(
        "warning: GPU selection '-1,-1,-1,-1' asks for 4 idle GPUs, but only 3 of the node's 4 GPUs can be "
        "picked (1, 2, 3)"
    )
    assert node["warnings"] == [warning.removeprefix("warning: ")]


def test_an_unreadable_gpu_is_listed_as_a_warning(install_unreadable, capsys):
    assert main(["devices", "--json"]) == 0
    captured = capsys.readouterr()
    [node] = json.loads(captured.out)["nodes"]
    assert [d["index"] for d in node["devices"]] == [0, 1, 3]
    assert captured.err.strip() == (
        "warning: GPU 2 left out: NVML could not read its stats (NVMLError_GpuIsLost: GPU is lost)"
    )


@pytest.fixture
def install_unreadable(monkeypatch):
    gpus = fake_pynvml.mixed_load_gpus()
    gpus[2].lost = True
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNvml(gpus).module())


def test_local_node_inventory_defaults_to_all(four_gpus):
    node = local_node_inventory()
    assert node.selected == (0, 1, 2, 3)
    assert node.probe_pid == os.getpid()
    assert json.loads(json.dumps(encode(node)))["devices"][3]["index"] == 3


# ------------------------------------------------------------------------------------------------ bad flags


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-utilization", "1.5"], "error: --max-utilization must be a fraction in [0, 1], got 1.5"),
        (
            ["--min-memory-fraction", "-0.1"],
            "error: --min-memory-fraction must be a fraction in [0, 1], got -0.1",
        ),
        (["--select", "0,x"], "error: GPU selection '0,x': 'x' is not a GPU index or -1"),
        (["--select", "7"], "error: GPU selection '7' names GPU 7, but this node's GPUs are: 0, 1, 2, 3"),
    ],
)
def test_bad_values_exit_2_with_one_error_line(four_gpus, capsys, args, message):
    assert main(["devices", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--min-memory-fraction", "abc"],
            "error: argument --min-memory-fraction: invalid float value: 'abc'",
        ),
        (
            ["--cluster", "a.yaml", "--address", "auto"],
            "error: argument --address: not allowed with argument --cluster",
        ),
    ],
)
def test_malformed_flags_exit_2_with_an_error_line(capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["devices", *args])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith(message)
