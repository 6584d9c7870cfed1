"""Precision contexts: inference mode for decorated functions and mixed-precision autocast.

Re-implements Ultralytics' ``smart_inference_mode`` and ``autocast`` (shared/reference/ultralytics-behaviour.md §2.3, §2.4) for torch>=2.4
(the project's floor), so the branches for torch<1.13 are gone.

Deliberate differences from the seed:
- ``autocast(torch.bfloat16, "cpu")`` is allowed: CPU autocast runs bf16 natively (it is even torch's CPU
  default). The seed refused bf16 everywhere but CUDA.
- ``device`` may be a ``torch.device`` or an indexed string (``"cuda:1"``); only its type matters to autocast.
- On ``mps`` with torch<2.5 autocast is disabled (as the seed) but with a logged warning, not silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch

LOGGER = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def smart_inference_mode(mode: bool = True) -> Callable[[F], F]:
    """Decorator factory: run the decorated function under ``torch.inference_mode`` (or explicitly outside it).

    Args:
        mode: ``True`` wraps the function in ``torch.inference_mode()``; if inference mode is already on when
            the decorator is applied, the function is returned unchanged (the seed's pass-through). ``False``
            runs it with inference mode off **and** gradients off (``inference_mode(False)`` + ``no_grad()``),
            for code that must produce normal tensors (usable later in autograd-free training code) without
            recording a graph.

    Generator functions are supported (torch's decorators handle them).

    Raises:
        TypeError: when used bare (``@smart_inference_mode`` instead of ``@smart_inference_mode()``).
    """
    if callable(mode):
        raise TypeError(
            "smart_inference_mode is a decorator factory: write @smart_inference_mode() (with parentheses), "
            "or @smart_inference_mode(False) for no_grad outside inference mode"
        )

    def decorate(fn: F) -> F:
        if mode:
            if torch.is_inference_mode_enabled():
                return fn  # already inside inference mode: wrapping again would change nothing
            return torch.inference_mode()(fn)
        # no_grad innermost: entering inference_mode(False) turns grad mode back on
        return torch.inference_mode(False)(torch.no_grad()(fn))

    return decorate


def _device_type(device: str | torch.device) -> str:
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":", 1)[0]


def _cuda_has_native_bf16() -> bool:
    # including_emulation=False: pre-Ampere GPUs "support" bf16 only by emulation, which is slower than fp32
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def autocast(enabled: bool | torch.dtype, device: str | torch.device = "cuda") -> Any:
    """Return an autocast context manager for ``device``.

    Args:
        enabled: ``True``/``False`` to turn autocast on with the device's default dtype (fp16 on CUDA, bf16 on
            CPU) or off; a ``torch.dtype`` turns it on with that dtype.
        device: device type (``"cuda"``, ``"cpu"``, ``"mps"``, ``"npu"``, ...) or a ``torch.device``.

    Raises:
        RuntimeError: bf16 requested on CUDA without native bf16 support (needs compute capability >= 8.0,
            or ROCm). Other device types are left to torch, which warns and disables autocast for a dtype
            the device does not support.
        ImportError: ``device="npu"`` without ``torch_npu`` installed.
    """
    dtype: torch.dtype | None = None
    if isinstance(enabled, torch.dtype):
        dtype, enabled = enabled, True
    device_type = _device_type(device)

    if dtype is torch.bfloat16 and device_type == "cuda" and not _cuda_has_native_bf16():
        raise RuntimeError(
            "bfloat16 autocast requires CUDA with native bfloat16 support (compute capability >= 8.0, e.g. "
            "A100/L4/H100/RTX 30xx); use torch.float16 on this GPU"
        )

    kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    if device_type == "npu":
        try:
            import torch_npu  # type: ignore[import-not-found]
        except ImportError as e:
            raise ImportError("autocast on 'npu' needs the torch_npu package (pip install torch-npu)") from e
        return torch_npu.npu.amp.autocast(enabled, **kwargs)

    if device_type == "mps":
        from torchkit.versions import TORCH_2_5

        if not TORCH_2_5:
            LOGGER.warning(
                "autocast: MPS autocast needs torch>=2.5 (have %s); running without autocast",
                torch.__version__,
            )
            return torch.amp.autocast("cpu", enabled=False)

    return torch.amp.autocast(device_type, enabled=bool(enabled), **kwargs)
