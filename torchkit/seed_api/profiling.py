"""Timing and memory profiling of modules: synchronised clocks, reserved accelerator memory, and
``profile_ops``, the per-op speed/memory/FLOPs table that autobatch builds its memory curve from
(shared/reference/ultralytics-behaviour.md §2.9, §2.20, §2.21).

Deliberate differences from the seed:
- ``cuda_memory_usage`` reports the **peak** reserved memory of the block (peak counters reset at entry),
  not the reserved memory at exit: the two agree unless the allocator released cache inside the block, which
  it does exactly when an allocation nearly fails (free-cache-and-retry), i.e. near the limit autobatch is
  looking for.
- ``profile_ops`` counts FLOPs with ``FlopCounterMode`` on fake tensors (see ``torchkit.seed_api.stats``) instead of
  thop, tells an out-of-memory failure (logged at INFO, as expected while probing) from any other error
  (logged as a WARNING with its type), logs a failing backward once instead of swallowing it, and drops its
  reference to each iteration's output before the next forward (the seed kept two outputs alive at once).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from torchkit.step.oom import is_out_of_memory_error
from torchkit.units import GIB

LOGGER = logging.getLogger(__name__)

#: loss-memory envelope of a detection head per image, in float32 elements per (anchor, object/class slot):
#: the factor 6 covers the assigner's metric/top-k state and the BCE path under AMP (shared/reference/ultralytics-behaviour.md §2.20 step 5)
LOSS_ENVELOPE_FACTOR = 6


def _device_type(device: Any) -> str:
    if device is None:
        return "cuda"
    if isinstance(device, torch.device):
        return device.type
    return str(device).split(":", 1)[0]


def _accelerator(device: Any) -> Any:
    """The torch backend module (``torch.cuda``, ``torch.xpu``, ...) of ``device`` if it is an available
    accelerator; None for cpu/mps (the seed's rule) or when the backend is missing or not available."""
    device_type = _device_type(device)
    if device_type in {"cpu", "mps"}:
        return None
    try:
        backend = torch.get_device_module(device_type)
    except (RuntimeError, AttributeError):
        return None
    is_available = getattr(backend, "is_available", None)
    return backend if callable(is_available) and is_available() else None


def time_sync(device: torch.device | str | None = None) -> float:
    """``time.perf_counter()`` after waiting for ``device``'s queued kernels (CUDA when ``device`` is None).

    CPU and MPS are not synchronised (as the seed).
    """
    backend = _accelerator(device)
    if backend is not None and hasattr(backend, "synchronize"):
        backend.synchronize()
    return time.perf_counter()


@contextmanager
def cuda_memory_usage(device: torch.device | str | None = None) -> Iterator[dict[str, int]]:
    """Yield ``{"memory": 0}``; on an accelerator, set ``memory`` to the peak bytes reserved by torch's
    caching allocator during the block (set even if the block raises).

    The cache is emptied at entry so the figure belongs to the block. On CPU and MPS, or without an available
    accelerator, ``memory`` stays 0.
    """
    info = {"memory": 0}
    backend = _accelerator(device)
    if backend is None or not hasattr(backend, "memory_reserved"):
        yield info
        return
    index = None if device is None else torch.device(device)
    backend.empty_cache()
    has_peak = hasattr(backend, "max_memory_reserved") and hasattr(backend, "reset_peak_memory_stats")
    if has_peak:
        backend.reset_peak_memory_stats(index)
    try:
        yield info
    finally:
        info["memory"] = backend.max_memory_reserved(index) if has_peak else backend.memory_reserved(index)


def _tensor_leaves(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in _tensor_leaves(item)]
    return []


def _shape(obj: Any) -> tuple[int, ...] | str:
    return tuple(obj.shape) if isinstance(obj, torch.Tensor) else "list"


def _loss_envelope_gib(op: Any, x: torch.Tensor, max_num_obj: int) -> float:
    """Memory a detection loss adds per batch: ``B·A·6·(max_num_obj + 2·nc)·4 B``, in GiB.

    ``A = Σ_s (W/s)·(H/s)`` anchors over the head's strides, ``nc = len(op.names)``; the 2× on nc covers
    validation at up to twice the batch. Returns 0 with a warning for an op without ``stride``/``names``.
    """
    strides, names = getattr(op, "stride", None), getattr(op, "names", None)
    if strides is None or names is None:
        LOGGER.warning(
            "profile_ops: max_num_obj=%d given but %s has no 'stride'/'names'; loss memory not added",
            max_num_obj,
            type(op).__name__,
        )
        return 0.0
    strides = strides.tolist() if isinstance(strides, torch.Tensor) else list(strides)
    anchors = sum((x.shape[-1] / s) * (x.shape[-2] / s) for s in strides)
    return x.shape[0] * anchors * LOSS_ENVELOPE_FACTOR * (max_num_obj + 2 * len(names)) * 4 / GIB


def _op_gflops(op: Any, x: torch.Tensor) -> float:
    from torchkit.seed_api.stats import count_forward_flops

    try:
        return count_forward_flops(op, (x,)) / 1e9
    except Exception as e:
        LOGGER.warning(
            "profile_ops: could not count FLOPs of %s, reporting 0: %s: %s",
            type(op).__name__,
            type(e).__name__,
            e,
        )
        return 0.0


def _profile_one(
    x: torch.Tensor, op: Any, n: int, device: torch.device, accelerator: Any, max_num_obj: int
) -> list[Any]:
    """One row ``[params, GFLOPs, mem_GiB, fwd_ms, bwd_ms, in_shape, out_shape]``; raises on failure."""
    forward_s = backward_s = 0.0
    memory_bytes = 0
    out_shape: tuple[int, ...] | str = "list"
    backward_error: str | None = None
    for _ in range(n):
        with cuda_memory_usage(device) as usage:
            t0 = time_sync(device)
            y = op(x)
            t1 = time_sync(device)
            out_shape = _shape(y)
            try:
                sum(t.sum() for t in _tensor_leaves(y)).backward()
                t2 = time_sync(device)
            except Exception as e:  # an op without a differentiable output: no backward time
                if is_out_of_memory_error(e):
                    raise  # running out of memory in backward is an OOM of the op, not a missing backward
                backward_error = f"{type(e).__name__}: {e}"
                t2 = float("nan")
            del y  # the next forward must not run while this output is still alive
        memory_bytes = usage["memory"]  # the last iteration's peak, as the seed (not a sum)
        forward_s += t1 - t0
        backward_s += t2 - t1
    if backward_error is not None:
        LOGGER.warning(
            "profile_ops: backward of %s failed, backward time is NaN: %s", type(op).__name__, backward_error
        )
    flops = _op_gflops(op, x)  # after the timed runs: an op that fails is reported once, by the caller
    mem_gib = memory_bytes / GIB
    if max_num_obj and accelerator is not None:
        mem_gib += _loss_envelope_gib(op, x, max_num_obj)
    params = sum(p.numel() for p in op.parameters()) if isinstance(op, nn.Module) else 0
    return [params, flops, mem_gib, forward_s * 1000 / n, backward_s * 1000 / n, _shape(x), out_shape]


def profile_ops(
    input: torch.Tensor | Sequence[torch.Tensor],
    ops: Any,
    n: int = 10,
    device: torch.device | str | None = None,
    max_num_obj: int = 0,
) -> list[list[Any] | None]:
    """Profile each op in ``ops`` on each tensor in ``input``: forward and backward time, peak reserved
    memory, FLOPs.

    Args:
        input: a tensor or a list of tensors (moved to ``device``; floating ones get ``requires_grad``).
        ops: an ``nn.Module``/callable or a list of them (modules are moved to ``device``, and to half when
            the input is fp16).
        n: iterations to average the times over.
        device: a ``torch.device``, or a spec for ``torchkit.seed_api.device.select_device`` (``None``/``""`` = auto).
        max_num_obj: if set and the device is an accelerator, add a detection loss's memory envelope for
            this many objects per image (needs ``op.stride`` and ``op.names``).

    Returns:
        For each (input, op) pair, input-major: ``[params, GFLOPs, mem_GiB, fwd_ms, bwd_ms, in_shape,
        out_shape]`` (shapes are tuples, or ``"list"`` for non-tensors; ``mem_GiB`` is 0 on CPU/MPS;
        ``bwd_ms`` NaN when backward failed), or ``None`` when the op failed: an out-of-memory failure
        (``is_out_of_memory_error``) is logged at INFO, any other at WARNING.
    """
    if not isinstance(device, torch.device):
        from torchkit.seed_api.device import select_device

        device = select_device(device, verbose=False)
    LOGGER.info(
        f"{'Params':>12s}{'GFLOPs':>12s}{'GPU_mem (GiB)':>14s}{'forward (ms)':>14s}"
        f"{'backward (ms)':>14s}{'input':>24s}{'output':>24s}"
    )
    accelerator = _accelerator(device)
    gc.collect()
    if accelerator is not None:
        accelerator.empty_cache()

    results: list[list[Any] | None] = []
    for x in input if isinstance(input, list | tuple) else [input]:
        x = x.to(device)
        if x.is_floating_point() or x.is_complex():
            x.requires_grad = True
        for op in ops if isinstance(ops, list | tuple) else [ops]:
            op = op.to(device) if hasattr(op, "to") else op
            if hasattr(op, "half") and x.dtype is torch.float16:
                op = op.half()
            x.grad = None  # gradients of the previous op must not count towards this one
            try:
                row = _profile_one(x, op, n, device, accelerator, max_num_obj)
                params, flops, mem, t_fwd, t_bwd, s_in, s_out = row
                LOGGER.info(
                    f"{params:12}{flops:12.4g}{mem:>14.3f}{t_fwd:14.4g}{t_bwd:14.4g}"
                    f"{s_in!s:>24s}{s_out!s:>24s}"
                )
                results.append(row)
            except Exception as e:
                if is_out_of_memory_error(e):
                    LOGGER.info(
                        "profile_ops: out of memory for input %s: %s", _shape(x), str(e).split("\n")[0]
                    )
                else:
                    LOGGER.warning(
                        "profile_ops: %s failed on input %s: %s: %s",
                        type(op).__name__,
                        _shape(x),
                        type(e).__name__,
                        e,
                    )
                results.append(None)
            finally:
                x.grad = None
                gc.collect()
                if accelerator is not None:
                    accelerator.empty_cache()
    return results
