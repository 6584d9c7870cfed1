"""planner.probing.inventory: simulated_inventory (selection with thresholds), lookups, the torch build of a
real node. Its node entry for ``batchplan devices --json``: test_node_entry.py."""

from __future__ import annotations

import pytest

from planner.cluster import NodeSpec, SimulatedGpu, load_cluster
from planner.probing.inventory import HostInfo, simulated_inventory
from planner.probing.node_entry import node_entry
from torchkit.errors import ConfigError
from torchkit.hardware.catalog import load_catalog
from torchkit.hardware.gpu_select import GpuSelection

GIB = 2**30
CATALOG = load_catalog()


def gpu(
    index: int, type_name: str = "RTX-A6000", used_gib: float = 0.0, utilization: float = 0.0
) -> SimulatedGpu:
    return SimulatedGpu(
        index=index,
        spec=CATALOG.get(type_name),
        used_memory_bytes=int(used_gib * GIB),
        utilization_fraction=utilization,
    )


#: GPU 0 busy and nearly full, 1 idle, 2 half full and lightly used, 3 idle: the most idle are 1 and 3
LAB = NodeSpec(
    name="lab",
    gpus=(gpu(0, used_gib=44, utilization=0.97), gpu(1), gpu(2, used_gib=23.5, utilization=0.10), gpu(3)),
    cpu_count=32,
    host_memory_bytes=256 * GIB,
)


# ---------------------------------------------------------------------------------------------- simulated_inventory


def test_simulated_inventory_reports_every_gpu_from_the_config():
    inv = simulated_inventory(LAB)
    total = CATALOG.get("RTX-A6000").memory_bytes
    assert inv.name == "lab"
    assert inv.simulated is True
    assert inv.driver is None
    assert inv.gpu_types == ("RTX-A6000",) * 4
    assert [d.index for d in inv.devices] == [0, 1, 2, 3]
    first = inv.devices[0]
    assert first.name == "RTX-A6000"
    assert first.uuid == "GPU-sim-lab-0"
    assert first.memory_total_bytes == total
    assert first.memory_used_bytes == 44 * GIB
    assert first.memory_free_bytes == total - 44 * GIB
    assert first.utilization_fraction == 0.97
    assert inv.host == HostInfo(hostname="lab", cpu="simulated", cpu_count=32, memory_total_bytes=256 * GIB)
    assert inv.warnings == ()


def test_all_without_thresholds_selects_every_gpu():
    inv = simulated_inventory(LAB)
    assert inv.selection == GpuSelection(selected=(0, 1, 2, 3), skipped=())


def test_a_busy_gpu_is_skipped_with_the_threshold_it_breaches():
    inv = simulated_inventory(LAB, max_utilization_fraction=0.5)
    assert inv.selection.selected == (1, 2, 3)
    assert inv.selection.skipped == ((0, "busy: 97% utilisation > 50%"),)


def test_a_gpu_short_of_free_memory_is_skipped_with_the_figures():
    inv = simulated_inventory(LAB, min_free_memory_fraction=0.6)
    assert inv.selection.selected == (1, 3)
    reasons = dict(inv.selection.skipped)
    assert set(reasons) == {0, 2}
    assert reasons[2].startswith("only 24.5 GiB of 48.0 GiB free (< 60%)")
    assert "busy" not in reasons[2]


def test_both_thresholds_give_both_reasons():
    inv = simulated_inventory(LAB, min_free_memory_fraction=0.5, max_utilization_fraction=0.5)
    assert (
        dict(inv.selection.skipped)[0] == "busy: 97% utilisation > 50%; only 4.0 GiB of 48.0 GiB free (< 50%)"
    )


def test_minus_one_twice_picks_the_two_most_idle_gpus():
    inv = simulated_inventory(LAB, select="-1,-1")
    assert inv.selection.selected == (1, 3)
    assert dict(inv.selection.skipped) == {
        0: "less idle than the GPUs picked",
        2: "less idle than the GPUs picked",
    }


def test_minus_one_picks_the_most_idle_gpu_meeting_the_thresholds():
    inv = simulated_inventory(LAB, select="-1", max_utilization_fraction=0.5)
    assert inv.selection.selected == (1,)
    assert dict(inv.selection.skipped) == {
        0: "busy: 97% utilisation > 50%",
        2: "less idle than the GPUs picked",
        3: "less idle than the GPUs picked",
    }


def test_a_selection_that_cannot_be_met_is_an_empty_selection_with_a_warning():
    inv = simulated_inventory(LAB, select="-1,-1,-1,-1", max_utilization_fraction=0.5)
    assert inv.selection.selected == ()
    skipped = dict(inv.selection.skipped)
    assert skipped[0] == "busy: 97% utilisation > 50%"
    assert skipped[1] == skipped[2] == skipped[3] == "not used: selection '-1,-1,-1,-1' cannot be met"
    (warning,) = inv.selection.warnings
    assert warning.startswith(
        "GPU selection '-1,-1,-1,-1' asks for 4 idle GPUs, but only 3 of the node's 4 GPUs"
    )
    assert "ask for fewer GPUs or relax the thresholds" in warning
    assert node_entry(inv).warnings == (warning,)


def test_explicit_indices_are_used_as_given_and_the_rest_not_requested():
    inv = simulated_inventory(LAB, select="3,1")
    assert inv.selection.selected == (3, 1)
    assert dict(inv.selection.skipped) == {0: "not requested", 2: "not requested"}


def test_an_explicit_busy_gpu_is_used_with_a_warning():
    inv = simulated_inventory(LAB, select="0", max_utilization_fraction=0.5)
    assert inv.selection.selected == (0,)
    assert inv.selection.warnings == (
        "GPU 0 is used as requested although it does not meet the thresholds: busy: 97% utilisation > 50%",
    )


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("7", "names GPU 7, but this node's GPUs are: 0, 1, 2, 3"),
        ("zero", "'zero' is not a GPU index or -1"),
        ("", "empty GPU selection"),
    ],
)
def test_a_malformed_or_impossible_explicit_selection_is_a_config_error(select, message):
    with pytest.raises(ConfigError, match=message):
        simulated_inventory(LAB, select=select)


def test_a_threshold_outside_zero_to_one_is_a_config_error():
    with pytest.raises(ConfigError, match="max_utilization_fraction must be a fraction in"):
        simulated_inventory(LAB, max_utilization_fraction=1.5)


def test_shipped_shared_node_config_selects_the_idle_pair():
    node = load_cluster("shared-node").nodes[0]
    inv = simulated_inventory(node, select="-1,-1")
    assert inv.selection.selected == (0, 1)
    busy = simulated_inventory(node, max_utilization_fraction=0.5)
    assert busy.selection.skipped == ((3, "busy: 97% utilisation > 50%"),)


# ---------------------------------------------------------------------------------------------- lookups


def test_device_and_gpu_type_look_up_by_nvml_index():
    inv = simulated_inventory(NodeSpec(name="n", gpus=(gpu(0, "T4"), gpu(1, "L4"))))
    assert inv.device(1).name == "L4"
    assert inv.gpu_type(0) == "T4"
    with pytest.raises(KeyError):
        inv.device(5)
    with pytest.raises(KeyError):
        inv.gpu_type(5)


def test_with_probe_records_the_probe_and_changes_nothing_else():
    inv = simulated_inventory(LAB)
    probed = inv.with_probe(ray_node_id="abc123", probe_pid=4242)
    assert (probed.ray_node_id, probed.probe_pid) == ("abc123", 4242)
    assert probed.devices == inv.devices and probed.selection == inv.selection
    assert (inv.ray_node_id, inv.probe_pid) == (None, None)


@pytest.mark.slow
def test_the_cuda_build_of_torch_is_read_without_importing_it():
    import subprocess
    import sys

    from planner.probing.inventory import torch_cuda_build

    assert torch_cuda_build("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n") == (True, None)
    assert torch_cuda_build("__version__ = '2.5.1+cu124'\ncuda: Optional[str] = '12.4'\n") == (True, "12.4")
    assert torch_cuda_build("cuda = '11.8'\n") == (True, "11.8")
    assert torch_cuda_build("cuda = get_cuda()\n") == (False, None)  # not a literal: unknown
    assert torch_cuda_build("def (:\n") == (False, None)
    code = (
        "import sys; from planner.probing.inventory import torch_cuda_build; known, cuda = torch_cuda_build(); "
        "assert 'torch' not in sys.modules; import torch; assert known and cuda == torch.version.cuda"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_real_node_reads_whether_its_torch_has_cuda(monkeypatch):
    import sys

    from planner.probing import inventory
    from tests.torchkit import fake_pynvml
    from torchkit.hardware.catalog import load_catalog

    gpus = [fake_pynvml.FakeGpu(name="Tesla T4", uuid="GPU-00000000", pci_bus_id="00000000:01:00.0")]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml.FakeNvml(gpus).module())
    monkeypatch.setattr(inventory, "torch_cuda_build", lambda: (True, None))
    found = inventory.real_inventory(load_catalog())
    assert found.torch_without_cuda and found.driver["torch_cuda_version"] is None
    monkeypatch.setattr(inventory, "torch_cuda_build", lambda: (True, "12.4"))
    assert not inventory.real_inventory(load_catalog()).torch_without_cuda
    monkeypatch.setattr(
        inventory, "torch_cuda_build", lambda: (False, None)
    )  # unknown: auto decides in the probe
    unknown = inventory.real_inventory(load_catalog())
    assert not unknown.torch_without_cuda and "torch_cuda_version" not in unknown.driver
