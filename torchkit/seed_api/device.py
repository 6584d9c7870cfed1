"""Device selection, the seed's ``torch_utils`` surface: ``select_device`` turns a device request into a
``torch.device`` (checked, with the seed's banner); ``get_torch_device_backend`` and ``get_gpu_info`` as in
the seed. ``parse_device`` (which devices a request names) is the engine's
(``torchkit.process.device``) and ``get_cpu_info`` the hardware edge's (``torchkit.hardware.host``); both
are re-exported here, so the seed's names stay where they were.

torch is imported inside the functions.

Deliberate differences from the seed (newest Ultralytics), besides ``parse_device``'s (see its module):
``select_device`` never changes ``CUDA_VISIBLE_DEVICES`` (neither does the newest seed; older ones did and
silently ran ``device=1`` on GPU 0 once CUDA was initialised). Bad requests raise ``ConfigError``, a
``ValueError`` as in the seed, so the CLI shows them as one line.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from typing import TYPE_CHECKING, Any

from torchkit.errors import ConfigError
from torchkit.hardware.host import get_cpu_info
from torchkit.process.device import (  # noqa: F401  (the seed module keeps every name it had)
    AUTO_MIN_MEMORY_FRACTION,
    is_device_index,
    parse_device,
    torch_index_by_nvml_index,
)

if TYPE_CHECKING:
    import torch

LOGGER = logging.getLogger(__name__)

# the seed's thread count for CPU/MPS runs: leave a core for the data loader, at most 8
NUM_THREADS = min(8, max(1, (os.cpu_count() or 1) - 1))

__all__ = ["get_cpu_info", "get_gpu_info", "get_torch_device_backend", "parse_device", "select_device"]


def get_torch_device_backend(device: torch.device | str) -> Any:
    """The torch module for a device type: ``"cuda"`` → ``torch.cuda``, ``"npu:0"`` → ``torch.npu``."""
    import torch

    device_type = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if hasattr(torch, "get_device_module"):
        return torch.get_device_module(device_type)
    return getattr(torch, device_type)


@functools.lru_cache
def get_gpu_info(index: int) -> str:
    """``"{name}, {total MiB}MiB"`` for a torch CUDA index, e.g. ``"Tesla T4, 15102MiB"``."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return f"{props.name}, {props.total_memory / (1 << 20):.0f}MiB"


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
    if any(not is_device_index(t) for t in tokens) or len(set(tokens)) != len(tokens):
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
        if not (torch.cuda.is_available() and all(is_device_index(t) and int(t) < count for t in tokens)):
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
