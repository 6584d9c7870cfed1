"""Model statistics: parameter/gradient counts, forward FLOPs and the one-line model summary.

Re-implements Ultralytics' ``get_num_params``, ``get_num_gradients``, ``model_info``,
``model_info_for_loggers`` and ``get_flops`` (shared/reference/ultralytics-behaviour.md §2.13-2.16).

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` instead of ``thop``, on a copy of the
model whose parameters and buffers are **fake tensors** (``FakeTensorMode``): shapes propagate, nothing is
computed and no memory is allocated, so the count is made at the full input size, not extrapolated from a
stride-sized proxy as thop does. The model itself is never run or modified.

Convention (same as the seed): one multiply-add is 2 FLOPs, so ``GFLOPs = 2·MACs / 1e9`` of one forward pass
of a batch-1 input. What is counted is what FlopCounterMode has formulas for: matrix products (``mm``,
``addmm``, ``bmm``, ``baddbmm``), convolutions (also transposed) and scaled-dot-product attention (both
matmuls, ``2·b·h·Lq·Lk·(Eq+Ev)``; a causal mask is counted as full). Element-wise ops, normalisation and
pooling count 0 (thop counted some of them, so figures can differ slightly: the built-in ``yolo-n``, YOLOv8n's
size, counts 8.74 GFLOPs at 640 where Ultralytics publishes 8.7 for YOLOv8n; ``resnet18`` at 224 counts 3.63,
twice torchvision's 1.81 GMACs).

Known limitations: a model whose forward depends on tensor *values* (``.item()``, ``nonzero``) cannot run on
fake tensors; it is then counted with a real forward on a deep copy (logged), and 0.0 is returned only if
that fails too (logged as a warning).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

LOGGER = logging.getLogger(__name__)


def get_num_params(model: nn.Module) -> int:
    """Number of parameter elements (shared parameters counted once, as ``model.parameters()`` yields)."""
    return sum(p.numel() for p in model.parameters())


def get_num_gradients(model: nn.Module) -> int:
    """Number of parameter elements that require a gradient."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _attention_flops(query_shape: Sequence[int], key_shape: Sequence[int], value_shape: Sequence[int]) -> int:
    """``softmax(Q·Kᵀ)·V``: two matmuls, ``2·B·Lq·Lk·Eq + 2·B·Lq·Lk·Ev`` with B the product of the batch dims."""
    batch = math.prod(query_shape[:-2])
    len_q, dim_q = query_shape[-2], query_shape[-1]
    len_k, dim_v = key_shape[-2], value_shape[-1]
    return 2 * batch * len_q * len_k * (dim_q + dim_v)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return _attention_flops(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    # dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q: twice the forward's products
    return 2 * _attention_flops(query_shape, key_shape, value_shape)


def _custom_flop_formulas() -> dict[Any, Callable[..., int]]:
    """Formulas FlopCounterMode lacks (torch 2.13): the CPU flash-attention kernel that
    ``F.scaled_dot_product_attention`` dispatches to on CPU would otherwise count 0."""
    aten = torch.ops.aten
    formulas: dict[Any, Callable[..., int]] = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_flops
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_backward_flops
    return formulas


def flop_counter() -> Any:
    """A ``FlopCounterMode`` (no printing) that also counts attention on CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_custom_flop_formulas())


def _fake_copy(model: nn.Module, fake_mode: Any) -> nn.Module:
    """Deep copy of ``model`` whose parameters and buffers are fake tensors (no real memory is copied).

    Pre-filling deepcopy's memo maps every tensor to its fake twin, so tied weights stay tied and the rest of
    the module tree (attributes, submodules) is copied as usual.
    """
    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = nn.Parameter(
            fake_mode.from_tensor(param.detach()), requires_grad=param.requires_grad
        )
    for buffer in model.buffers():
        memo[id(buffer)] = fake_mode.from_tensor(buffer)
    return copy.deepcopy(model, memo)


def count_forward_flops(fn: Callable[..., Any], inputs: Sequence[Any]) -> int:
    """FLOPs of ``fn(*inputs)`` (forward only, no autograd graph), counted on fake tensors where possible.

    ``fn`` may be an ``nn.Module`` (copied with fake parameters: the original is neither run nor changed)
    or any callable (called with fake inputs). If fake execution fails, a module is counted with a real
    forward on a deep copy and a plain callable with a real call, and the reason is logged.

    Raises:
        Exception: whatever the real forward raises when the fallback fails too.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        target = _fake_copy(fn, fake_mode) if isinstance(fn, nn.Module) else fn
        fake_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
        with fake_mode, torch.no_grad(), flop_counter() as counter:
            target(*fake_inputs)
        return counter.get_total_flops()
    except Exception as e:  # fake tensors cannot run data-dependent code; counting for real is exact too
        LOGGER.info(
            "FLOPs: fake-tensor count failed (%s: %s); counting with a real forward", type(e).__name__, e
        )
    target = copy.deepcopy(fn) if isinstance(fn, nn.Module) else fn
    with torch.no_grad(), flop_counter() as counter:
        target(*inputs)
    return counter.get_total_flops()


def _unwrap(model: nn.Module) -> nn.Module:
    from torchkit.seed_api.model_utils import unwrap_model

    return unwrap_model(model)


def get_flops(model: nn.Module, imgsz: int | Sequence[int] = 640, *, inputs: Any = None) -> float:
    """GFLOPs of one forward pass of ``model`` on a ``1×C×h×w`` input (``2·MACs / 1e9``, the seed's unit).

    Args:
        model: the model (DP/DDP/compiled wrappers are unwrapped).
        imgsz: ``h = w = imgsz``, or ``(h, w)``. ``C`` is ``shape[1]`` of the first parameter (the input
            channels of a leading conv), and the input has that parameter's dtype and device.
        inputs: instead of an image, the example input(s) to count with (a tensor or a tuple of positional
            arguments), e.g. token ids for a language model. ``imgsz`` is then ignored.

    Returns:
        GFLOPs counted at the full size (no extrapolation), or 0.0 with a logged warning when counting fails.
        The seed returned 0.0 silently, and thop's 2× rule made its figure the same unit as this one.
    """
    try:
        model = _unwrap(model)
        if inputs is None:
            param = next(model.parameters(), None)
            if param is None or param.dim() < 2:
                raise ValueError(
                    "cannot infer the input channels (the first parameter is not a weight "
                    "matrix); pass inputs="
                )
            height, width = (imgsz, imgsz) if isinstance(imgsz, int | float) else tuple(imgsz)
            inputs = (
                torch.empty(
                    1, param.shape[1], int(height), int(width), dtype=param.dtype, device=param.device
                ),
            )
        elif not isinstance(inputs, tuple | list):
            inputs = (inputs,)
        return count_forward_flops(model, inputs) / 1e9
    except Exception as e:
        LOGGER.warning(
            "get_flops: could not count FLOPs of %s, reporting 0.0: %s: %s",
            type(model).__name__,
            type(e).__name__,
            e,
        )
        return 0.0


def _model_name(model: nn.Module) -> str:
    yaml_file = getattr(model, "yaml_file", "") or ""
    if not yaml_file:
        yaml = getattr(model, "yaml", None)
        yaml_file = yaml.get("yaml_file", "") if isinstance(yaml, dict) else ""
    return Path(str(yaml_file)).stem.replace("yolo", "YOLO") or "Model"


def _log_layer_table(layers: dict[str, nn.Module]) -> None:
    LOGGER.info(
        f"{'layer':>5}{'name':>40}{'type':>20}{'gradient':>10}{'parameters':>12}{'shape':>20}"
        f"{'mu':>10}{'sigma':>10}{'dtype':>15}"
    )
    for i, (name, module) in enumerate(layers.items()):
        name = name.replace("module_list.", "")
        kind = type(module).__name__
        params = list(module.named_parameters(recurse=False))
        if not params:
            LOGGER.info(
                f"{i:>5g}{name:>40}{kind:>20}{False!r:>10}{0:>12g}{'[]':>20}{'-':>10}{'-':>10}{'-':>15}"
            )
        for pname, p in params:
            values = p.detach().float()
            sigma = values.std().item() if p.numel() > 1 else 0.0  # std of one element is NaN
            LOGGER.info(
                f"{i:>5g}{f'{name}.{pname}':>40}{kind:>20}{p.requires_grad!r:>10}{p.numel():>12g}"
                f"{str(list(p.shape)):>20}{values.mean().item():>10.3g}{sigma:>10.3g}"
                f"{str(p.dtype).replace('torch.', ''):>15}"
            )


def model_info(
    model: nn.Module, detailed: bool = False, verbose: bool = True, imgsz: int | Sequence[int] = 640
) -> tuple[int, int, int, float] | None:
    """Log a one-line summary of ``model`` (and, if ``detailed``, one line per parameter of each leaf layer).

    Summary: ``"{Name} summary{ (fused)}: {layers:,} layers, {params:,} parameters, {grads:,} gradients, {X.X}
    GFLOPs"``; Name is the stem of ``model.yaml_file`` (``yolo`` → ``YOLO``) or ``Model``; the GFLOPs part is
    left out when FLOPs are 0. Layers are the modules without children.

    Returns:
        ``(n_layers, n_params, n_gradients, gflops)``, or None when ``verbose`` is False (nothing computed).
    """
    if not verbose:
        return None
    n_params = get_num_params(model)
    n_grads = get_num_gradients(model)
    layers = {name: m for name, m in model.named_modules() if len(m._modules) == 0}
    if detailed:
        _log_layer_table(layers)
    flops = get_flops(model, imgsz)
    is_fused = getattr(model, "is_fused", None)
    fused = " (fused)" if callable(is_fused) and is_fused() else ""
    flops_text = f", {flops:.1f} GFLOPs" if flops else ""
    LOGGER.info(
        f"{_model_name(model)} summary{fused}: {len(layers):,} layers, {n_params:,} parameters, "
        f"{n_grads:,} gradients{flops_text}"
    )
    return len(layers), n_params, n_grads, flops


def model_info_for_loggers(trainer: Any) -> dict[str, float | int]:
    """Figures a training logger records once: ``model/parameters``, ``model/GFLOPs`` (3 decimals) and
    ``model/speed_PyTorch(ms)`` (the last validation's inference time per image).

    ``trainer`` needs ``.model``, ``.args.imgsz`` and ``.validator.speed["inference"]``.

    Difference from the seed: ``trainer.args.profile`` (ONNX/TensorRT timing through Ultralytics'
    ``ProfileModels``) is not part of torchkit; when set, a warning is logged and the PyTorch figures are
    reported.
    """
    args = trainer.args
    if getattr(args, "profile", False):
        LOGGER.warning(
            "model_info_for_loggers: ONNX/TensorRT profiling (args.profile) is not available in "
            "torchkit; reporting PyTorch figures only"
        )
    results: dict[str, float | int] = {
        "model/parameters": get_num_params(trainer.model),
        "model/GFLOPs": round(get_flops(trainer.model, getattr(args, "imgsz", 640)), 3),
    }
    results["model/speed_PyTorch(ms)"] = round(trainer.validator.speed["inference"], 3)
    return results
