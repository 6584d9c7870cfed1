"""Device parsing and selection: ``parse_device`` turns any device request into a canonical string,
``select_device`` turns that into a ``torch.device`` (the seed's ``torch_utils`` functions of the same names).

torch is imported inside the functions, so ``get_cpu_info`` (used by ``batchplan devices``) works without
paying for torch.

Deliberate differences from the seed (newest Ultralytics):

* ``parse_device`` maps the GPUs it picks for ``-1`` from NVML to torch by UUID (or PCI bus id), not by
  position. NVML numbers GPUs in PCI bus order, CUDA numbers them fastest first unless
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and ``CUDA_VISIBLE_DEVICES`` renumbers them again (numbers or UUIDs);
  the seed assumed NVML order == CUDA order and could hand back the index of a different, busy GPU. When the
  two orders differ it warns once per call, naming both numberings. Only GPUs torch can see are candidates.
* ``-1`` without NVML (no driver, no pynvml, container without the toolkit) resolves to the default device
  with one warning that says why, instead of the seed's several warnings.
* ``-1`` never picks a GPU that the same request names explicitly (``0,-1`` gives GPU 0 plus another one).
* ``select_device`` never changes ``CUDA_VISIBLE_DEVICES`` (neither does the newest seed; older ones did and
  silently ran ``device=1`` on GPU 0 once CUDA was initialised). Bad requests raise ``ConfigError``, a
  ``ValueError`` as in the seed, so the CLI shows them as one line.

Known limitations: resolving ``-1`` initialises CUDA in this process (``torch.cuda.get_device_properties``)
to read the UUIDs; MIG instances are not matched to NVML GPUs, so ``-1`` does not pick them.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import subprocess
from typing import TYPE_CHECKING, Any

from torchkit.errors import ConfigError
from torchkit.hardware.gpu_select import rank_idle_gpus
from torchkit.hardware.nvml import GpuStats, NvmlUnavailableError, read_local_inventory

if TYPE_CHECKING:
    import torch

LOGGER = logging.getLogger(__name__)

# the seed's thread count for CPU/MPS runs: leave a core for the data loader, at most 8
NUM_THREADS = min(8, max(1, (os.cpu_count() or 1) - 1))

# the seed's parse_device asks NVML for GPUs with at least 20% free memory when resolving -1
AUTO_MIN_MEMORY_FRACTION = 0.2

__all__ = ["get_cpu_info", "get_gpu_info", "get_torch_device_backend", "parse_device", "select_device"]


def get_torch_device_backend(device: torch.device | str) -> Any:
    """The torch module for a device type: ``"cuda"`` → ``torch.cuda``, ``"npu:0"`` → ``torch.npu``."""
    import torch

    device_type = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if hasattr(torch, "get_device_module"):
        return torch.get_device_module(device_type)
    return getattr(torch, device_type)


# ------------------------------------------------------------------------------------------------ host info


def _clean_cpu_name(raw: str) -> str:
    name = re.sub(r"\s+", " ", raw).strip()
    name = re.sub(r"\((?:TM|R)\)", "", name, flags=re.IGNORECASE).strip()
    name = re.sub(r"\s+", " ", name)
    # "Intel Core i7-8700K CPU @ 3.70GHz" -> "Intel Core i7-8700K 3.70GHz"
    match = re.search(r"(Intel.*?i\d[\w-]*) CPU @ ([\d.]+\s*GHz)", name, flags=re.IGNORECASE)
    if match:
        return f"{match.group(1)} {match.group(2)}"
    return name


def _raw_cpu_name() -> str:
    system = platform.system()
    try:
        if system == "Darwin":
            result = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if result.stdout.strip():
                return result.stdout.strip()
        elif system == "Linux":
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
                for line in cpuinfo:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "model name" and value.strip():
                        return value.strip()
        elif system == "Windows":
            import winreg  # type: ignore[import-not-found]

            with winreg.OpenKey(
                winreg.HKEY_LOCAL_MACHINE, r"HARDWARE\DESCRIPTION\System\CentralProcessor\0"
            ) as key:
                return str(winreg.QueryValueEx(key, "ProcessorNameString")[0])
    except (OSError, subprocess.SubprocessError):
        pass  # fall back to what platform knows
    return platform.processor() or platform.machine() or ""


@functools.lru_cache
def get_cpu_info() -> str:
    """A readable CPU name, e.g. ``Intel Core i7-8700K 3.70GHz`` or ``Apple M2``; ``Unknown CPU`` if none."""
    raw = _raw_cpu_name()
    return _clean_cpu_name(raw) if raw else "Unknown CPU"


@functools.lru_cache
def get_gpu_info(index: int) -> str:
    """``"{name}, {total MiB}MiB"`` for a torch CUDA index, e.g. ``"Tesla T4, 15102MiB"``."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return f"{props.name}, {props.total_memory / (1 << 20):.0f}MiB"


# ------------------------------------------------------------------------------------------------ parsing


def _is_index(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _normalise(token: str) -> str:
    return str(int(token)) if _is_index(token) else token


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
    numeric = [int(t) for t in tokens if _is_index(t)]
    if not numeric or "CUDA_VISIBLE_DEVICES" not in os.environ:
        return tokens
    import torch

    count = torch.cuda.device_count()
    visible = _visible_entries(count) or []
    if all(str(i) in visible for i in numeric) and any(i >= count for i in numeric):
        return [str(visible.index(t)) if _is_index(t) else t for t in tokens]
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
        if _is_index(entry):
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
        explicit = {int(t) for t in tokens if _is_index(t)}
        picks = iter(_pick_idle(",".join(tokens), auto_count, explicit))
        filled = [t if t != "-1" else next(picks, None) for t in tokens]
        tokens = [str(t) for t in filled if t is not None]
    return ",".join(tokens)


# ------------------------------------------------------------------------------------------------ selection


def _banner() -> str:
    import torch

    try:
        from importlib.metadata import version

        ours = version("batchplan")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        ours = "unknown"
    return f"batchplan {ours} Python-{platform.python_version()} torch-{torch.__version__} "


def _select_npu_xpu(device: str, banner: str) -> torch.device:
    import torch

    device_type, _, index_text = device.partition(":")
    label = device_type.upper()
    if device_type == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError as exc:
            raise ConfigError(
                f"Invalid NPU 'device={device}'. Install 'torch_npu' at https://github.com/Ascend/pytorch"
            ) from exc
    try:
        backend = get_torch_device_backend(device_type)
    except (AttributeError, RuntimeError):
        backend = None
    if backend is None or not backend.is_available():
        raise ConfigError(f"Invalid {label} 'device={device}' requested. Backend is not available.")
    tokens = [t for t in index_text.split(",") if t] if index_text else []
    if any(not _is_index(t) for t in tokens) or len(set(tokens)) != len(tokens):
        raise ConfigError(
            f"Invalid {label} 'device={device}' requested. Use '{device_type}', '{device_type}:0' or "
            f"'{device_type}:0,1' (unique integer indices)."
        )
    count = backend.device_count()
    indices = [int(t) for t in tokens] or [int(backend.current_device())]
    if any(i >= count for i in indices):
        raise ConfigError(f"Invalid {label} 'device={device}' requested. Only {count} device(s) available.")
    if len(tokens) == 1:
        backend.set_device(indices[0])
    lines = []
    for i in indices:
        name = backend.get_device_name(i) if hasattr(backend, "get_device_name") else device_type
        lines.append(f"{label}:{i} ({name})")
    LOGGER.info(banner + ("\n" + " " * len(banner)).join(lines))
    return torch.device(device_type, indices[0])


def select_device(device: Any = "", newline: bool = False, verbose: bool = True) -> Any:
    """Resolve a device request (see ``parse_device``) to a ``torch.device``, check it, and log a banner.

    ``""`` is the current CUDA device if CUDA is available, else CPU. Only an explicit single-GPU request
    calls ``torch.cuda.set_device``; multi-GPU requests return the first GPU and leave the current device
    alone (each DDP rank pins its own). CPU and MPS set torch's thread count to ``NUM_THREADS``. A
    ``torch.device`` of another type (``meta``) and ``tpu``/``intel``/``vulkan`` strings are returned as given.
    Never touches ``CUDA_VISIBLE_DEVICES``.

    Raises:
        ConfigError (a ValueError): a CUDA/NPU/XPU request this machine cannot serve; the message lists what
            torch sees and how to ask for a valid device.
    """
    import torch

    from torchkit.versions import TORCH_2_0, TORCH_2_3

    if isinstance(device, torch.device) and device.type not in {"cpu", "cuda", "npu", "xpu"}:
        return device
    if isinstance(device, str) and device.lower().startswith(("tpu", "intel", "vulkan")):
        return device
    banner = _banner()
    device = parse_device(device)
    if device.startswith(("npu", "xpu")):
        return _select_npu_xpu(device, banner)

    cpu = device == "cpu"
    mps = device in {"mps", "mps:0"}
    if device and not cpu and not mps:
        tokens = device.split(",")
        count = torch.cuda.device_count()
        if not (torch.cuda.is_available() and all(_is_index(t) and int(t) < count for t in tokens)):
            LOGGER.info(banner)
            install = (
                "See https://pytorch.org/get-started/locally/ for up-to-date torch install instructions if no "
                "CUDA devices are seen by torch.\n"
                if count == 0
                else ""
            )
            raise ConfigError(
                f"Invalid CUDA 'device={device}' requested. Use 'device=cpu' or pass valid CUDA device(s) if "
                "available, i.e. 'device=0' or 'device=0,1,2,3' for Multi-GPU.\n"
                f"\ntorch.cuda.is_available(): {torch.cuda.is_available()}"
                f"\ntorch.cuda.device_count(): {count}"
                f"\nos.environ['CUDA_VISIBLE_DEVICES']: {os.environ.get('CUDA_VISIBLE_DEVICES')}\n"
                f"{install}"
            )

    if not cpu and not mps and torch.cuda.is_available():
        indices = [int(t) for t in device.split(",")] if device else [torch.cuda.current_device()]
        banner += ("\n" + " " * len(banner)).join(f"CUDA:{i} ({get_gpu_info(i)})" for i in indices) + "\n"
        if device and len(indices) == 1:  # only an explicit single-GPU request moves the current device
            torch.cuda.set_device(indices[0])
        chosen = f"cuda:{indices[0]}"
    elif mps and TORCH_2_0 and torch.backends.mps.is_available():
        banner += f"MPS ({get_cpu_info()})\n"
        chosen = "mps"
    else:  # "mps" on a machine without MPS lands here, as in the seed
        banner += f"CPU ({get_cpu_info()})\n"
        chosen = "cpu"

    if chosen in {"cpu", "mps"}:
        torch.set_num_threads(NUM_THREADS)
        if chosen == "cpu" and platform.system() == "Darwin" and platform.machine() == "arm64" and TORCH_2_3:
            torch.backends.nnpack.set_flags(
                False
            )  # the seed disables NNPACK there (its warnings flood the log)
    if verbose:
        LOGGER.info(banner if newline else banner.rstrip())
    return torch.device(chosen)
