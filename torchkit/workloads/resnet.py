"""ResNet-18, ResNet-50, ResNeXt-101 32x4d and SE-ResNeXt-101 32x4d in plain torch (no torchvision), layer
for layer as torchvision's ``resnet18`` / ``resnet50`` / ``resnext101_32x4d`` and timm's
``seresnext101_32x4d`` (v1.5: stride on the 3x3 convolution of a bottleneck), with the standard
image-classification training step: 1000-class logits, cross-entropy on integer labels.

Parameter counts match: ResNet-18 11,689,512; ResNet-50 25,557,032; ResNeXt-101 32x4d 44,177,704
(torchvision); SE-ResNeXt-101 32x4d 48,955,416 (timm: 48.96 M) (checked in the tests). The two ResNeXts are
here because public training-throughput tables (NVIDIA DeepLearningExamples, timm) measure them on several
GPUs: the step-time calibration uses them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NUM_CLASSES = 1000
"""ImageNet-1k head, as torchvision's default"""


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_channels, channels * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class SqueezeExcitation(nn.Module):
    """Squeeze-and-excitation (Hu et al. 2018) as timm's ``SEModule``: global average pool, 1x1 convolutions
    down to ``channels / 16`` and back (with bias), sigmoid gate."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, channels // 16, 1)
        self.fc2 = nn.Conv2d(channels // 16, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(gate)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(
        self,
        in_channels: int,
        channels: int,
        stride: int = 1,
        groups: int = 1,
        width_per_group: int = 64,
        se: bool = False,
    ) -> None:
        super().__init__()
        width = (
            channels * width_per_group // 64 * groups
        )  # torchvision: int(planes * base_width / 64) * groups
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, channels * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(channels * self.expansion)
        self.se = SqueezeExcitation(channels * self.expansion) if se else None
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(in_channels, channels * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.se is not None:
            out = self.se(out)
        return self.relu(out + identity)


def _downsample(in_channels: int, out_channels: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
    )


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        layers: tuple[int, int, int, int],
        *,
        groups: int = 1,
        width_per_group: int = 64,
        se: bool = False,
    ) -> None:
        super().__init__()
        extra = (
            {"groups": groups, "width_per_group": width_per_group, "se": se} if block is Bottleneck else {}
        )
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        in_channels = 64
        for i, (channels, num_blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            blocks = []
            for j in range(num_blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(in_channels, channels, stride, **extra))
                in_channels = channels * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, NUM_CLASSES)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> ResNet:
    return ResNet(BasicBlock, (2, 2, 2, 2))


def resnet50() -> ResNet:
    return ResNet(Bottleneck, (3, 4, 6, 3))


def resnext101_32x4d() -> ResNet:
    return ResNet(Bottleneck, (3, 4, 23, 3), groups=32, width_per_group=4)


def se_resnext101_32x4d() -> ResNet:
    return ResNet(Bottleneck, (3, 4, 23, 3), groups=32, width_per_group=4, se=True)


def make_image_classification_batch(batch: int, imgsz: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images ``[B, 3, imgsz, imgsz]`` and labels ``[B]``; works under FakeTensorMode."""
    return torch.randn(batch, 3, imgsz, imgsz), torch.randint(0, NUM_CLASSES, (batch,))


def classification_loss(output: Any, targets: Any) -> torch.Tensor:
    return nn.functional.cross_entropy(output, targets)
