"""torchkit.seed_api.fusion: a fused conv/deconv equals the unfused conv + BatchNorm (eval mode)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchkit.seed_api.fusion import fuse_conv_and_bn, fuse_deconv_and_bn


def _random_bn(bn: nn.modules.batchnorm._BatchNorm, seed: int) -> nn.Module:
    """Give a BN non-trivial statistics and affine parameters, and put it in eval mode."""
    g = torch.Generator().manual_seed(seed)
    n = bn.num_features
    bn.running_mean.copy_(torch.randn(n, generator=g))
    bn.running_var.copy_(torch.rand(n, generator=g) * 2 + 0.1)
    if bn.affine:
        with torch.no_grad():
            bn.weight.copy_(torch.randn(n, generator=g))
            bn.bias.copy_(torch.randn(n, generator=g))
    return bn.eval()


def _check(conv: nn.Module, bn: nn.Module, x: torch.Tensor, fuse) -> nn.Module:
    conv.eval()
    with torch.no_grad():
        expected = bn(conv(x))
    fused = fuse(copy.deepcopy(conv), bn)
    with torch.no_grad():
        actual = fused(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert fused.bias is not None
    assert not any(p.requires_grad for p in fused.parameters())
    return fused


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2])
def test_fused_conv2d_equals_conv_then_bn(bias, groups):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=groups, bias=bias)
    bn = _random_bn(nn.BatchNorm2d(6), seed=1)
    _check(conv, bn, torch.randn(2, 4, 9, 9), fuse_conv_and_bn)


@pytest.mark.parametrize(
    ("conv", "bn", "shape"),
    [
        (nn.Conv1d(3, 5, 3, bias=False), nn.BatchNorm1d(5), (2, 3, 11)),
        (nn.Conv3d(2, 4, 3, padding=1), nn.BatchNorm3d(4), (1, 2, 5, 5, 5)),
    ],
)
def test_fused_conv1d_and_conv3d_equal_conv_then_bn(conv, bn, shape):
    torch.manual_seed(0)
    _check(conv, _random_bn(bn, seed=2), torch.randn(*shape), fuse_conv_and_bn)


def test_fused_conv_with_non_affine_bn():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 1)
    _check(
        conv, _random_bn(nn.BatchNorm2d(4, affine=False), seed=3), torch.randn(1, 3, 4, 4), fuse_conv_and_bn
    )


def test_fused_conv_creates_bias_equal_to_bn_shift():
    conv = nn.Conv2d(1, 2, 1, bias=False)
    bn = nn.BatchNorm2d(2, eps=0.0).eval()
    bn.running_mean.copy_(torch.tensor([1.0, -2.0]))
    bn.running_var.copy_(torch.tensor([4.0, 0.25]))
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([2.0, 3.0]))
        bn.bias.copy_(torch.tensor([0.5, 0.0]))
        conv.weight.copy_(torch.tensor([1.0, 1.0]).view(2, 1, 1, 1))
    fused = fuse_conv_and_bn(conv, bn)
    # s = γ/√var = [1, 6]; b' = (0 − mean)·s + β = [−1 + 0.5, 12]
    torch.testing.assert_close(fused.weight.view(-1), torch.tensor([1.0, 6.0]))
    torch.testing.assert_close(fused.bias, torch.tensor([-0.5, 12.0]))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_fused_grouped_conv_transpose2d_equals_deconv_then_bn(bias, groups):
    torch.manual_seed(0)
    deconv = nn.ConvTranspose2d(6, 12, 3, stride=2, padding=1, output_padding=1, groups=groups, bias=bias)
    bn = _random_bn(nn.BatchNorm2d(12), seed=4)
    _check(deconv, bn, torch.randn(2, 6, 5, 5), fuse_deconv_and_bn)


def test_fuse_deconv_with_identity_only_turns_grads_off():
    deconv = nn.ConvTranspose2d(2, 2, 2)
    before = deconv.weight.detach().clone()
    fused = fuse_deconv_and_bn(deconv, nn.Identity())
    assert fused is deconv
    torch.testing.assert_close(fused.weight, before)
    assert not fused.weight.requires_grad


def test_fuse_conv_with_identity_only_turns_grads_off():
    conv = nn.Conv2d(2, 2, 1, bias=False)
    fused = fuse_conv_and_bn(conv, nn.Identity())
    assert fused.bias is None
    assert not fused.weight.requires_grad


def test_fuse_refuses_bn_without_running_stats():
    with pytest.raises(ValueError, match="no running statistics"):
        fuse_conv_and_bn(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2, track_running_stats=False))


def test_fuse_refuses_wrong_layer_types():
    with pytest.raises(TypeError, match="ConvTranspose"):
        fuse_deconv_and_bn(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2))
    with pytest.raises(TypeError, match="Conv1d/2d/3d"):
        fuse_conv_and_bn(nn.ConvTranspose2d(2, 2, 1), nn.BatchNorm2d(2))


def test_fuse_refuses_channel_mismatch():
    with pytest.raises(ValueError, match="4 output channels"):
        fuse_conv_and_bn(nn.Conv2d(2, 4, 1), nn.BatchNorm2d(3))
