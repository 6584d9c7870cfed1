"""Small model helpers: unwrapping, attribute and state-dict copying, weight settings, test-time image
scaling and a ``torch.compile`` that never breaks the caller (shared/reference/ultralytics-behaviour.md §2.17-2.19, §2.27).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

LOGGER = logging.getLogger(__name__)

#: padding value of ``scale_img``: 0.447 ≈ the ImageNet mean pixel (the seed's constant)
SCALE_IMG_PAD_VALUE = 0.447


def is_parallel(model: Any) -> bool:
    """True if ``model`` is wrapped in ``nn.DataParallel`` or ``DistributedDataParallel``."""
    return isinstance(model, nn.parallel.DataParallel | nn.parallel.DistributedDataParallel)


def unwrap_model(m: nn.Module) -> nn.Module:
    """Strip ``torch.compile`` (``._orig_mod``) and DP/DDP (``.module``) wrappers, in any nesting, as long as
    the wrapped object is an ``nn.Module``."""
    while True:
        inner = getattr(m, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(m, "module", None)
        if not isinstance(inner, nn.Module):
            return m
        m = inner


def initialize_weights(model: nn.Module) -> None:
    """Apply Ultralytics' layer settings: every ``nn.BatchNorm2d`` gets ``eps=1e-3`` and ``momentum=0.03``.

    Conv2d weights keep torch's default init. Follows the newest seed: Ultralytics <=8.4.0 also set
    ``inplace=True`` on Hardswish/LeakyReLU/ReLU/ReLU6/SiLU; the newest leaves activations as built, and so
    does this (an in-place activation can overwrite a tensor autograd saved for backward).
    """
    for m in model.modules():
        if type(m) is nn.BatchNorm2d:  # exact type, as the seed: SyncBatchNorm etc. keep their settings
            m.eps = 1e-3
            m.momentum = 0.03


def scale_img(img: torch.Tensor, ratio: float = 1.0, same_shape: bool = False, gs: int = 32) -> torch.Tensor:
    """Resize a ``B×C×H×W`` batch by ``ratio`` (bilinear) and pad it right/bottom with 0.447.

    Without ``same_shape`` the result is ``ceil(H·r/gs)·gs × ceil(W·r/gs)·gs``; with it, the original
    ``H × W`` (padding, or cropping when ``r > 1``). ``ratio == 1`` returns ``img`` itself.
    """
    if ratio == 1.0:
        return img
    height, width = img.shape[2:]
    new_size = (int(height * ratio), int(width * ratio))
    img = F.interpolate(img, size=new_size, mode="bilinear", align_corners=False)
    if not same_shape:
        height, width = (math.ceil(x * ratio / gs) * gs for x in (height, width))
    return F.pad(img, [0, width - new_size[1], 0, height - new_size[0]], value=SCALE_IMG_PAD_VALUE)


def copy_attr(a: Any, b: Any, include: Collection[str] = (), exclude: Collection[str] = ()) -> None:
    """Copy ``b.__dict__`` items onto ``a``, skipping private names (leading ``_``), names in ``exclude``
    and, when ``include`` is not empty, names not in it."""
    for key, value in b.__dict__.items():
        if (include and key not in include) or key.startswith("_") or key in exclude:
            continue
        setattr(a, key, value)


def intersect_dicts(
    da: Mapping[str, Any], db: Mapping[str, Any], exclude: Collection[str] = ()
) -> dict[str, Any]:
    """Items of ``da`` whose key is in ``db`` with a value of the same ``.shape`` and contains none of the
    ``exclude`` substrings (values from ``da``)."""
    return {
        k: v for k, v in da.items() if k in db and all(x not in k for x in exclude) and v.shape == db[k].shape
    }


def _inductor_unavailable_reason(device: torch.device) -> str | None:
    """Why the inductor backend cannot compile for ``device``, or None if it looks usable.

    ``torch.compile`` is lazy, so a missing C++ compiler (CPU) or Triton (CUDA) would otherwise surface at
    the first forward, inside the caller's loop.
    """
    try:
        if device.type == "cpu":
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        elif device.type == "cuda":
            from torch.utils._triton import has_triton

            if not has_triton():
                return "no working Triton found (pip install triton)"
    except ImportError as e:  # the check moved in this torch version: let torch.compile decide
        LOGGER.debug("compile: prerequisite check unavailable (%s); trying anyway", e)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def attempt_compile(
    model: nn.Module,
    device: torch.device | str,
    imgsz: int = 640,
    use_autocast: bool = False,
    warmup: bool = False,
    mode: bool | str = "default",
) -> nn.Module:
    """``torch.compile(model, mode=mode, backend="inductor")``, or ``model`` unchanged with a logged reason.

    Args:
        model: the model to compile.
        device: device of the warmup input (a ``torch.device`` or a string such as ``"cuda:0"``).
        imgsz: the warmup input is zeros of shape ``(1, 3, imgsz, imgsz)``.
        use_autocast: run the warmup under autocast on CUDA/MPS (input in fp16 on CUDA).
        warmup: run one forward under inference mode right away, so compilation happens here.
        mode: ``True`` → ``"default"``, falsy → no compile, or a torch.compile mode string.

    Never raises: without ``torch.compile``, without the inductor prerequisites (C++ compiler on CPU, Triton
    on CUDA), when ``torch.compile`` fails, or when the warmup forward fails (the seed let that exception
    through), a warning says why and the original model is returned.

    Known limitations: without ``warmup`` compilation happens at the caller's first forward, and errors then
    are the caller's.
    """
    if not mode:
        return model
    if not hasattr(torch, "compile"):
        LOGGER.warning(
            "compile: torch.compile is not available in torch %s, continuing uncompiled", torch.__version__
        )
        return model
    mode = "default" if mode is True else mode
    device = torch.device(device)
    reason = _inductor_unavailable_reason(device)
    if reason is not None:
        LOGGER.warning("compile: inductor backend unavailable, continuing uncompiled: %s", reason)
        return model

    LOGGER.info("compile: starting torch.compile with '%s' mode...", mode)
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(model, mode=mode, backend="inductor")
    except Exception as e:
        LOGGER.warning("compile: torch.compile failed, continuing uncompiled: %s: %s", type(e).__name__, e)
        return model
    t_compile = time.perf_counter() - t0
    if not warmup:
        LOGGER.info("compile: compile complete in %.1fs (no warmup)", t_compile)
        return compiled

    t1 = time.perf_counter()
    try:
        dummy = torch.zeros(1, 3, imgsz, imgsz, device=device)
        if use_autocast and device.type == "cuda":
            dummy = dummy.half()
        with torch.inference_mode():
            if use_autocast and device.type in {"cuda", "mps"}:
                with torch.autocast(device.type):
                    compiled(dummy)
            else:
                compiled(dummy)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:
        LOGGER.warning(
            "compile: warmup of the compiled model failed, continuing uncompiled: %s: %s", type(e).__name__, e
        )
        return model
    t_warm = time.perf_counter() - t1
    LOGGER.info(
        "compile: complete in %.1fs (compile %.1fs + warmup %.1fs)", t_compile + t_warm, t_compile, t_warm
    )
    return compiled
