"""FLOPs and bytes moved per operator of a training step, recorded on fake tensors.

FLOPs come from PyTorch's own formulas (``torch.utils.flop_counter.flop_registry``: matmul, convolution,
attention and their backwards) plus the CPU flash-attention operators the registry lacks, and our own
formula for a convolution's backward (see :func:`_conv_backward_flops`: torch's counts a grouped
convolution's weight gradient ``groups`` times over); every other
operator counts 0 FLOPs, as ``FlopCounterMode`` does (elementwise work is bandwidth-bound and the roofline
charges it through its bytes). Bytes moved are those of ``torch.utils._runtime_estimation``: every tensor
an operator reads plus every tensor it writes (a broadcast dimension counts once), so an in-place op is
charged read + write. View and metadata-only operators (``view``, ``t``, ``expand``, ``detach``, ...) and
bare allocations (``empty*``) are not kernels and are skipped.

Known limitations: causal attention is charged half the FLOPs of full attention (flash kernels skip the
masked half; torch's formula does not); fused optimizers and compiled graphs would move fewer bytes
than the eager operators recorded here.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Literal

ComputeClass = Literal["fp32", "fp16", "bf16"]
OpKind = Literal["conv", "matmul", "attention", "other"]

_ATTENTION_NAMES = ("attention", "sdpa")
_CONV_NAMES = frozenset({"convolution", "convolution_backward", "_convolution"})
_SKIPPED_NAMES = frozenset(
    {
        "empty",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_like",  # allocation only
        "_local_scalar_dense",
        "lift_fresh",
        "detach",
        "alias",
    }  # no kernel
)


@dataclass(frozen=True, kw_only=True)
class KernelCost:
    """One operator call: what the roofline prices."""

    name: str
    """aten overload, e.g. ``convolution.default``"""
    flops: int
    """floating-point operations (0 where torch has no formula)"""
    bytes_moved: int
    """bytes read + written"""
    compute: ComputeClass
    """dtype the math runs in (first floating input), picks the peak FLOP/s"""
    kind: OpKind
    """conv / matmul / attention / other (conv may run on TF32 tensor cores; see roofline)"""
    groups: int = 1
    """a convolution's ``groups`` (ResNeXt's grouped, MobileNet's depthwise convolutions: > 1), 1 otherwise"""
    phase: str = ""
    """the part of the step that ran it: ``forward``, ``backward`` or ``optimizer`` ("" where not told)"""


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """Per-operator totals over one training step."""

    name: str
    count: int
    flops: int
    bytes_moved: int


@functools.lru_cache(maxsize=4096)
def _classify(func: Any) -> str | None:
    """``None`` for ops that launch no kernel (views, bare allocations), else the packet name."""
    name = func._overloadpacket.__name__
    if name in _SKIPPED_NAMES:
        return None
    if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
        return None  # a view: metadata only
    return name


def _tensor_bytes(t: Any) -> int:
    numel = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            numel *= int(size)
    return numel * t.element_size()


def _cpu_flash_attention_flops(func: Any, args: tuple, kwargs: dict) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    if not func._overloadpacket.__name__.endswith("_backward"):
        q, k, v = args[:3]
        causal = bool(args[4] if len(args) > 4 else kwargs.get("is_causal", False))
        flops = sdpa_flop_count(q.shape, k.shape, v.shape)
    else:
        grad_out, q, k, v = args[:4]
        causal = bool(args[7] if len(args) > 7 else kwargs.get("is_causal", False))
        flops = sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape)
    return flops // 2 if causal else flops


def _lstm_layer_flops(func: Any, args: tuple, kwargs: dict) -> int:
    """One LSTM layer over the whole sequence (oneDNN's ``mkldnn_rnn_layer``, what ``nn.LSTM`` runs on a CPU
    tensor, fake ones included): the gate GEMMs ``2·T·B·4H·(I + H)`` forward, twice that backward (input
    and weight gradients). The registry has no formula, so without this an LSTM was charged its bytes
    only and looked almost free on every GPU. Elementwise gate math is left to the bytes, as elsewhere."""
    x, w_ih, w_hh = args[:3]
    gates, in_features = int(w_ih.shape[0]), int(w_ih.shape[1])
    steps_times_batch = x.numel() // max(in_features, 1)
    forward = 2 * steps_times_batch * gates * (in_features + int(w_hh.shape[1]))
    return 2 * forward if func._overloadpacket.__name__.endswith("_backward") else forward


def _conv_backward_flops(func: Any, args: tuple, kwargs: dict) -> int:
    """``convolution_backward``: each gradient it computes (input, weight) costs what the forward does,
    ``2·N·spatial·prod(weight.shape)`` with ``spatial`` the output's (a transposed convolution: the input's).

    torch's formula (``flop_counter.conv_backward_flop``, 2.13 and earlier) prices the weight gradient as a
    convolution over the *full* input channels, so a grouped one is charged ``groups`` times its work:
    ResNeXt-101 32x4d's 3x3 convolutions came out at 32 GFLOP per image instead of 3, and a depthwise one
    (groups = channels) hundreds of times over (pytorch/pytorch#183405 divides by ``groups`` upstream).
    This formula is exact for any ``groups``, so it does not depend on the torch version."""
    grad_out, x, weight = args[:3]
    transposed = bool(args[7] if len(args) > 7 else kwargs.get("transposed", False))
    mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True, True, True))
    spatial = x.shape[2:] if transposed else grad_out.shape[2:]
    forward = (
        2 * int(x.shape[0]) * math.prod(int(s) for s in spatial) * math.prod(int(s) for s in weight.shape)
    )
    return forward * (int(bool(mask[0])) + int(bool(mask[1])))


_EXTRA_FLOPS = {
    "convolution_backward": _conv_backward_flops,
    "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_attention_flops,
    "mkldnn_rnn_layer": _lstm_layer_flops,
    "mkldnn_rnn_layer_backward": _lstm_layer_flops,
}


def kernel_cost(func: Any, args: tuple, kwargs: dict, out: Any) -> KernelCost | None:
    """The cost of one operator call, or None if it launches no kernel (views, allocations)."""
    packet_name = _classify(func)
    if packet_name is None:
        return None
    import torch
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    moved = sum(_tensor_bytes(t) for t in inputs) + sum(_tensor_bytes(t) for t in outputs)
    flops = 0
    packet = func._overloadpacket
    if packet_name in _EXTRA_FLOPS:
        flops = _EXTRA_FLOPS[packet_name](func, args, kwargs)
    elif packet in flop_registry:
        flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
    compute: ComputeClass = "fp32"
    for t in inputs:
        if t.is_floating_point():
            compute = "fp16" if t.dtype == torch.float16 else "bf16" if t.dtype == torch.bfloat16 else "fp32"
            break
    name = str(func.__name__)
    groups = 1
    if packet_name in _CONV_NAMES:
        kind: OpKind = "conv"
        groups = _conv_groups(packet_name, args, kwargs)
    elif any(s in name for s in _ATTENTION_NAMES):
        kind = "attention"
    elif flops:
        kind = "matmul"
    else:
        kind = "other"
    return KernelCost(name=name, flops=flops, bytes_moved=moved, compute=compute, kind=kind, groups=groups)


_GROUPS_ARG = {"convolution": 8, "_convolution": 8, "convolution_backward": 9}
"""position of ``groups`` in the aten schemas (native_functions.yaml: convolution(input, weight, bias,
stride, padding, dilation, transposed, output_padding, groups); convolution_backward(grad_output, input,
weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask))"""


def _conv_groups(packet_name: str, args: tuple, kwargs: dict) -> int:
    index = _GROUPS_ARG[packet_name]
    value = args[index] if len(args) > index else kwargs.get("groups", 1)
    return int(value)


class OpCostRecorder:
    """Collects ``KernelCost`` of every op while ``enabled`` (the estimator enables it for one iteration),
    each marked with the ``phase`` the estimator says the step is in."""

    def __init__(self) -> None:
        self.enabled = False
        self.phase = ""
        self.kernels: list[KernelCost] = []

    def __call__(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self.enabled:
            cost = kernel_cost(func, args, kwargs, out)
            if cost is not None:
                self.kernels.extend(_per_step_kernels(replace(cost, phase=self.phase), func, args))


def _per_step_kernels(cost: KernelCost, func: Any, args: tuple) -> list[KernelCost]:
    """A recurrent layer is one operator but T dependent steps (cuDNN launches per-step GEMMs): charge
    it as T kernels sharing its FLOPs and bytes, so the launch-bound time of a long sequence at a small
    batch is not one kernel's."""
    if func._overloadpacket.__name__ not in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
        return [cost]
    steps = max(1, int(args[0].shape[0]))  # ATen passes the input time-major whatever batch_first says
    share = KernelCost(
        name=cost.name,
        flops=cost.flops // steps,
        bytes_moved=cost.bytes_moved // steps,
        compute=cost.compute,
        kind=cost.kind,
        phase=cost.phase,
    )
    return [share] * steps


def aggregate(kernels: tuple[KernelCost, ...] | list[KernelCost]) -> tuple[OpCost, ...]:
    """Per-operator totals, largest FLOPs first, then largest bytes."""
    count: dict[str, int] = defaultdict(int)
    flops: dict[str, int] = defaultdict(int)
    moved: dict[str, int] = defaultdict(int)
    for k in kernels:
        count[k.name] += 1
        flops[k.name] += k.flops
        moved[k.name] += k.bytes_moved
    rows = [OpCost(name=n, count=count[n], flops=flops[n], bytes_moved=moved[n]) for n in count]
    return tuple(sorted(rows, key=lambda r: (-r.flops, -r.bytes_moved, r.name)))
