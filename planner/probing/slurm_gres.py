"""SLURM's GRES strings, read: ``gpu:a100:4``, ``gpu:4``, ``gpu:t4:2(IDX:0-1),gpu:a10:2(IDX:2-3)``,
``gpu(IDX:0,2)``, ``gpu:a100:4(S:0-1),mps:100`` -> typed entries (:class:`GresGpus`), and a GRES type name -> its
catalog GPU (:data:`DEFAULT_GRES_TYPES`, ``--gres-type NAME=TYPE``, then the catalog's names and aliases).

Pure functions. Every count and index is held to a cluster config's limit of GPUs per node
(:data:`planner.cluster.MAX_GPUS_PER_NODE`) before it is read as a number or a range is expanded, and every
piece of SLURM's text an error quotes is escaped (``!r``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.cluster import MAX_GPUS_PER_NODE
from planner.errors import ConfigError
from torchkit.hardware.catalog import GpuCatalog, GpuSpec
from torchkit.terminal_text import printable

#: common GRES type names (lower case, ``_`` read as ``-``) -> catalog type. Sources: the names NVIDIA's
#: product pages use, as sites spell them in gres.conf (``AutoDetect=nvml`` writes ``nvidia_<product>``,
#: which is stripped to ``<product>`` before this lookup). Ambiguous names take the smaller-memory card.
DEFAULT_GRES_TYPES: Mapping[str, str] = {
    "t4": "T4",
    "v100": "V100-SXM2-16GB",
    "v100-16g": "V100-SXM2-16GB",
    "v100-16gb": "V100-SXM2-16GB",
    "v100-32g": "V100-SXM2-32GB",
    "v100-32gb": "V100-SXM2-32GB",
    "a10": "A10",
    "a10g": "A10G",
    "a100": "A100-SXM4-40GB",
    "a100-40g": "A100-SXM4-40GB",
    "a100-40gb": "A100-SXM4-40GB",
    "a100-80g": "A100-SXM4-80GB",
    "a100-80gb": "A100-SXM4-80GB",
    "l4": "L4",
    "l40s": "L40S",
    "h100": "H100-PCIe-80GB",
    "h100-pcie": "H100-PCIe-80GB",
    "h100-sxm": "H100-SXM5-80GB",
    "h100-sxm5": "H100-SXM5-80GB",
    "h200": "H200-SXM-141GB",
    "rtx2080ti": "RTX-2080Ti",
    "2080ti": "RTX-2080Ti",
    "rtx3090": "RTX-3090",
    "3090": "RTX-3090",
    "rtx4090": "RTX-4090",
    "4090": "RTX-4090",
    "a6000": "RTX-A6000",
    "rtx-a6000": "RTX-A6000",
}

#: digits a GRES count or index may have before it is read as a number (more cannot be under the limits; and
#: Python refuses to read a number of over 4,300 digits, with a ValueError)
MAX_NUMBER_DIGITS = 9

_GRES_ENTRY = re.compile(
    r"(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?(?::(?P<count>[0-9]+))?(?:\((?P<extra>[^()]*)\))?", re.ASCII
)
_GRES_INDEX_LIST = re.compile(r"(?:^|,)IDX:(?P<list>[^()]*)$", re.ASCII)


@dataclass(frozen=True, kw_only=True)
class GresGpus:
    """GPUs of one GRES entry (``gpu:a100:4``, ``gpu:a100:2(IDX:0-1)``)."""

    gres_type: str | None
    """the type name as SLURM spells it, or None for an untyped ``gpu:N``"""
    count: int
    """number of cards"""
    indices: tuple[int, ...] | None = None
    """the cards' indices on their node where SLURM prints them (``(IDX:0-1,3)``), else None"""


def split_gres(text: str) -> list[str]:
    """``gpu:a100:2(S:0-1),mps:100`` -> its entries; commas inside parentheses do not split."""
    entries, depth, current = [], 0, ""
    for char in text.strip():
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += char
    if current:
        entries.append(current)
    return [e.strip() for e in entries if e.strip() and e.strip() != "(null)"]


def parse_gres_gpus(text: str, where: str) -> list[GresGpus]:
    """The ``gpu`` entries of a GRES string (others, like ``mps`` or ``shard``, are ignored): ``gpu:a100:4``,
    ``gpu:4``, ``gpu:a100:2(IDX:0-1)``, ``gpu(IDX:0,2)`` (a count from the indices), ``gpu:a100:4(S:0-1)``.

    Raises:
        ConfigError: an entry SLURM would not write, or more cards than a node may hold
            (:data:`planner.cluster.MAX_GPUS_PER_NODE`), checked before a card is counted out.
    """
    found = []
    for entry in split_gres(text):
        match = _GRES_ENTRY.fullmatch(entry)
        if match is None:
            raise ConfigError(
                f"{where}: GRES entry {entry!r} is not name[:type][:count] (check `sinfo -o %G`)"
            )
        if match["name"] != "gpu":
            continue
        gres_type, count_text = match["type"], match["count"]
        if (
            count_text is None and gres_type is not None and gres_type.isascii() and gres_type.isdigit()
        ):  # gpu:4
            gres_type, count_text = None, gres_type
        indices = _gres_indices(match["extra"], entry, where)
        if count_text is None:
            count = len(indices) if indices is not None else 1
        else:
            count = _bounded_count(count_text, entry, where)
            if indices is not None and len(indices) != count:
                raise ConfigError(
                    f"{where}: GRES entry {entry!r} counts {count} card(s) but lists {len(indices)} "
                    "index(es) (is this SLURM's `scontrol show job -d`?)"
                )
        if count:
            found.append(GresGpus(gres_type=gres_type, count=count, indices=indices))
    return found


def _bounded_count(digits: str, entry: str, where: str) -> int:
    """A GRES count, refused over :data:`MAX_GPUS_PER_NODE` before it is read as a number."""
    if len(digits) > MAX_NUMBER_DIGITS or int(digits) > MAX_GPUS_PER_NODE:
        shown = digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
        raise ConfigError(
            f"{where}: GRES entry {entry[:80]!r} holds {shown} GPUs, over the limit of "
            f"{MAX_GPUS_PER_NODE} per node (a cluster config's; check `scontrol show node`)"
        )
    return int(digits)


def _gres_indices(extra: str | None, entry: str, where: str) -> tuple[int, ...] | None:
    """The node indices of ``(IDX:0-1,3)``, None where the entry has none (``(S:0-1)`` names sockets)."""
    match = _GRES_INDEX_LIST.search(extra or "")
    if match is None or match["list"].strip() in ("", "N/A"):
        return None
    indices: list[int] = []
    for part in match["list"].split(","):
        first, dash, last = part.strip().partition("-")
        bounds = (first, last) if dash else (first, first)
        if not all(b.isascii() and b.isdigit() and len(b) <= MAX_NUMBER_DIGITS for b in bounds) or int(
            bounds[1]
        ) < int(bounds[0]):
            raise ConfigError(
                f"{where}: GRES entry {entry[:80]!r} has the index range {part[:40]!r}, not N or N-M "
                "(is this SLURM's `scontrol show job -d`?)"
            )
        low, high = int(bounds[0]), int(bounds[1])
        if len(indices) + high - low + 1 > MAX_GPUS_PER_NODE:  # before the range is expanded
            raise ConfigError(
                f"{where}: GRES entry {entry[:80]!r} lists over {MAX_GPUS_PER_NODE} card indices, "
                f"the limit per node (a cluster config's; check `scontrol show job -d`)"
            )
        indices.extend(range(low, high + 1))
    if len(set(indices)) != len(indices):
        raise ConfigError(f"{where}: GRES entry {entry[:80]!r} lists a card index twice")
    return tuple(indices)


def gres_table(overrides: Sequence[str] = ()) -> dict[str, str]:
    """:data:`DEFAULT_GRES_TYPES` with ``NAME=TYPE`` overrides (``--gres-type``) on top."""
    table = dict(DEFAULT_GRES_TYPES)
    for item in overrides:
        name, sep, gpu_type = item.partition("=")
        if not sep or not name.strip() or not gpu_type.strip():
            raise ConfigError(
                f"--gres-type {item!r} is invalid (use NAME=TYPE, e.g. --gres-type a100=A100-SXM4-80GB)"
            )
        table[_normal_gres_name(name)] = gpu_type.strip()
    return table


def _normal_gres_name(name: str) -> str:
    name = name.strip().lower().replace("_", "-")
    return name.removeprefix("nvidia-")


def gres_gpu_spec(
    gres_type: str | None, table: Mapping[str, str], catalog: GpuCatalog, where: str
) -> GpuSpec:
    """The catalog type of a GRES type name: the table first, then the catalog's own names and aliases.

    Raises:
        ConfigError: an untyped GRES without a ``gpu=`` mapping, or a name nothing maps.
    """
    key = "gpu" if gres_type is None else _normal_gres_name(gres_type)
    if key in table:
        return catalog.get(table[key])
    if gres_type is not None:
        spec = catalog.resolve(gres_type) or catalog.resolve(key)
        if spec is not None:
            return spec
    spelled = "gpu:N (no type)" if gres_type is None else printable(f"gpu:{gres_type}", max_chars=80)
    name = shlex.quote(printable(key, max_chars=80)) if gres_type is not None else "gpu"
    raise ConfigError(
        f"{where}: GRES {spelled} names no GPU type batchplan knows (add --gres-type {name}=TYPE with a type from "
        "`batchplan catalog`)"
    )
