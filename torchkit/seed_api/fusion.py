"""Fold a BatchNorm into the convolution before it, for inference (shared/reference/ultralytics-behaviour.md §2.10, §2.11).

With ``s = γ / √(running_var + eps)`` per output channel:

    W' = W · s            (each output channel's filter scaled)
    b' = (b − running_mean) · s + β      (a missing conv bias counts as 0 and is created)

so ``conv'(x) == bn(conv(x))`` for a BN in eval mode. Both functions change the conv in place, turn its
gradients off and return it.

Differences from the seed:
- Works for 1-D/2-D/3-D convolutions, BNs without affine parameters (γ=1, β=0) and ``nn.Identity`` in place
  of the BN for both functions (the seed accepted Identity only for the transposed one).
- Raises ``ValueError`` for a BN without running statistics (``track_running_stats=False``): its eval
  output depends on the batch, so there is nothing to fold.
- The QAT hook (scaling ``conv.weight_quantizer.amax``) is left out with the QAT helpers.
"""

from __future__ import annotations

import torch
from torch import nn

_ConvNd = nn.Conv1d | nn.Conv2d | nn.Conv3d
_ConvTransposeNd = nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d


def _bn_scale_shift(
    bn: nn.modules.batchnorm._BatchNorm, num_channels: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel ``(s, t)`` with ``bn(y) = y·s + t`` in eval mode, in float32 (float64 if the BN is)."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError(
            f"cannot fuse {bn}: it has no running statistics (track_running_stats=False), so its output depends "
            "on the batch; keep the BatchNorm or train with track_running_stats=True"
        )
    if bn.num_features != num_channels:
        raise ValueError(f"cannot fuse {bn} into a convolution with {num_channels} output channels")
    dtype = torch.promote_types(bn.running_var.dtype, torch.float32)
    mean, var = bn.running_mean.to(dtype), bn.running_var.to(dtype)
    gamma = torch.ones_like(mean) if bn.weight is None else bn.weight.detach().to(dtype)
    beta = torch.zeros_like(mean) if bn.bias is None else bn.bias.detach().to(dtype)
    scale = gamma * torch.rsqrt(var + bn.eps)
    return scale, beta - mean * scale


def _set_bias(conv: nn.Module, scale: torch.Tensor, shift: torch.Tensor) -> None:
    weight = conv.weight
    old_bias = torch.zeros_like(scale) if conv.bias is None else conv.bias.detach().to(scale.dtype)
    new_bias = (old_bias * scale + shift).to(device=weight.device, dtype=weight.dtype)
    if conv.bias is None:
        conv.bias = nn.Parameter(new_bias)
    else:
        conv.bias.data = new_bias


@torch.no_grad()
def fuse_conv_and_bn(conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Fold ``bn`` into ``conv`` (``nn.Conv1d/2d/3d``) in place; return ``conv`` with gradients off.

    Weight layout ``[out, in/groups, *k]``: output channel ``o`` is row ``o`` whatever the groups.
    """
    if not isinstance(conv, _ConvNd):
        raise TypeError(f"fuse_conv_and_bn expects nn.Conv1d/2d/3d, got {type(conv).__name__}")
    if not isinstance(bn, nn.Identity):
        scale, shift = _bn_scale_shift(bn, conv.out_channels)
        weight = conv.weight
        shape = (-1,) + (1,) * (weight.dim() - 1)
        weight.data = (weight.detach().to(scale.dtype) * scale.view(shape)).to(weight.dtype)
        _set_bias(conv, scale, shift)
    return conv.requires_grad_(False)


@torch.no_grad()
def fuse_deconv_and_bn(deconv: nn.Module, bn: nn.Module) -> nn.Module:
    """Fold ``bn`` into ``deconv`` (``nn.ConvTranspose1d/2d/3d``) in place; return it with gradients off.

    A transposed convolution stores its weight as ``[in, out/groups, *k]`` and output channel
    ``g·(out/groups) + j`` of group ``g`` lives at ``weight[g·(in/groups):(g+1)·(in/groups), j]``. The weight is
    viewed as ``[groups, in/groups, out/groups, *k]`` and scaled along its third axis, which is right for
    any ``groups`` (Ultralytics 8.4.0 used ``view(out_channels, -1)``, wrong for this layout).
    """
    if not isinstance(deconv, _ConvTransposeNd):
        raise TypeError(f"fuse_deconv_and_bn expects nn.ConvTranspose1d/2d/3d, got {type(deconv).__name__}")
    if not isinstance(bn, nn.Identity):
        scale, shift = _bn_scale_shift(bn, deconv.out_channels)
        weight = deconv.weight
        groups = deconv.groups
        in_per_group, out_per_group = weight.shape[0] // groups, weight.shape[1]
        kernel = tuple(weight.shape[2:])
        grouped = weight.detach().to(scale.dtype).reshape(groups, in_per_group, out_per_group, *kernel)
        grouped = grouped * scale.view(groups, 1, out_per_group, *(1,) * len(kernel))
        weight.data = grouped.reshape(weight.shape).to(weight.dtype)
        _set_bias(deconv, scale, shift)
    return deconv.requires_grad_(False)
