"""Which devices a request names: ``parse_device`` turns any device request (``"cuda:0"``, ``"0,1"``,
``"-1,-1"``, ``[0, 1]``, a ``torch.device``) into a canonical string, picking idle GPUs for ``-1`` from NVML
and mapping them to torch's numbering. The engine's half of the seed's device handling: the planner's
``profile --device`` uses it, and ``torchkit.seed_api.device.select_device`` turns its answer into a
``torch.device``.

torch is imported inside the functions (``import torchkit.process.device`` costs no torch).

Deliberate differences from the seed (newest Ultralytics):

* ``-1`` GPUs are mapped from NVML to torch by UUID (or PCI bus id), not by position. NVML numbers GPUs in
  PCI bus order, CUDA numbers them fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and
  ``CUDA_VISIBLE_DEVICES`` renumbers them again (numbers or UUIDs); the seed assumed NVML order == CUDA
  order and could hand back the index of a different, busy GPU. When the two orders differ it warns once
  per call, naming both numberings. Only GPUs torch can see are candidates.
* ``-1`` without NVML (no driver, no pynvml, container without the toolkit) resolves to the default device
  with one warning that says why, instead of the seed's several warnings.
* ``-1`` never picks a GPU that the same request names explicitly (``0,-1`` gives GPU 0 plus another one).

Known limitations: resolving ``-1`` initialises CUDA in this process (``torch.cuda.get_device_properties``)
to read the UUIDs; MIG instances are not matched to NVML GPUs, so ``-1`` does not pick them.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from torchkit.hardware.gpu_select import rank_idle_gpus
from torchkit.hardware.nvml import GpuStats, NvmlUnavailableError, read_local_inventory

LOGGER = logging.getLogger(__name__)

# the seed's parse_device asks NVML for GPUs with at least 20% free memory when resolving -1
AUTO_MIN_MEMORY_FRACTION = 0.2

__all__ = ["is_device_index", "parse_device", "torch_index_by_nvml_index"]


def is_device_index(token: str) -> bool:
    """A plain device index (``"0"``, ``"12"``): ASCII digits only."""
    return token.isascii() and token.isdigit()


def _normalise(token: str) -> str:
    return str(int(token)) if is_device_index(token) else token


def _visible_entries(device_count: int) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` entries (digits normalised) that CUDA uses, or None when it is not set."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [_normalise(e) for e in value.replace(" ", "").split(",")]
    return entries[:device_count]  # CUDA stops at the first invalid entry; torch's count says where


def _translate_visible(tokens: list[str]) -> list[str]:
    """Physical ids under ``CUDA_VISIBLE_DEVICES`` → torch indices, but only when some requested id is out of
    torch's range (in-range ids are torch indices already, which keeps parsing idempotent)."""
    numeric = [int(t) for t in tokens if is_device_index(t)]
    if not numeric or "CUDA_VISIBLE_DEVICES" not in os.environ:
        return tokens
    import torch

    count = torch.cuda.device_count()
    visible = _visible_entries(count) or []
    if all(str(i) in visible for i in numeric) and any(i >= count for i in numeric):
        return [str(visible.index(t)) if is_device_index(t) else t for t in tokens]
    return tokens


def _uuid_key(uuid: str) -> str:
    text = str(uuid).strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def _pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """``"00000000:3B:00.0"`` → (domain, bus, device) as ints; None when unparsable."""
    match = re.fullmatch(r"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.[0-7]", str(bus_id).strip())
    if match is None:
        return None
    return int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16)


def _position_mapping(gpus: tuple[GpuStats, ...], torch_count: int) -> dict[int, int]:
    """The seed's mapping: torch index = position in ``CUDA_VISIBLE_DEVICES`` (or identity), which is right
    only when CUDA numbers GPUs in NVML (PCI) order."""
    visible = _visible_entries(torch_count)
    entries = visible if visible is not None else [str(i) for i in range(torch_count)]
    mapping: dict[int, int] = {}
    for position, entry in enumerate(entries):
        if is_device_index(entry):
            mapping[int(entry)] = position
        elif entry.lower().startswith("gpu-"):  # CUDA accepts a unique UUID prefix
            matches = [g.index for g in gpus if _uuid_key(g.uuid).startswith(_uuid_key(entry))]
            if len(matches) == 1:
                mapping[matches[0]] = position
    known = {g.index for g in gpus}
    return {nvml: t for nvml, t in mapping.items() if nvml in known}


def torch_index_by_nvml_index(
    gpus: tuple[GpuStats, ...], torch_count: int
) -> tuple[dict[int, int], str | None]:
    """Which torch CUDA index each visible NVML GPU has, matched by UUID, then PCI bus id.

    Returns the mapping and a warning (None when there is nothing to say): set when CUDA numbers the GPUs
    differently from NVML, or when torch's devices could not be matched and the seed's positional mapping
    is used instead.
    """
    import torch

    by_uuid = {_uuid_key(g.uuid): g.index for g in gpus if g.uuid}
    by_pci = {key: g.index for g in gpus if (key := _pci_key(g.pci_bus_id)) is not None}
    mapping: dict[int, int] = {}
    for torch_index in range(torch_count):
        props = torch.cuda.get_device_properties(torch_index)
        nvml_index = by_uuid.get(_uuid_key(str(getattr(props, "uuid", "") or "")))
        if nvml_index is None:
            pci = tuple(
                getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")
            )
            nvml_index = by_pci.get(pci) if None not in pci else None  # type: ignore[arg-type]
        if nvml_index is not None:
            mapping[nvml_index] = torch_index
    positional = _position_mapping(gpus, torch_count)
    if not mapping:
        return positional, (
            "could not match torch's CUDA devices to NVML GPUs by UUID or PCI bus id; assuming CUDA numbers "
            "them in NVML (PCI) order, which holds only with CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    if mapping != positional:
        pci_of = {g.index: g.pci_bus_id for g in gpus}
        pairs = ", ".join(
            f"torch {t} = NVML {n} ({pci_of[n]})"
            for n, t in sorted(mapping.items(), key=lambda item: item[1])
        )
        return mapping, (
            f"CUDA numbers the GPUs differently from NVML/nvidia-smi: {pairs}; idle GPUs were matched by "
            f"UUID (CUDA_DEVICE_ORDER={os.environ.get('CUDA_DEVICE_ORDER', 'FASTEST_FIRST (default)')}; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID to make the numbers agree)"
        )
    return mapping, None


def _pick_idle(request: str, count: int, exclude: set[int]) -> list[int]:
    """Torch indices of up to ``count`` idle GPUs (the seed's NVML choice with >= 20% free memory), not in
    ``exclude``. Logs one warning when it cannot pick (no NVML, no CUDA device) or picks fewer."""
    import torch

    fallback = "; using the default device instead" if count == len(request.split(",")) else "; it is dropped"
    try:
        inventory = read_local_inventory()
    except NvmlUnavailableError as exc:
        LOGGER.warning("device=%s cannot pick an idle GPU: %s%s", request, exc, fallback)
        return []
    for warning in inventory.warnings:
        LOGGER.warning(warning)
    torch_count = torch.cuda.device_count()
    if torch_count == 0:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f", CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else ""
        LOGGER.warning(
            "device=%s cannot pick an idle GPU: NVML sees %d GPU(s) but torch sees none "
            "(torch.cuda.device_count() == 0%s; a CPU-only torch build?)%s",
            request,
            len(inventory.gpus),
            hidden,
            fallback,
        )
        return []
    mapping, order_warning = torch_index_by_nvml_index(inventory.gpus, torch_count)
    if order_warning:
        LOGGER.warning(order_warning)
    candidates = [nvml for nvml, torch_index in mapping.items() if torch_index not in exclude]
    picks = rank_idle_gpus(
        inventory.gpus, count, min_memory_fraction=AUTO_MIN_MEMORY_FRACTION, indices=candidates
    )
    if len(picks) < count:
        LOGGER.warning(
            "device=%s: only %d of %d idle GPU(s) requested have >= %.0f%% free memory; the unfilled -1 %s",
            request,
            len(picks),
            count,
            AUTO_MIN_MEMORY_FRACTION * 100,
            "entries are dropped" if count - len(picks) > 1 else "is dropped",
        )
    torch_picks = [mapping[p] for p in picks]
    if picks:
        LOGGER.info("device=%s: idle GPU(s) NVML %s = torch %s", request, picks, torch_picks)
    return torch_picks


def parse_device(device: Any = "") -> str:
    """A device request in any form → canonical string: ``""`` (default), ``"cpu"``, ``"mps"``, ``"0"``,
    ``"0,1"``, ``"npu:0"``.

    Accepts strings (``"cuda:0"``, ``"0, 1"``, ``"-1,-1"``), ints, lists/tuples (``[0, 1]``), ``torch.device``
    and None. ``-1`` picks an idle GPU (NVML, >= 20% free memory; unfilled ``-1`` are dropped). Ids beyond
    torch's device count that are listed in ``CUDA_VISIBLE_DEVICES`` are read as physical ids and mapped to
    torch indices; in-range ids are torch indices, so parsing twice gives the same answer. No validation:
    ``select_device`` validates. See the module docstring for the differences from the seed.
    """
    import torch

    if isinstance(device, torch.device):
        if device.type == "cuda" and device.index is None:
            return ""
        if device.type == "cpu":
            return "cpu"
        if device.type in {"npu", "xpu"}:
            return device.type if device.index is None else f"{device.type}:{device.index}"
    text = str(device).lower()
    for junk in ("cuda:", "none", "(", ")", "[", "]", "'", " "):
        text = text.replace(junk, "")
    if text == "cuda":
        text = "0"
    for prefix in ("npu", "xpu"):
        if text.startswith(prefix):
            indices = [_normalise(t) for t in text[len(prefix) :].replace(":", "").split(",") if t]
            return f"{prefix}:{','.join(indices)}" if indices else prefix

    tokens = _translate_visible([_normalise(t) for t in text.split(",") if t])
    auto_count = tokens.count("-1")
    if auto_count:
        explicit = {int(t) for t in tokens if is_device_index(t)}
        picks = iter(_pick_idle(",".join(tokens), auto_count, explicit))
        filled = [t if t != "-1" else next(picks, None) for t in tokens]
        tokens = [str(t) for t in filled if t is not None]
    return ",".join(tokens)
