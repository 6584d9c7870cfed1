"""The GPU catalog: specs of the GPU types batchplan plans for, loaded from ``cluster_configs/gpus.yaml``.

Pure Python + PyYAML (no torch). Used by the estimator (roofline step time, device memory) and by the
planner (cluster configs name catalog types; real nodes map NVML names to catalog entries via aliases).
The file is read with the strict YAML helpers of ``torchkit.hardware.configio``.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from torchkit.errors import ConfigError
from torchkit.hardware.configio import (
    ConfigLocation,
    describe_value,
    expect_int,
    expect_list,
    expect_mapping,
    expect_number,
    expect_str,
    read_yaml_file,
)
from torchkit.units import MIB


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU type. Throughputs are dense (no sparsity) peaks from the vendor datasheet."""

    name: str
    """canonical type name, e.g. ``A100-SXM4-80GB``"""
    aliases: tuple[str, ...] = ()
    """names NVML reports for this type, e.g. ``NVIDIA A100-SXM4-80GB``; matched case-insensitively"""
    memory_bytes: int
    """total memory as the driver reports it (``nvmlDeviceGetMemoryInfo().total``), in bytes"""
    fp16_tflops: float
    """dense FP16 tensor-core peak, TFLOP/s"""
    bf16_tflops: float | None
    """dense BF16 tensor-core peak, TFLOP/s; None where the GPU has no BF16 support"""
    fp32_tflops: float
    """FP32 peak (non-tensor-core; TF32 is not assumed), TFLOP/s"""
    memory_bandwidth_bytes_per_s: float
    """DRAM bandwidth, bytes/s"""
    compute_capability: str = ""
    """CUDA compute capability, e.g. ``8.0``"""
    source: str = ""
    """where the figures come from (datasheet URL or document)"""

    @property
    def supports_bf16(self) -> bool:
        return self.bf16_tflops is not None and self.bf16_tflops > 0

    def peak_flops_per_s(self, amp: str) -> float:
        """Peak FLOP/s for an AMP mode (``fp16``, ``bf16`` or ``off``)."""
        if amp == "fp16":
            return self.fp16_tflops * 1e12
        if amp == "bf16":
            if not self.supports_bf16:
                raise ValueError(f"{self.name} has no bf16 support (use --amp fp16)")
            return float(self.bf16_tflops) * 1e12
        if amp == "off":
            return self.fp32_tflops * 1e12
        raise ValueError(f"unknown amp mode {amp!r} (use fp16, bf16 or off)")


# --------------------------------------------------------------------------------------------------------
# GPU entries and the catalog
# --------------------------------------------------------------------------------------------------------


# keys of a catalog entry (gpus.yaml) -> hint shown when the key is missing
GPU_SPEC_REQUIRED_KEYS: dict[str, str] = {
    "memory_mib": "total memory as the driver reports it, in MiB, e.g. memory_mib: 24576",
    "fp16_tflops": "dense FP16 tensor-core peak in TFLOP/s, e.g. fp16_tflops: 71.0",
    "bf16_tflops": "dense BF16 tensor-core peak in TFLOP/s, or null if the GPU has no BF16",
    "fp32_tflops": "FP32 peak in TFLOP/s, e.g. fp32_tflops: 35.6",
    "bandwidth_gb_s": "memory bandwidth in GB/s, e.g. bandwidth_gb_s: 936",
}
GPU_SPEC_OPTIONAL_KEYS: tuple[str, ...] = ("aliases", "compute_capability", "source")

_COMPUTE_CAPABILITY = re.compile(r"^\d+\.\d+$")


#: bounds on a GPU entry's figures, far above any real GPU (H200: 141 GiB, ~990 dense TFLOP/s, 4.8 TB/s), so
#: a typo or a hostile figure cannot overflow the arithmetic built on them
MAX_MEMORY_MIB = 2**30
MAX_TFLOPS = 1e6
MAX_BANDWIDTH_GB_S = 1e6


def parse_gpu_spec(name: str, data: Any, where: ConfigLocation) -> GpuSpec:
    """Build a GpuSpec from one catalog entry (the keys of ``gpus.yaml``; units converted to bytes)."""
    entry = expect_mapping(
        data,
        where,
        required=GPU_SPEC_REQUIRED_KEYS,
        optional=GPU_SPEC_OPTIONAL_KEYS,
        what="a GPU entry mapping",
    )
    memory_mib = expect_int(entry["memory_mib"], where.key("memory_mib"), minimum=1, maximum=MAX_MEMORY_MIB)
    fp16 = expect_number(entry["fp16_tflops"], where.key("fp16_tflops"), positive=True, maximum=MAX_TFLOPS)
    bf16_raw = entry["bf16_tflops"]
    bf16 = (
        None
        if bf16_raw is None
        else expect_number(
            bf16_raw,
            where.key("bf16_tflops"),
            positive=True,
            maximum=MAX_TFLOPS,
            hint="null if the GPU has no BF16",
        )
    )
    fp32 = expect_number(entry["fp32_tflops"], where.key("fp32_tflops"), positive=True, maximum=MAX_TFLOPS)
    bandwidth_gb_s = expect_number(
        entry["bandwidth_gb_s"], where.key("bandwidth_gb_s"), positive=True, maximum=MAX_BANDWIDTH_GB_S
    )

    aliases_raw = entry.get("aliases", [])
    aliases_where = where.key("aliases")
    aliases = tuple(
        expect_str(alias, aliases_where.index(i))
        for i, alias in enumerate(
            expect_list(aliases_raw, aliases_where, what="a list of names", non_empty=False)
        )
    )
    compute_capability = entry.get("compute_capability", "")
    cc_where = where.key("compute_capability")
    if isinstance(compute_capability, float):  # unquoted 8.0 in YAML
        compute_capability = f"{compute_capability:.1f}"
    if compute_capability != "" and (
        not isinstance(compute_capability, str) or not _COMPUTE_CAPABILITY.match(compute_capability)
    ):
        raise cc_where.error(f'expected a version like "8.0", got {describe_value(compute_capability)}')
    source = entry.get("source", "")
    if not isinstance(source, str):
        raise where.key("source").error(f"expected a string, got {describe_value(source)}")

    return GpuSpec(
        name=name,
        aliases=aliases,
        memory_bytes=memory_mib * MIB,
        fp16_tflops=fp16,
        bf16_tflops=bf16,
        fp32_tflops=fp32,
        memory_bandwidth_bytes_per_s=bandwidth_gb_s * 1e9,  # GB/s is decimal (10^9 B/s)
        compute_capability=compute_capability,
        source=" ".join(source.split()),
    )


def gpu_spec_to_dict(spec: GpuSpec) -> dict[str, Any]:
    """A GpuSpec as plain JSON data (bytes and bytes/s, like every figure batchplan writes)."""
    return {
        "name": spec.name,
        "aliases": list(spec.aliases),
        "memory_bytes": spec.memory_bytes,
        "fp16_tflops": spec.fp16_tflops,
        "bf16_tflops": spec.bf16_tflops,
        "fp32_tflops": spec.fp32_tflops,
        "memory_bandwidth_bytes_per_s": spec.memory_bandwidth_bytes_per_s,
        "supports_bf16": spec.supports_bf16,
        "compute_capability": spec.compute_capability,
        "source": spec.source,
    }


def _normalize(name: str) -> str:
    """Lookup key: case-insensitive, runs of whitespace collapsed (NVML pads nothing, users do)."""
    return " ".join(name.split()).casefold()


#: how to plan for a GPU type the catalog lacks: every message that meets one says it in these words
ADD_GPU_TYPE_FIX = "add it under gpu_types: in a cluster config"


def _rebuild_catalog(specs: tuple[GpuSpec, ...], source: str) -> GpuCatalog:
    return GpuCatalog(types={spec.name: spec for spec in specs}, source=source)


@dataclass(frozen=True, kw_only=True)
class GpuCatalog:
    """The GPU types batchplan knows, looked up by canonical name or NVML alias (case-insensitive).

    Immutable: ``with_types`` returns a new catalog. Every name and alias maps to exactly one type.
    """

    types: Mapping[str, GpuSpec]
    """canonical name -> spec, in catalog order"""
    source: str = ""
    """where the catalog came from (file path), for messages"""
    _index: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        types = dict(self.types)
        index: dict[str, str] = {}
        for key, spec in types.items():
            if key != spec.name:
                raise ConfigError(f"catalog key {key!r} differs from its spec's name {spec.name!r}")
            for label in (spec.name, *spec.aliases):
                owner = index.get(_normalize(label))
                if owner is not None and owner != spec.name:
                    raise ConfigError(
                        f"GPU name or alias {label!r} of {spec.name} is already used by {owner} "
                        "(each name and alias must belong to one type; rename or drop it)"
                    )
                index[_normalize(label)] = spec.name
        object.__setattr__(self, "types", MappingProxyType(types))
        object.__setattr__(self, "_index", MappingProxyType(index))

    def __reduce__(self) -> tuple[Any, ...]:
        # mappingproxy cannot be pickled; Ray ships catalogs (inside cluster specs) to its actors
        return (_rebuild_catalog, (tuple(self.types.values()), self.source))

    def __hash__(self) -> int:
        return hash(tuple(self.types.values()))

    def __len__(self) -> int:
        return len(self.types)

    def __iter__(self) -> Iterator[GpuSpec]:
        return iter(self.types.values())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.resolve(name) is not None

    def names(self) -> tuple[str, ...]:
        """Canonical type names, in catalog order."""
        return tuple(self.types)

    def resolve(self, name: str) -> GpuSpec | None:
        """The spec whose canonical name or alias equals ``name`` (case-insensitive), else None."""
        canonical = self._index.get(_normalize(name))
        return None if canonical is None else self.types[canonical]

    def get(self, name_or_alias: str, *, fix: str = ADD_GPU_TYPE_FIX) -> GpuSpec:
        """Like ``resolve``, but an unknown name is a ConfigError listing close matches and ``fix`` (where the
        file can define a type: a cluster config's ``gpu_types:``; elsewhere what else to do)."""
        spec = self.resolve(name_or_alias)
        if spec is None:
            raise ConfigError(
                f"GPU type {name_or_alias!r} is not in the catalog ({self._suggest(name_or_alias, fix)})"
            )
        return spec

    def close_matches(self, name: str, limit: int = 6) -> list[str]:
        """Canonical names that look like ``name`` (difflib similarity, or one contains the other)."""
        query = _normalize(name)
        keys = list(self._index)
        if not query:
            return []
        # best first: names that contain what was typed ("a100"), then similar spellings ("A100-80"),
        # then names contained in it ("NVIDIA L4 (24GB)")
        found = [key for key in keys if query in key]
        found += difflib.get_close_matches(query, keys, n=limit, cutoff=0.6)
        found += [key for key in keys if len(key) >= 3 and key in query]
        matches: list[str] = []
        for key in found:
            canonical = self._index[key]
            if canonical not in matches:
                matches.append(canonical)
        return matches[:limit]

    def _suggest(self, name: str, fix: str = ADD_GPU_TYPE_FIX) -> str:
        matches = self.close_matches(name)
        listed = f"close matches: {', '.join(matches)}" if matches else f"known: {', '.join(self.names())}"
        return f"{listed}; or {fix}"

    def with_types(self, extra: Sequence[GpuSpec]) -> GpuCatalog:
        """This catalog plus ``extra`` (types a cluster config defines).

        A type equal to an existing one is accepted (a config may repeat a catalog entry); a different
        spec under an existing name or alias is a ConfigError.
        """
        types = dict(self.types)
        for spec in extra:
            existing = self.resolve(spec.name) or types.get(spec.name)
            if existing is not None:
                if existing == spec:
                    continue
                raise ConfigError(
                    f"GPU type {spec.name!r} clashes with catalog type {existing.name} "
                    "(it differs from the catalog entry; give it a new name, or drop it to use the catalog's)"
                )
            types[spec.name] = spec
        return GpuCatalog(types=types, source=self.source)


def cluster_configs_dir() -> Path:
    """The directory of the shipped data package ``cluster_configs`` (gpus.yaml and example clusters)."""
    # setuptools installs cluster_configs as plain files (editable or wheel), never zipped, so the
    # resource is a real directory
    try:
        return Path(str(importlib.resources.files("cluster_configs")))
    except (NotADirectoryError, TypeError):
        # an editable install made before cluster_configs/__init__.py existed registers it as a namespace
        # package whose search path holds a non-directory entry; importlib.resources trips over it
        import cluster_configs

        for entry in getattr(cluster_configs, "__path__", ()):
            if (Path(entry) / "gpus.yaml").is_file():
                return Path(entry)
        raise


def default_catalog_path() -> Path:
    """Path of the shipped catalog, ``cluster_configs/gpus.yaml`` (found through the package data)."""
    return cluster_configs_dir() / "gpus.yaml"


def load_catalog(path: str | os.PathLike[str] | None = None) -> GpuCatalog:
    """Load a GPU catalog file (default: the shipped ``gpus.yaml``; that one is read once and cached).

    Raises:
        ConfigError: the file is missing or malformed (unknown keys, bad values, clashing aliases).
    """
    if path is None:
        return _default_catalog()
    return _load_catalog_file(Path(path))


@functools.cache
def _default_catalog() -> GpuCatalog:
    return _load_catalog_file(default_catalog_path())


def _load_catalog_file(path: Path) -> GpuCatalog:
    data = read_yaml_file(path, "GPU catalog")
    top = ConfigLocation(str(path))
    if data is None:
        raise top.error("is empty (expected a mapping with a gpus: section)")
    # links: the intra-node link defaults, read by torchkit.hardware.links
    expect_mapping(
        data,
        top,
        required={"gpus": "a mapping of GPU type name -> entry"},
        optional=("links",),
        what="a mapping",
    )
    entries = data["gpus"]
    gpus_where = top.key("gpus")
    if not isinstance(entries, dict) or not entries:
        raise gpus_where.error(
            f"expected a non-empty mapping of GPU type name -> entry, got {describe_value(entries)}"
        )
    specs = []
    for name, entry in entries.items():
        entry_where = gpus_where.key(name)
        specs.append(parse_gpu_spec(expect_str(name, entry_where), entry, entry_where))
    try:
        return GpuCatalog(types={spec.name: spec for spec in specs}, source=str(path))
    except ConfigError as exc:
        raise top.error(str(exc)) from None
