"""planner.runtime.rank_gpu: a rank started on another GPU than its entry was planned for is refused before any
collective, naming the ``--node-rank`` this machine has in the plan. NVML is faked at the ``pynvml`` module
boundary (tests/torchkit/fake_pynvml.py)."""

from __future__ import annotations

import sys

import pytest

from planner.errors import ConfigError
from planner.job import JobSpec
from planner.plan.build import build_plan
from planner.plan.io import write_plan
from planner.runtime.rank_plan import load_rank_plan
from tests.planner.plan.test_plan import PROFILES, SLOTS
from tests.torchkit import fake_pynvml
from torchkit.hardware.nvml import GpuStats
from torchkit.units import GIB


@pytest.fixture
def plan_path(tmp_path):
    """node-a: two A100-SXM4-80GB (node rank 0); node-b: two T4 (1); node-c: one V100 (2)."""
    return write_plan(build_plan(JobSpec(model="m"), SLOTS, PROFILES), tmp_path / "plan.json")


def _gpu(name: str, total_gib: float, index: int = 0) -> GpuStats:
    total = int(total_gib * GIB)
    return GpuStats(
        index=index, name=name, memory_total_bytes=total, memory_used_bytes=0, memory_free_bytes=total
    )


def _torchrun_env(rank: int, local_rank: int, node_rank: int, devices: str | None = None) -> dict[str, str]:
    env = {"RANK": str(rank), "WORLD_SIZE": "5", "LOCAL_RANK": str(local_rank), "GROUP_RANK": str(node_rank)}
    if devices is not None:
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=devices)
    return env


def test_a_t4_started_as_the_a100_node_is_refused_naming_the_t4_nodes_node_rank(plan_path):
    with pytest.raises(ConfigError) as refused:
        load_rank_plan(plan_path, env=_torchrun_env(0, 0, 0), gpu=_gpu("Tesla T4", 15))
    message = str(refused.value)
    assert "\n" not in message
    assert "rank 0 is planned for a A100-SXM4-80GB (80.0 GiB) on node 'node-a' (--node-rank 0)" in message
    assert "GPU 0 here is a Tesla T4 (15.0 GiB)" in message
    assert message.endswith(
        "node node-b (--node-rank 1) in the plan: start it with that node's line, --node-rank 1"
    )


def test_the_planned_gpu_passes_by_its_nvml_name_and_about_its_memory(plan_path):
    """ECC takes 1/16 of a T4's memory: 15 GiB planned, 16 GiB reported is still a T4."""
    assert load_rank_plan(plan_path, env=_torchrun_env(2, 0, 1), gpu=_gpu("Tesla T4", 16)).rank == 2
    assert (
        load_rank_plan(plan_path, env=_torchrun_env(0, 0, 0), gpu=_gpu("NVIDIA A100-SXM4-80GB", 80)).rank == 0
    )


def test_the_same_name_with_another_memory_size_is_refused(plan_path):
    with pytest.raises(
        ConfigError, match=r"here is a NVIDIA A100-SXM4-80GB \(40\.0 GiB\).*no node of the plan has"
    ):
        load_rank_plan(plan_path, env=_torchrun_env(0, 0, 0), gpu=_gpu("NVIDIA A100-SXM4-80GB", 40))


def test_a_gpu_no_node_of_the_plan_has_says_to_re_plan(plan_path):
    with pytest.raises(ConfigError, match=r"no node of the plan has a NVIDIA H100 80GB HBM3: re-plan"):
        load_rank_plan(plan_path, env=_torchrun_env(4, 0, 2), gpu=_gpu("NVIDIA H100 80GB HBM3", 80))


def _fake_nvml(monkeypatch, *names_gib: tuple[str, float]) -> None:
    gpus = [
        fake_pynvml.FakeGpu(
            name=name,
            uuid=f"GPU-{i:08d}",
            pci_bus_id=f"00000000:{i + 1:02X}:00.0",
            memory_total_bytes=int(gib * GIB),
        )
        for i, (name, gib) in enumerate(names_gib)
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNvml(gpus).module())


def test_under_its_nodes_device_list_the_rank_reads_its_gpu_through_nvml(plan_path, monkeypatch):
    """The A100 node's line run on a node of two T4s: its CUDA_VISIBLE_DEVICES is the A100 node's."""
    _fake_nvml(monkeypatch, ("Tesla T4", 15), ("Tesla T4", 15))
    env = _torchrun_env(1, 1, 0, devices="GPU-aaaa-0000,GPU-aaaa-0001")
    with pytest.raises(ConfigError, match=r"GPU 1 here is a Tesla T4 .* --node-rank 1$"):
        load_rank_plan(plan_path, env=env)
    assert load_rank_plan(plan_path, env=env, check_gpu=False).batch > 0  # the check can be turned off


def test_nvml_without_the_planned_device_index_is_refused(plan_path, monkeypatch):
    _fake_nvml(monkeypatch, ("Tesla T4", 15))
    with pytest.raises(
        ConfigError,
        match=r"planned on GPU 2 of node 'node-b', but this machine's NVML has no GPU 2 "
        r"\(it has 0\)",
    ):
        load_rank_plan(plan_path, env=_torchrun_env(3, 1, 1, devices="0,2"))


def test_outside_the_plans_device_list_or_without_nvml_the_gpu_is_not_checked(plan_path, monkeypatch):
    """A CPU run of a GPU plan (the gloo tests) is not under the node's device list; without a driver NVML
    cannot start: neither is refused."""
    _fake_nvml(monkeypatch, ("Tesla T4", 15))
    assert load_rank_plan(plan_path, env=_torchrun_env(0, 0, 0)).rank == 0
    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        fake_pynvml.FakeNvml([], init_error=fake_pynvml.NVMLError_LibraryNotFound).module(),
    )
    assert (
        load_rank_plan(plan_path, env=_torchrun_env(0, 0, 0, devices="GPU-aaaa-0000,GPU-aaaa-0001")).rank == 0
    )
