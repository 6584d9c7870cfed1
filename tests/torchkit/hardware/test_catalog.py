"""The GPU catalog: the shipped gpus.yaml is complete and sane, lookups by name/alias, strict loading."""

from __future__ import annotations

import pickle
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from torchkit.errors import ConfigError
from torchkit.hardware.catalog import (
    GpuCatalog,
    GpuSpec,
    default_catalog_path,
    gpu_spec_to_dict,
    load_catalog,
)

MIB = 2**20

CANONICAL_TYPES = (
    "T4",
    "V100-SXM2-16GB",
    "V100-SXM2-32GB",
    "A10",
    "A10G",
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "L4",
    "L40S",
    "H100-SXM5-80GB",
    "H100-PCIe-80GB",
    "H200-SXM-141GB",
    "RTX-2080Ti",
    "RTX-3090",
    "RTX-4090",
    "RTX-A6000",
    # issue #32: every GPU type of the Hopper/Ada/Turing calibration rows, and the MLPerf anchors
    "L40",
    "RTX-4080",
    "Quadro-RTX-6000",
    "A30",
    "A40",
    "V100-PCIe-32GB",
    # Lambda's PyTorch benchmark rows (issue #32 follow-up)
    "Quadro-RTX-8000",
    "RTX-6000-Ada",
)

# names NVML reports (nvmlDeviceGetName) -> the catalog type they must map to
NVML_NAMES = {
    "Tesla T4": "T4",
    "Tesla V100-SXM2-16GB": "V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB": "V100-SXM2-32GB",
    "Tesla V100-PCIE-16GB": "V100-PCIe-16GB",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": "A10G",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIe-40GB",
    "NVIDIA A100 80GB PCIe": "A100-PCIe-80GB",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 80GB HBM3": "H100-SXM5-80GB",
    "NVIDIA H100 PCIe": "H100-PCIe-80GB",
    "NVIDIA H200": "H200-SXM-141GB",
    "NVIDIA GeForce RTX 2080 Ti": "RTX-2080Ti",
    "NVIDIA GeForce RTX 3090": "RTX-3090",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA RTX A6000": "RTX-A6000",
    "NVIDIA L40": "L40",
    "NVIDIA GeForce RTX 4080": "RTX-4080",
    "Quadro RTX 6000": "Quadro-RTX-6000",
    "Quadro RTX 8000": "Quadro-RTX-8000",
    "NVIDIA RTX 6000 Ada Generation": "RTX-6000-Ada",
    "NVIDIA A30": "A30",
    "NVIDIA A40": "A40",
    "Tesla V100-PCIE-32GB": "V100-PCIe-32GB",
    "A100-SXM4-40GB": "A100-SXM4-40GB",  # drivers before R460 had no "NVIDIA " prefix
    "GeForce RTX 3090": "RTX-3090",
}

# memory.total as nvidia-smi/NVML report it (MiB), spot checks of the figures in gpus.yaml
DRIVER_MEMORY_MIB = {
    "T4": 15360,
    "A100-SXM4-80GB": 81920,
    "H100-SXM5-80GB": 81559,
    "H200-SXM-141GB": 143771,
    "RTX-3090": 24576,
    "L4": 23034,
    "Quadro-RTX-8000": 49152,  # Lambda's sys_pytorch.txt of its Quadro RTX 8000 and RTX 6000 Ada runs
    "RTX-6000-Ada": 49140,
}


def write(tmp_path: Path, text: str, name: str = "gpus.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


GOOD_ENTRY = """\
    MY-GPU:
      aliases: ["My Vendor GPU"]
      compute_capability: "8.6"
      memory_mib: 24576
      fp16_tflops: 71.0
      bf16_tflops: 71.0
      fp32_tflops: 35.6
      bandwidth_gb_s: 936
      source: test
"""


# ---- the shipped catalog ---------------------------------------------------------------------------------


def test_shipped_catalog_holds_every_canonical_type(catalog: GpuCatalog) -> None:
    missing = [name for name in CANONICAL_TYPES if name not in catalog.names()]
    assert missing == []
    assert len(catalog) >= len(CANONICAL_TYPES)
    assert catalog.source == str(default_catalog_path())


def test_default_catalog_path_is_the_packaged_gpus_yaml() -> None:
    path = default_catalog_path()
    assert path.name == "gpus.yaml"
    assert path.parent.name == "cluster_configs"
    assert path.is_file()


def test_default_catalog_is_loaded_once(catalog: GpuCatalog) -> None:
    assert load_catalog() is catalog


@pytest.mark.parametrize("name", CANONICAL_TYPES)
def test_catalog_entry_is_sane(catalog: GpuCatalog, name: str) -> None:
    spec = catalog.get(name)
    assert spec.name == name
    assert spec.memory_bytes > 0 and spec.memory_bytes % MIB == 0
    assert spec.fp16_tflops >= spec.fp32_tflops > 0
    assert spec.memory_bandwidth_bytes_per_s >= 100e9  # every listed card has at least 300 GB/s
    assert spec.source.strip()
    assert spec.aliases
    major, minor = (int(part) for part in spec.compute_capability.split("."))
    pre_ampere = major < 8
    # BF16 tensor cores arrived with Ampere (compute capability 8.0)
    assert (spec.bf16_tflops is None) == pre_ampere
    assert spec.supports_bf16 == (not pre_ampere)
    if spec.bf16_tflops is not None:
        assert spec.bf16_tflops == spec.fp16_tflops  # Ampere and later: same dense rate for both


def test_bf16_is_missing_exactly_on_the_pre_ampere_types(catalog: GpuCatalog) -> None:
    without_bf16 = {spec.name for spec in catalog if spec.bf16_tflops is None}
    assert without_bf16 == {
        "T4",
        "V100-SXM2-16GB",
        "V100-SXM2-32GB",
        "V100-PCIe-16GB",
        "V100-PCIe-32GB",
        "RTX-2080Ti",
        "Quadro-RTX-6000",
        "Quadro-RTX-8000",
    }


@pytest.mark.parametrize(("name", "mib"), DRIVER_MEMORY_MIB.items())
def test_memory_is_what_the_driver_reports(catalog: GpuCatalog, name: str, mib: int) -> None:
    assert catalog.get(name).memory_bytes == mib * MIB


def test_units_are_converted_to_bytes(catalog: GpuCatalog) -> None:
    t4 = catalog.get("T4")
    assert t4.memory_bytes == 15360 * 2**20
    assert t4.memory_bandwidth_bytes_per_s == 320e9
    assert t4.peak_flops_per_s("fp16") == 65e12
    assert t4.peak_flops_per_s("off") == pytest.approx(8.1e12)
    with pytest.raises(ValueError, match="no bf16"):
        t4.peak_flops_per_s("bf16")


@pytest.mark.parametrize(("nvml_name", "expected"), NVML_NAMES.items())
def test_nvml_names_resolve_to_their_type(catalog: GpuCatalog, nvml_name: str, expected: str) -> None:
    assert catalog.get(nvml_name).name == expected


def test_every_alias_resolves_back_to_its_type(catalog: GpuCatalog) -> None:
    for spec in catalog:
        for alias in spec.aliases:
            assert catalog.resolve(alias) is spec
            assert catalog.resolve(alias.upper()) is spec
            assert catalog.resolve(f"  {alias.lower()}  ") is spec


def test_no_name_or_alias_is_shared_by_two_types(catalog: GpuCatalog) -> None:
    owner: dict[str, str] = {}
    for spec in catalog:
        for label in (spec.name, *spec.aliases):
            key = label.casefold()
            assert owner.setdefault(key, spec.name) == spec.name, (
                f"{label} is used by {owner[key]} and {spec.name}"
            )


# ---- lookups -----------------------------------------------------------------------------------------------


def test_lookup_is_case_insensitive(catalog: GpuCatalog) -> None:
    assert catalog.get("a100-sxm4-80gb").name == "A100-SXM4-80GB"
    assert catalog.get("tesla   t4").name == "T4"
    assert "rtx-4090" in catalog
    assert "RTX-9999" not in catalog


def test_unknown_type_lists_close_matches_and_the_fix(catalog: GpuCatalog) -> None:
    assert catalog.resolve("A100-80") is None
    with pytest.raises(ConfigError, match=r"'A100-80' is not in the catalog") as info:
        catalog.get("A100-80")
    message = str(info.value)
    assert "close matches: A100-SXM4-80GB" in message
    assert "or add it under gpu_types:" in message


def test_unknown_type_without_close_matches_lists_the_known_types(catalog: GpuCatalog) -> None:
    with pytest.raises(ConfigError, match=r"known: T4, V100-SXM2-16GB.*or add it under gpu_types:"):
        catalog.get("zzzz")


def test_close_matches_prefer_names_containing_the_query(catalog: GpuCatalog) -> None:
    assert catalog.close_matches("h100") == ["H100-SXM5-80GB", "H100-PCIe-80GB"]
    assert catalog.close_matches("A100")[:4] == [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "A100-PCIe-40GB",
        "A100-PCIe-80GB",
    ]
    assert catalog.close_matches("") == []


# ---- with_types and construction ------------------------------------------------------------------------------


def make_spec(name: str = "MY-GPU", **changes: object) -> GpuSpec:
    fields: dict = dict(
        name=name,
        aliases=("My Vendor GPU",),
        memory_bytes=24576 * MIB,
        fp16_tflops=71.0,
        bf16_tflops=71.0,
        fp32_tflops=35.6,
        memory_bandwidth_bytes_per_s=936e9,
        compute_capability="8.6",
        source="test",
    )
    fields.update(changes)
    return GpuSpec(**fields)


def test_with_types_adds_config_defined_types(catalog: GpuCatalog) -> None:
    extended = catalog.with_types([make_spec()])
    assert extended.get("my-gpu").memory_bytes == 24576 * MIB
    assert extended.get("My Vendor GPU").name == "MY-GPU"
    assert extended.names()[-1] == "MY-GPU"
    assert len(extended) == len(catalog) + 1
    assert "MY-GPU" not in catalog  # the original is unchanged


def test_with_types_accepts_an_identical_copy_of_a_catalog_type(catalog: GpuCatalog) -> None:
    assert catalog.with_types([catalog.get("T4")]) == catalog


def test_with_types_rejects_a_different_spec_under_an_existing_name(catalog: GpuCatalog) -> None:
    changed = replace(catalog.get("T4"), memory_bytes=16384 * MIB)
    with pytest.raises(ConfigError, match=r"'T4' clashes with catalog type T4.*new name"):
        catalog.with_types([changed])
    with pytest.raises(ConfigError, match=r"'tesla t4' clashes with catalog type T4"):
        catalog.with_types([make_spec("tesla t4")])


def test_with_types_rejects_an_alias_owned_by_another_type(catalog: GpuCatalog) -> None:
    with pytest.raises(ConfigError, match=r"'NVIDIA L4' of MY-GPU is already used by L4"):
        catalog.with_types([make_spec(aliases=("NVIDIA L4",))])


def test_catalog_rejects_a_key_that_differs_from_the_spec_name() -> None:
    with pytest.raises(ConfigError, match="differs from its spec's name"):
        GpuCatalog(types={"OTHER": make_spec()})


def test_catalog_survives_pickling(catalog: GpuCatalog) -> None:
    # Ray ships cluster specs (which hold the catalog) to its actors
    copy = pickle.loads(pickle.dumps(catalog))
    assert copy == catalog
    assert hash(copy) == hash(catalog)
    assert copy.get("Tesla T4") == catalog.get("T4")


def test_catalog_types_are_read_only(catalog: GpuCatalog) -> None:
    with pytest.raises(TypeError):
        catalog.types["X"] = make_spec()  # type: ignore[index]


def test_gpu_spec_to_dict_uses_bytes_and_keeps_null_bf16(catalog: GpuCatalog) -> None:
    data = gpu_spec_to_dict(catalog.get("T4"))
    assert data["memory_bytes"] == 15360 * MIB
    assert data["bf16_tflops"] is None
    assert data["supports_bf16"] is False
    assert data["aliases"] == ["Tesla T4"]


# ---- strict loading of a catalog file ---------------------------------------------------------------------------


def test_custom_catalog_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus:\n" + GOOD_ENTRY)
    loaded = load_catalog(path)
    assert loaded.names() == ("MY-GPU",)
    assert loaded.get("my vendor gpu") == make_spec()
    assert loaded.source == str(path)


def test_unquoted_compute_capability_is_read_as_text(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus:\n" + GOOD_ENTRY.replace('"8.6"', "8.0"))
    assert load_catalog(path).get("MY-GPU").compute_capability == "8.0"


def test_optional_keys_may_be_left_out(tmp_path: Path) -> None:
    entry = "\n".join(
        line
        for line in GOOD_ENTRY.splitlines()
        if not line.strip().startswith(("aliases", "compute", "source"))
    )
    spec = load_catalog(write(tmp_path, "gpus:\n" + entry + "\n")).get("MY-GPU")
    assert spec.aliases == () and spec.compute_capability == "" and spec.source == ""


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (
            lambda e: e.replace("memory_mib", "memory_gb"),
            r"gpus\.MY-GPU\.memory_gb: unknown key 'memory_gb' \(allowed keys: memory_mib",
        ),
        (
            lambda e: e.replace("      memory_mib: 24576\n", ""),
            r"gpus\.MY-GPU\.memory_mib: missing required key 'memory_mib'",
        ),
        (
            lambda e: e.replace("      bf16_tflops: 71.0\n", ""),
            r"gpus\.MY-GPU\.bf16_tflops: missing required key.*null if the GPU has no BF16",
        ),
        (
            lambda e: e.replace("24576", "24.5"),
            r"gpus\.MY-GPU\.memory_mib: expected an integer, got float 24\.5",
        ),
        (lambda e: e.replace("24576", "0"), r"gpus\.MY-GPU\.memory_mib: must be at least 1"),
        (
            lambda e: e.replace("fp16_tflops: 71.0", "fp16_tflops: fast"),
            r"gpus\.MY-GPU\.fp16_tflops: expected a number, got str 'fast'",
        ),
        (
            lambda e: e.replace("fp32_tflops: 35.6", "fp32_tflops: true"),
            r"gpus\.MY-GPU\.fp32_tflops: expected a number, got bool",
        ),
        (
            lambda e: e.replace("bf16_tflops: 71.0", "bf16_tflops: -1"),
            r"gpus\.MY-GPU\.bf16_tflops: must be greater than 0.*null if",
        ),
        (
            lambda e: e.replace("bandwidth_gb_s: 936", "bandwidth_gb_s: .nan"),
            r"gpus\.MY-GPU\.bandwidth_gb_s: expected a number",
        ),
        (
            lambda e: e.replace('"8.6"', '"sm86"'),
            r'gpus\.MY-GPU\.compute_capability: expected a version like "8\.0"',
        ),
        (
            lambda e: e.replace('["My Vendor GPU"]', '"My Vendor GPU"'),
            r"gpus\.MY-GPU\.aliases: expected a list of names",
        ),
        (
            lambda e: e.replace('["My Vendor GPU"]', '["ok", 3]'),
            r"gpus\.MY-GPU\.aliases\[1\]: expected a non-empty string",
        ),
    ],
)
def test_bad_catalog_entry_is_a_config_error_naming_file_and_path(
    tmp_path: Path, mutate, pattern: str
) -> None:
    path = write(tmp_path, "gpus:\n" + mutate(GOOD_ENTRY))
    with pytest.raises(ConfigError, match=pattern) as info:
        load_catalog(path)
    assert str(info.value).startswith(f"{path}: ")


def test_unknown_top_level_key_in_catalog(tmp_path: Path) -> None:
    path = write(tmp_path, "version: 1\ngpus:\n" + GOOD_ENTRY)
    with pytest.raises(
        ConfigError, match=r"gpus\.yaml: version: unknown key 'version' \(allowed keys: gpus, links\)"
    ):
        load_catalog(path)


def test_aliases_clashing_inside_a_catalog_file(tmp_path: Path) -> None:
    second = GOOD_ENTRY.replace("MY-GPU", "OTHER-GPU")
    with pytest.raises(
        ConfigError, match=r"gpus\.yaml: .*'My Vendor GPU' of OTHER-GPU is already used by MY-GPU"
    ):
        load_catalog(write(tmp_path, "gpus:\n" + GOOD_ENTRY + second))


def test_duplicate_key_in_catalog_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "gpus:\n" + GOOD_ENTRY + "      memory_mib: 1\n")
    with pytest.raises(
        ConfigError, match=r"gpus\.yaml:11: YAML syntax error: found duplicate key 'memory_mib'"
    ):
        load_catalog(path)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"gpus\.yaml: is empty"),
        ("- a\n- b\n", r"gpus\.yaml: expected a mapping, got list"),
        ("gpus: []\n", r"gpus\.yaml: gpus: expected a non-empty mapping"),
        ("gpus:\n  T4: [1, 2\n", r"gpus\.yaml:3: YAML syntax error"),
    ],
)
def test_malformed_catalog_file(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_catalog(write(tmp_path, text))


def test_missing_catalog_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"GPU catalog .*nope\.yaml does not exist \(check the path\)"):
        load_catalog(tmp_path / "nope.yaml")
