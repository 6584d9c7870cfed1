"""planner.probing.node_entry: the node entry of ``batchplan devices --json`` (``batchplan/devices@1``), built
from an inventory or a failed probe, written and read back through planner.codec, and the table rendered from
the same entries."""

from __future__ import annotations

import json

import pytest

from planner.cli.devices import local_node_inventory, render_nodes
from planner.codec import decode, encode
from planner.errors import ConfigError
from planner.probing.inventory import HostInfo, NodeInventory, simulated_inventory
from planner.probing.node_entry import SCHEMA, DevicesDocument, failed_node_entry, node_entry
from tests.planner.probing.test_inventory import LAB
from torchkit.hardware.gpu_select import GpuSelection
from torchkit.hardware.nvml import GpuProcess, GpuStats

GIB = 2**30
NODE_KEYS = [
    "name",
    "simulated",
    "ray_node_id",
    "probe_pid",
    "driver",
    "host",
    "devices",
    "selected",
    "skipped",
    "warnings",
]
DEVICE_KEYS = [
    "index",
    "name",
    "uuid",
    "pci_bus_id",
    "memory_total_bytes",
    "memory_used_bytes",
    "memory_free_bytes",
    "utilization",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "processes",
    "gpu_type",
]


def written(entry) -> dict:
    """The entry as ``devices --json`` prints it (encoded, then through JSON text)."""
    return json.loads(json.dumps(encode(entry)))


def real_node() -> NodeInventory:
    stats = GpuStats(
        index=0,
        name="NVIDIA Mystery GPU",
        uuid="GPU-1234",
        pci_bus_id="00000000:3B:00.0",
        memory_total_bytes=24 * GIB,
        memory_used_bytes=GIB,
        memory_free_bytes=23 * GIB,
        utilization_fraction=None,
        temperature_c=61,
        power_w=210.5,
        power_limit_w=300.0,
        processes=(GpuProcess(pid=4242, name="python", used_memory_bytes=GIB), GpuProcess(pid=17)),
    )
    return NodeInventory(
        name="host1",
        simulated=False,
        devices=(stats,),
        gpu_types=(None,),
        selection=GpuSelection(selected=(0,), skipped=(), warnings=("selection warning",)),
        host=HostInfo(hostname="host1.example", cpu="Xeon", cpu_count=None, memory_total_bytes=None),
        driver={"driver_version": "550.54.15", "torch_cuda_version": None},
        warnings=("GPU 0 'NVIDIA Mystery GPU' is not in the GPU catalog",),
    )


def test_a_simulated_node_has_the_devices_json_node_shape_in_its_order():
    data = written(
        node_entry(simulated_inventory(LAB, select="-1,-1").with_probe(ray_node_id="r1", probe_pid=7))
    )
    assert list(data) == NODE_KEYS
    assert (data["name"], data["simulated"], data["ray_node_id"], data["probe_pid"], data["driver"]) == (
        "lab",
        True,
        "r1",
        7,
        None,
    )
    assert data["host"] == {
        "hostname": "lab",
        "cpu": "simulated",
        "cpu_count": 32,
        "memory_total_bytes": 256 * GIB,
    }
    assert data["selected"] == [1, 3]
    assert data["skipped"] == [
        {"device_index": 0, "reason": "less idle than the GPUs picked"},
        {"device_index": 2, "reason": "less idle than the GPUs picked"},
    ]
    assert data["warnings"] == []


def test_devices_are_the_gpu_stats_with_utilization_and_their_catalog_type():
    inventory = simulated_inventory(LAB)
    devices = written(node_entry(inventory))["devices"]
    assert [d["index"] for d in devices] == [0, 1, 2, 3]
    assert list(devices[0]) == DEVICE_KEYS
    first = inventory.devices[0]
    assert devices[0] == {
        "index": 0,
        "name": "RTX-A6000",
        "uuid": "GPU-sim-lab-0",
        "pci_bus_id": "",
        "memory_total_bytes": first.memory_total_bytes,
        "memory_used_bytes": 44 * GIB,
        "memory_free_bytes": first.memory_total_bytes - 44 * GIB,
        "utilization": 0.97,
        "temperature_c": None,
        "power_w": None,
        "power_limit_w": None,
        "processes": [],
        "gpu_type": "RTX-A6000",
    }


def test_a_real_node_keeps_its_driver_processes_unknown_types_and_all_warnings():
    data = written(node_entry(real_node()))
    assert data["simulated"] is False
    assert data["driver"] == {"driver_version": "550.54.15", "torch_cuda_version": None}
    [device] = data["devices"]
    assert (device["gpu_type"], device["utilization"], device["temperature_c"], device["power_w"]) == (
        None,
        None,
        61,
        210.5,
    )
    assert device["processes"] == [
        {"pid": 4242, "name": "python", "used_memory_bytes": GIB},
        {"pid": 17, "name": None, "used_memory_bytes": None},
    ]
    assert data["host"]["cpu_count"] is None
    # the inventory's own warnings first, then the selection's
    assert data["warnings"] == ["GPU 0 'NVIDIA Mystery GPU' is not in the GPU catalog", "selection warning"]


def test_a_failed_probe_is_a_node_without_host_or_devices_and_its_reason():
    data = written(failed_node_entry("node-3", simulated=True, reason="no answer in 60 s"))
    assert list(data) == NODE_KEYS
    assert (data["host"], data["devices"], data["selected"], data["warnings"]) == (
        None,
        [],
        [],
        ["probe failed: no answer in 60 s"],
    )


def test_the_local_node_has_the_same_keys():
    # `batchplan devices --json` on this machine (with or without a driver)
    assert list(written(local_node_inventory())) == NODE_KEYS


def test_a_devices_document_reads_back_as_the_entries_it_was_written_from():
    nodes = (
        node_entry(simulated_inventory(LAB, select="-1")),
        node_entry(real_node()),
        failed_node_entry("gone", simulated=False, reason="actor died"),
    )
    text = json.dumps(encode(DevicesDocument(nodes=nodes)))
    assert json.loads(text)["schema"] == SCHEMA == "batchplan/devices@1"
    assert decode(DevicesDocument, text, where="devices.json", fix="") == DevicesDocument(nodes=nodes)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda doc: doc.update(schema="batchplan/devices@2"),
            "schema must be one of batchplan/devices@1, got 'batchplan/devices@2'",
        ),
        (
            lambda doc: doc["nodes"][0]["devices"][1].update(utilization="high"),
            "nodes[0].devices[1].utilization must be int/float/null, got 'high'",
        ),
        (lambda doc: doc["nodes"][0].pop("selected"), "nodes[0] lacks the field 'selected'"),
    ],
)
def test_a_damaged_devices_document_is_one_error_naming_the_path(change, words):
    document = written(DevicesDocument(nodes=(node_entry(simulated_inventory(LAB)),)))
    change(document)
    with pytest.raises(ConfigError) as raised:
        decode(
            DevicesDocument,
            json.dumps(document),
            where="devices.json",
            fix="run batchplan devices --json again",
        )
    assert str(raised.value) == f"devices.json: {words} (run batchplan devices --json again)"


def test_the_table_lists_a_failed_node_after_the_others(capsys):
    nodes = [
        node_entry(simulated_inventory(LAB, select="-1")),
        failed_node_entry("gone", simulated=True, reason="actor died"),
    ]
    render_nodes(nodes, select="-1", explicit=False)
    out = capsys.readouterr().out
    assert out.startswith("lab: simulated, 32 CPUs, 256.0 GiB memory\n")
    assert "-1 would pick: GPU 1 (RTX-A6000)" in out
    assert out.endswith("\ngone: host unknown\nno GPUs\n")
