"""`batchplan catalog`: the table and the batchplan/catalog@1 JSON, in-process and as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.cli.main import main
from torchkit.hardware.catalog import load_catalog

MIB = 2**20


def test_catalog_table_lists_every_type(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "GPU" in lines[1] and "memory GiB" in lines[1] and "bandwidth GB/s" in lines[1]
    catalog = load_catalog()
    assert len(lines) == 2 + len(catalog)
    t4_row = next(line for line in lines if line.startswith("T4 "))
    assert t4_row.split()[:8] == ["T4", "15.0", "65", "-", "8.1", "320", "no", "7.5"]
    assert t4_row.rstrip().endswith("Tesla T4")
    h200_row = next(line for line in lines if line.startswith("H200-SXM-141GB"))
    assert h200_row.split()[1:7] == ["140.4", "989.4", "989.4", "66.9", "4800", "yes"]


def test_catalog_json_matches_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "batchplan/catalog@1"
    catalog = load_catalog()
    assert [gpu["name"] for gpu in doc["gpus"]] == list(catalog.names())
    a100 = next(gpu for gpu in doc["gpus"] if gpu["name"] == "A100-SXM4-80GB")
    assert a100["memory_bytes"] == 81920 * MIB
    assert a100["memory_bandwidth_bytes_per_s"] == 2039e9
    assert a100["bf16_tflops"] == 312.0 and a100["supports_bf16"] is True
    assert "NVIDIA A100-SXM4-80GB" in a100["aliases"]
    t4 = next(gpu for gpu in doc["gpus"] if gpu["name"] == "T4")
    assert t4["bf16_tflops"] is None and t4["supports_bf16"] is False
    assert all(gpu["source"] for gpu in doc["gpus"])


def test_catalog_with_a_cluster_lists_its_gpu_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "lab.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            gpu_types:
              - {name: MY-GPU, memory_mib: 8192, fp16_tflops: 20, bf16_tflops: null, fp32_tflops: 10,
                 bandwidth_gb_s: 400, aliases: [Vendor X]}
            nodes:
              - {name: n0, gpus: [{type: MY-GPU}]}
            """
        )
    )
    assert main(["catalog", "--json", "--cluster", str(config)]) == 0
    names = [gpu["name"] for gpu in json.loads(capsys.readouterr().out)["gpus"]]
    assert names[-1] == "MY-GPU" and "T4" in names


def test_catalog_with_a_bad_cluster_is_one_error_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["catalog", "--cluster", str(tmp_path / "missing.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("error: cluster config ") and "missing.yaml does not exist" in captured.err


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # as a user runs it: the installed package, no PYTHONPATH, from a directory that is not the checkout
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_catalog_json_as_a_subprocess(tmp_path: Path) -> None:
    # run from an unrelated directory: the catalog is found through the installed package, not the cwd
    result = _run([sys.executable, "-m", "planner.cli.main", "catalog", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "batchplan/catalog@1"
    assert len(doc["gpus"]) == len(load_catalog())


@pytest.mark.skipif(shutil.which("batchplan") is None, reason="console script not installed")
def test_batchplan_console_script_prints_the_catalog(tmp_path: Path) -> None:
    result = _run([str(shutil.which("batchplan")), "catalog", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema"] == "batchplan/catalog@1"
