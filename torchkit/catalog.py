"""The GPU catalog: specs of the GPU types batchplan plans for, loaded from ``cluster_configs/gpus.yaml``.

Pure Python + PyYAML (no torch). Used by the estimator (roofline step time, device memory) and by the
planner (cluster configs name catalog types; real nodes map NVML names to catalog entries via aliases).

Also home of the strict YAML helpers (``ConfigLocation``, ``read_yaml_file``, ``expect_*``) that the catalog
and ``planner.cluster`` share: duplicate and unknown keys are errors, and every error names the file, the
path inside it and the fix.
"""

from __future__ import annotations

import difflib
import functools
import importlib.resources
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from torchkit.errors import ConfigError

GIB = 2**30


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
# Strict YAML reading, shared with planner.cluster: every error names the file, the path inside it
# (``nodes[1].gpus[0].type``) and the fix.
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigLocation:
    """Where a value sits: the file (or a label) and the path inside it, for error messages."""

    source: str
    """file name or label, e.g. ``cluster_configs/demo-mixed.yaml``"""
    path: str = ""
    """path inside the document, e.g. ``nodes[1].gpus[0].type``; empty for the top level"""

    def key(self, name: object) -> ConfigLocation:
        """The location of mapping key ``name`` below this one."""
        return ConfigLocation(self.source, f"{self.path}.{name}" if self.path else str(name))

    def index(self, i: int) -> ConfigLocation:
        """The location of list item ``i`` below this one."""
        return ConfigLocation(self.source, f"{self.path}[{i}]")

    def error(self, message: str) -> ConfigError:
        """A ConfigError ``<file>: <path>: <message>``."""
        return ConfigError(
            f"{self.source}: {self.path}: {message}" if self.path else f"{self.source}: {message}"
        )


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may be overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first_line = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "found an unhashable key",
                key_node.start_mark,
            ) from None
        if first_line is not None:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first defined on line {first_line + 1}; keep one)",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping)


def parse_yaml_text(text: str, source: str) -> Any:
    """Parse YAML text strictly (no duplicate keys); a syntax error becomes a ConfigError with its line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem} (fix the YAML on that line)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error: {exc} (fix the YAML)") from None


def read_yaml_file(path: str | os.PathLike[str], what: str) -> Any:
    """Read and parse a YAML file; a missing, unreadable or malformed file is a ConfigError.

    ``what`` names the kind of file for the message (``"cluster config"``, ``"GPU catalog"``).
    """
    file_path = Path(path)
    if not file_path.exists():
        raise ConfigError(f"{what} {file_path} does not exist (check the path)")
    if not file_path.is_file():
        raise ConfigError(f"{what} {file_path} is not a file (give the path of a .yaml file)")
    try:
        text = file_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{what} {file_path} cannot be read: {exc} (check its permissions and encoding)"
        ) from None
    return parse_yaml_text(text, str(file_path))


def expect_mapping(
    value: Any,
    where: ConfigLocation,
    *,
    required: Mapping[str, str],
    optional: Sequence[str] = (),
    what: str = "a mapping",
) -> dict[str, Any]:
    """Check that ``value`` is a mapping with string keys, all of ``required`` present and no others.

    ``required`` maps each required key to a hint shown when it is missing (``"e.g. name: node-a"``).
    """
    if not isinstance(value, dict):
        raise where.error(f"expected {what}, got {_describe(value)}")
    allowed = [*required, *optional]
    for key in value:
        if not isinstance(key, str) or key not in allowed:
            close = _closest_key(key, allowed) if isinstance(key, str) else None
            hint = f"; did you mean {close!r}?" if close else ""
            raise where.key(key).error(f"unknown key {key!r} (allowed keys: {', '.join(allowed)}{hint})")
    for key, hint in required.items():
        if key not in value:
            raise where.key(key).error(f"missing required key {key!r} ({hint})")
    return value


def _closest_key(key: str, allowed: Sequence[str]) -> str | None:
    """The allowed key a misspelt ``key`` most likely meant: a shared stem first (``cpus`` ->
    ``cpu_count``), else the most similar spelling (``gpu`` -> ``gpus``)."""
    prefixed = [name for name in allowed if len(os.path.commonprefix([key, name])) >= 3]
    if prefixed:
        return max(prefixed, key=lambda name: len(os.path.commonprefix([key, name])))
    close = difflib.get_close_matches(key, allowed, n=1)
    return close[0] if close else None


def expect_str(value: Any, where: ConfigLocation) -> str:
    """A non-empty string (YAML reads ``yes``/``1``/``1.0`` as other types: quote them)."""
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"expected a non-empty string, got {_describe(value)} (quote it if needed)")
    return value.strip()


def expect_int(value: Any, where: ConfigLocation, *, minimum: int | None = None) -> int:
    """An integer (not a bool, not a float) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"expected an integer, got {_describe(value)}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}")
    return value


def expect_number(
    value: Any,
    where: ConfigLocation,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
    hint: str = "",
) -> float:
    """A finite int or float (not a bool) within ``[minimum, maximum]``, > 0 if ``positive``."""
    suffix = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise where.error(f"expected a number, got {_describe(value)}{suffix}")
    if positive and value <= 0:
        raise where.error(f"must be greater than 0, got {value}{suffix}")
    if minimum is not None and value < minimum:
        raise where.error(f"must be at least {minimum}, got {value}{suffix}")
    if maximum is not None and value > maximum:
        raise where.error(f"must be at most {maximum}, got {value}{suffix}")
    return float(value)


def expect_list(value: Any, where: ConfigLocation, *, what: str = "a list", non_empty: bool = True) -> list:
    """A YAML sequence; empty is an error when ``non_empty``."""
    if not isinstance(value, list):
        raise where.error(f"expected {what}, got {_describe(value)}")
    if non_empty and not value:
        raise where.error(f"is empty (expected {what} with at least one entry)")
    return value


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


# --------------------------------------------------------------------------------------------------------
# GPU entries and the catalog
# --------------------------------------------------------------------------------------------------------

MIB = 2**20

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


def parse_gpu_spec(name: str, data: Any, where: ConfigLocation) -> GpuSpec:
    """Build a GpuSpec from one catalog entry (the keys of ``gpus.yaml``; units converted to bytes)."""
    entry = expect_mapping(
        data,
        where,
        required=GPU_SPEC_REQUIRED_KEYS,
        optional=GPU_SPEC_OPTIONAL_KEYS,
        what="a GPU entry mapping",
    )
    memory_mib = expect_int(entry["memory_mib"], where.key("memory_mib"), minimum=1)
    fp16 = expect_number(entry["fp16_tflops"], where.key("fp16_tflops"), positive=True)
    bf16_raw = entry["bf16_tflops"]
    bf16 = (
        None
        if bf16_raw is None
        else expect_number(
            bf16_raw, where.key("bf16_tflops"), positive=True, hint="null if the GPU has no BF16"
        )
    )
    fp32 = expect_number(entry["fp32_tflops"], where.key("fp32_tflops"), positive=True)
    bandwidth_gb_s = expect_number(entry["bandwidth_gb_s"], where.key("bandwidth_gb_s"), positive=True)

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
        raise cc_where.error(f'expected a version like "8.0", got {_describe(compute_capability)}')
    source = entry.get("source", "")
    if not isinstance(source, str):
        raise where.key("source").error(f"expected a string, got {_describe(source)}")

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

    def get(self, name_or_alias: str) -> GpuSpec:
        """Like ``resolve``, but an unknown name is a ConfigError listing close matches and the fix."""
        spec = self.resolve(name_or_alias)
        if spec is None:
            raise ConfigError(
                f"GPU type {name_or_alias!r} is not in the catalog ({self._suggest(name_or_alias)})"
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

    def _suggest(self, name: str) -> str:
        matches = self.close_matches(name)
        listed = f"close matches: {', '.join(matches)}" if matches else f"known: {', '.join(self.names())}"
        return f"{listed}; or add it under gpu_types:"

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
    expect_mapping(data, top, required={"gpus": "a mapping of GPU type name -> entry"}, what="a mapping")
    entries = data["gpus"]
    gpus_where = top.key("gpus")
    if not isinstance(entries, dict) or not entries:
        raise gpus_where.error(
            f"expected a non-empty mapping of GPU type name -> entry, got {_describe(entries)}"
        )
    specs = []
    for name, entry in entries.items():
        entry_where = gpus_where.key(name)
        specs.append(parse_gpu_spec(expect_str(name, entry_where), entry, entry_where))
    try:
        return GpuCatalog(types={spec.name: spec for spec in specs}, source=str(path))
    except ConfigError as exc:
        raise top.error(str(exc)) from None
