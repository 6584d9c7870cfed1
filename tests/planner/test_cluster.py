"""Cluster configs: every shipped example loads; each malformed input is a ConfigError naming file, path, fix."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from planner.cluster import (
    ClusterSpec,
    load_cluster,
    parse_cluster,
    shipped_cluster_configs,
)
from torchkit.errors import ConfigError
from torchkit.hardware.catalog import load_catalog

GIB = 2**30
MIB = 2**20
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "cluster_configs"
EXAMPLES = sorted(p for p in REPO_CONFIGS.glob("*.yaml") if p.name != "gpus.yaml")


def write(tmp_path: Path, text: str, name: str = "lab.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


GOOD = textwrap.dedent(
    """\
    name: mixed-lab
    nodes:
      - name: node-a
        cpu_count: 64
        host_memory_gib: 512
        gpus: [{type: A100-SXM4-80GB, count: 2}]
      - name: node-b
        gpus:
          - {type: V100-SXM2-16GB, count: 2}
          - {type: T4, count: 1, used_memory_gib: 9.5, utilization: 0.85}
    """
)


# ---- shipped examples --------------------------------------------------------------------------------------


def test_there_are_shipped_examples() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"homogeneous-a100", "demo-mixed", "consumer-lab", "shared-node", "mixed-64"} <= names
    assert set(shipped_cluster_configs()) == names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_shipped_config_loads(path: Path) -> None:
    cluster = load_cluster(path)
    assert cluster.name == path.stem
    assert cluster.nodes and cluster.num_gpus > 0
    assert path.read_text().startswith("#"), "each example starts with a comment saying what it models"
    for node in cluster.nodes:
        assert [gpu.index for gpu in node.gpus] == list(range(len(node.gpus)))
        for gpu in node.gpus:
            assert 0 <= gpu.used_memory_bytes <= gpu.total_memory_bytes
            assert 0.0 <= gpu.utilization_fraction <= 1.0


def test_demo_mixed_is_three_nodes_of_two_gpus() -> None:
    cluster = load_cluster("demo-mixed")  # a shipped example by name
    assert [(n.name, len(n.gpus), n.gpus[0].spec.name) for n in cluster.nodes] == [
        ("node-a100", 2, "A100-SXM4-80GB"),
        ("node-v100", 2, "V100-SXM2-16GB"),
        ("node-t4", 2, "T4"),
    ]


def test_homogeneous_and_scale_examples_have_the_documented_shape() -> None:
    homogeneous = load_cluster(REPO_CONFIGS / "homogeneous-a100.yaml")
    assert homogeneous.gpu_type_counts() == {"A100-SXM4-80GB": 16}
    assert len(homogeneous.nodes) == 2
    fleet = load_cluster(REPO_CONFIGS / "mixed-64.yaml")
    assert len(fleet.nodes) == 64
    assert fleet.num_gpus == sum(fleet.gpu_type_counts().values()) == 416
    assert len(fleet.gpu_type_counts()) == 6


def test_shared_node_has_idle_half_full_and_busy_cards() -> None:
    (node,) = load_cluster("shared-node.yaml").nodes
    used_gib = [gpu.used_memory_bytes / GIB for gpu in node.gpus]
    assert used_gib == [0.0, 0.0, 23.5, 44.0]
    assert [gpu.utilization_fraction for gpu in node.gpus] == [0.0, 0.0, 0.10, 0.97]


# ---- a good config, expanded -------------------------------------------------------------------------------------


def test_config_expands_counts_into_indexed_gpus(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, GOOD))
    assert cluster.name == "mixed-lab"
    assert cluster.source_path == str(tmp_path / "lab.yaml")
    node_a, node_b = cluster.nodes
    assert node_a.cpu_count == 64 and node_a.host_memory_bytes == 512 * GIB
    assert node_b.cpu_count is None and node_b.host_memory_bytes is None
    assert [(g.index, g.spec.name) for g in node_b.gpus] == [
        (0, "V100-SXM2-16GB"),
        (1, "V100-SXM2-16GB"),
        (2, "T4"),
    ]
    busy = node_b.gpus[2]
    assert busy.used_memory_bytes == round(9.5 * GIB)
    assert busy.utilization_fraction == 0.85
    assert busy.free_memory_bytes == 15360 * MIB - round(9.5 * GIB)
    assert node_b.gpus[0].used_memory_bytes == 0 and node_b.gpus[0].utilization_fraction == 0.0
    assert cluster.num_gpus == 5
    assert cluster.node("node-b") is node_b
    with pytest.raises(KeyError):
        cluster.node("node-z")


def test_count_defaults_to_one_and_name_to_the_file_stem(tmp_path: Path) -> None:
    cluster = load_cluster(
        write(tmp_path, "nodes: [{name: n0, gpus: [{type: Tesla T4}]}]\n", name="tiny.yaml")
    )
    assert cluster.name == "tiny"
    assert [g.spec.name for g in cluster.nodes[0].gpus] == ["T4"]  # NVML alias accepted as a type


def test_parse_cluster_takes_parsed_data_and_a_label() -> None:
    data = {"name": "x", "nodes": [{"name": "n0", "gpus": [{"type": "L4", "count": 4}]}]}
    cluster = parse_cluster(data, "<inline>")
    assert cluster.source_path == "<inline>" and cluster.num_gpus == 4
    with pytest.raises(ConfigError, match=r"^<inline>: nodes\[0\]\.gpus\[0\]\.type: "):
        parse_cluster({"nodes": [{"name": "n0", "gpus": [{"type": "L5"}]}]}, "<inline>")


def test_cluster_spec_survives_pickling(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, GOOD))
    copy = pickle.loads(pickle.dumps(cluster))
    assert isinstance(copy, ClusterSpec) and copy == cluster


# ---- gpu_types: config-defined types ---------------------------------------------------------------------------

CUSTOM = """\
    gpu_types:
      - name: MY-GPU
        aliases: ["Vendor X 24G"]
        memory_mib: 24576
        fp16_tflops: 100
        bf16_tflops: null
        fp32_tflops: 20
        bandwidth_gb_s: 700
        compute_capability: "7.5"
    nodes:
      - name: n0
        gpus: [{type: my-gpu, count: 2}, {type: A10G}]
"""


def test_config_defined_gpu_types_can_be_used(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, CUSTOM))
    gpus = cluster.nodes[0].gpus
    assert [g.spec.name for g in gpus] == ["MY-GPU", "MY-GPU", "A10G"]
    assert gpus[0].spec.memory_bytes == 24576 * MIB
    assert gpus[0].spec.bf16_tflops is None and not gpus[0].spec.supports_bf16
    assert gpus[0].spec.memory_bandwidth_bytes_per_s == 700e9
    assert cluster.catalog.get("Vendor X 24G").name == "MY-GPU"
    assert "MY-GPU" not in load_catalog()  # the shipped catalog is untouched


def test_gpu_type_repeating_a_catalog_entry_unchanged_is_accepted() -> None:
    t4 = {
        "name": "T4",
        "aliases": ["Tesla T4"],
        "compute_capability": "7.5",
        "memory_mib": 15360,
        "fp16_tflops": 65.0,
        "bf16_tflops": None,
        "fp32_tflops": 8.1,
        "bandwidth_gb_s": 320,
        "source": load_catalog().get("T4").source,
    }
    data = {"gpu_types": [t4], "nodes": [{"name": "n0", "gpus": [{"type": "T4"}]}]}
    assert parse_cluster(data, "x.yaml").nodes[0].gpus[0].spec == load_catalog().get("T4")


def test_gpu_type_clashing_with_the_catalog_is_an_error(tmp_path: Path) -> None:
    text = CUSTOM.replace("name: MY-GPU", "name: T4")
    with pytest.raises(
        # the nodes still name MY-GPU: that is the second of the problems reported together
        ConfigError,
        match=r"lab\.yaml: 2 problems: \[1\] gpu_types\[0\]\.name: GPU type 'T4' clashes with catalog "
        r"type T4 .*; \[2\] nodes\[0\]\.gpus\[0\]\.type: GPU type 'my-gpu' is not in the catalog",
    ):
        load_cluster(write(tmp_path, text))


def test_gpu_type_entry_is_checked_like_a_catalog_entry(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lab\.yaml: gpu_types\[0\]\.bf16_tflops: missing required key"):
        load_cluster(write(tmp_path, CUSTOM.replace("        bf16_tflops: null\n", "")))
    with pytest.raises(
        ConfigError, match=r"gpu_types\[0\]\.memory_gib: unknown key.*allowed keys: name, memory_mib"
    ):
        load_cluster(write(tmp_path, CUSTOM.replace("memory_mib", "memory_gib")))
    with pytest.raises(ConfigError, match=r"gpu_types\[0\]\.name: missing required key 'name'"):
        load_cluster(
            write(tmp_path, CUSTOM.replace("      - name: MY-GPU\n        aliases", "      - aliases"))
        )


# ---- errors ----------------------------------------------------------------------------------------------------------


def edit(old: str, new: str) -> str:
    """GOOD with ``old`` replaced by ``new`` (which must be there: a no-op edit would test nothing)."""
    assert old in GOOD, old
    return GOOD.replace(old, new)


def node_b_gpu(entry: str) -> str:
    """GOOD with node-b's first GPU entry replaced (that entry's path is nodes[1].gpus[0])."""
    return edit("{type: V100-SXM2-16GB, count: 2}", entry)


BAD_CONFIGS = [
    # unknown keys, with the allowed ones listed
    ("zone: us-east\n" + GOOD, r"zone: unknown key 'zone' \(allowed keys: nodes, name, gpu_types, network\)"),
    (
        edit("cpu_count: 64", "cpus: 64"),
        r"nodes\[0\]\.cpus: unknown key 'cpus' \(allowed keys: name, gpus, cpu_count, host_memory_gib, intra, network; did you mean 'cpu_count'\?\)",
    ),
    (  # two unknown keys in one node: both named at once (one was reported per run)
        edit("cpu_count: 64", "cpus: 64\n    zone: a"),
        r"nodes\[0\]: unknown keys 'cpus' \(did you mean 'cpu_count'\?\), 'zone' \(allowed keys: name, gpus, ",
    ),
    (
        node_b_gpu("{type: T4, cnt: 2}"),
        r"nodes\[1\]\.gpus\[0\]\.cnt: unknown key 'cnt' \(allowed keys: type, count, used_memory_gib, utilization",
    ),
    # unknown GPU type: close matches and the fix
    (
        node_b_gpu("{type: A100-80, count: 2}"),
        r"nodes\[1\]\.gpus\[0\]\.type: GPU type 'A100-80' is not in the catalog \(close matches: A100-SXM4-80GB.*; or add it under gpu_types: in a cluster config\)",
    ),
    (
        node_b_gpu("{type: 4090, count: 2}"),
        r"nodes\[1\]\.gpus\[0\]\.type: expected a non-empty string, got int 4090 \(quote it",
    ),
    # counts
    (node_b_gpu("{type: T4, count: 0}"), r"nodes\[1\]\.gpus\[0\]\.count: must be at least 1, got 0"),
    (node_b_gpu("{type: T4, count: -2}"), r"nodes\[1\]\.gpus\[0\]\.count: must be at least 1, got -2"),
    (
        node_b_gpu("{type: T4, count: 2.5}"),
        r"nodes\[1\]\.gpus\[0\]\.count: expected an integer, got float 2\.5",
    ),
    (node_b_gpu("{type: T4, count: '2'}"), r"nodes\[1\]\.gpus\[0\]\.count: expected an integer, got str '2'"),
    (
        node_b_gpu("{type: T4, count: true}"),
        r"nodes\[1\]\.gpus\[0\]\.count: expected an integer, got bool True",
    ),
    (
        node_b_gpu("{type: T4, count: 300}"),
        r"nodes\[1\]\.gpus\[0\]\.count: must be at most 256, got int 300 \(a node holds at most 256",
    ),
    # fractions and memory
    (
        node_b_gpu("{type: T4, utilization: 1.5}"),
        r"nodes\[1\]\.gpus\[0\]\.utilization: must be at most 1, got 1\.5 \(a fraction, e\.g\. 0\.85 for 85%\)",
    ),
    (node_b_gpu("{type: T4, utilization: -0.1}"), r"nodes\[1\]\.gpus\[0\]\.utilization: must be at least 0"),
    (
        node_b_gpu("{type: T4, utilization: 85%}"),
        r"nodes\[1\]\.gpus\[0\]\.utilization: expected a number, got str '85%'",
    ),
    (
        node_b_gpu("{type: T4, used_memory_gib: 16}"),
        r"nodes\[1\]\.gpus\[0\]\.used_memory_gib: 16 GiB in use exceeds the 15\.00 GiB total of a T4 \(use at most 15\.00\)",
    ),
    (
        node_b_gpu("{type: T4, used_memory_gib: -1}"),
        r"nodes\[1\]\.gpus\[0\]\.used_memory_gib: must be at least 0",
    ),
    (edit("cpu_count: 64", "cpu_count: 0"), r"nodes\[0\]\.cpu_count: must be at least 1, got 0"),
    (
        edit("host_memory_gib: 512", "host_memory_gib: -5"),
        r"nodes\[0\]\.host_memory_gib: must be greater than 0, got -5 \(in GiB\)",
    ),
    # names
    (
        edit("name: node-b", "name: node-a"),
        r"nodes\[1\]\.name: duplicate node name 'node-a' \(also nodes\[0\]; names must be unique\)",
    ),
    (
        edit("name: node-b", "name: 'node b'"),
        r"nodes\[1\]\.name: node name 'node b' may hold only letters",
    ),
    (edit("name: mixed-lab", "name: ''"), r"lab\.yaml: name: expected a non-empty string"),
    # missing keys and empty lists
    ("name: x\n", r"lab\.yaml: nodes: missing required key 'nodes'"),
    (
        edit("  - name: node-b\n", "  - \n"),
        r"nodes\[1\]\.name: missing required key 'name' \(e\.g\. name: node-a\)",
    ),
    (
        edit("    gpus: [{type: A100-SXM4-80GB, count: 2}]\n", ""),
        r"nodes\[0\]\.gpus: missing required key 'gpus'",
    ),
    (node_b_gpu("{count: 2}"), r"nodes\[1\]\.gpus\[0\]\.type: missing required key 'type'"),
    (
        "name: x\nnodes: []\n",
        r"lab\.yaml: nodes: is empty \(expected a list of nodes with at least one entry\)",
    ),
    ("nodes:\n  - {name: n0, gpus: []}\n", r"nodes\[0\]\.gpus: is empty"),
    (
        "nodes:\n  - {name: n0, gpus: {type: T4}}\n",
        r"nodes\[0\]\.gpus: expected a list of \{type, count\} entries, got dict",
    ),
    ("nodes:\n  - n0\n", r"nodes\[0\]: expected a node mapping, got str 'n0'"),
    # top level
    ("- name: n0\n", r"lab\.yaml: expected a mapping with name: and nodes:, got list"),
    ("just text\n", r"lab\.yaml: expected a mapping with name: and nodes:, got str"),
    ("", r"lab\.yaml: is empty \(expected a mapping with name: and nodes:\)"),
    # YAML itself
    ("name: x\nnodes:\n  - {name: n0, gpus: [{type: T4}\n", r"lab\.yaml:4: YAML syntax error"),
    (
        "name: x\nname: y\nnodes: []\n",
        r"lab\.yaml:2: YAML syntax error: found duplicate key 'name' \(first defined on line 1; keep one\)",
    ),
]


@pytest.mark.parametrize(("text", "pattern"), BAD_CONFIGS)
def test_bad_config_is_a_config_error_naming_file_path_and_fix(
    tmp_path: Path, text: str, pattern: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_cluster(path)
    assert str(info.value).startswith(str(path)), "the message starts with the file"


def test_unknown_type_in_the_second_node_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nodes\[1\]\.gpus\[0\]\.type") as info:
        load_cluster(write(tmp_path, node_b_gpu("{type: A100-80GB, count: 1}")))
    assert "lab.yaml" in str(info.value)
    assert "or add it under gpu_types:" in str(info.value)


def test_missing_file_lists_the_shipped_examples(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"cluster config .*nope\.yaml does not exist \(check the path; shipped examples: .*demo-mixed",
    ):
        load_cluster(tmp_path / "nope.yaml")


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not a file"):
        load_cluster(tmp_path)


def test_a_config_error_is_a_user_error_with_exit_code_2(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_cluster(tmp_path / "nope.yaml")
    assert info.value.exit_code == 2


def test_importing_planner_cluster_stays_cheap() -> None:
    code = "import sys, planner.cluster; bad = {'torch', 'ray', 'pynvml'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("gpu_type", ["T4\u202e", "T4\x1b[31m", "T4\nnodes: []"])
def test_a_gpu_type_that_is_not_one_line_of_visible_text_is_refused(gpu_type):
    """Issue #34: U+202E in a GPU type name reached the terminal."""
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.gpus\[0\]\.type: .* holds the character \\"):
        parse_cluster({"nodes": [{"name": "a", "gpus": [{"type": gpu_type}]}]}, "c.yaml")
