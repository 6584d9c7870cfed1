"""ViT-B/16 in plain torch, parameter for parameter as torchvision's ``vit_b_16`` (86,567,656 parameters at
224): 16x16 patch convolution, class token, learned position embedding, 12 pre-norm encoder blocks
(768 wide, 12 heads, MLP 3072, GELU, LayerNorm eps 1e-6), 1000-class head on the class token.

Attention uses ``F.scaled_dot_product_attention`` (what ``nn.MultiheadAttention`` calls in torchvision's
fast path), so the attention matrix is never materialised on backends with a fused kernel; dropout is 0,
as torchvision's default.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from torchkit.workloads.resnet import NUM_CLASSES

PATCH_SIZE = 16
WIDTH = 768
DEPTH = 12
NUM_HEADS = 12
MLP_WIDTH = 3072


class EncoderBlock(nn.Module):
    def __init__(self, width: int, num_heads: int, mlp_width: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_width), nn.GELU(), nn.Linear(mlp_width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.ln_1(x)).view(batch, tokens, 3, self.num_heads, width // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, imgsz: int = 224) -> None:
        super().__init__()
        num_patches = (imgsz // PATCH_SIZE) ** 2
        self.conv_proj = nn.Conv2d(3, WIDTH, PATCH_SIZE, PATCH_SIZE)
        self.class_token = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.pos_embedding = nn.Parameter(torch.empty(1, num_patches + 1, WIDTH).normal_(std=0.02))
        self.layers = nn.Sequential(*(EncoderBlock(WIDTH, NUM_HEADS, MLP_WIDTH) for _ in range(DEPTH)))
        self.ln = nn.LayerNorm(WIDTH, eps=1e-6)
        self.head = nn.Linear(WIDTH, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])


def vit_b16(imgsz: int = 224) -> VisionTransformer:
    return VisionTransformer(imgsz)
