"""GPT-2 small in plain torch (124,439,808 parameters with the 1024-position table, as Hugging Face's
``gpt2``): token + position embeddings, 12 pre-norm blocks (768 wide, 12 heads, MLP 3072, tanh-GELU),
final LayerNorm, LM head tied to the token embedding. Training step: next-token cross-entropy over the
50,257-word vocabulary.

Causal attention uses ``F.scaled_dot_product_attention(is_causal=True)`` (flash / memory-efficient kernels
where the backend has one). Dropout is 0 (nanoGPT's default; attention dropout would force the math kernel
on some backends and change memory by a B·H·S² term). Inputs and targets are independent random tokens:
the memory and FLOPs of a step do not depend on their values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

VOCAB_SIZE = 50257
MAX_POSITIONS = 1024
"""GPT-2's learned position table; a longer sequence is a WorkloadError"""
WIDTH = 768
DEPTH = 12
NUM_HEADS = 12


class Block(nn.Module):
    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.c_attn(self.ln_1(x)).view(batch, tokens, 3, self.num_heads, width // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(attn.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.wpe = nn.Embedding(MAX_POSITIONS, WIDTH)
        self.blocks = nn.Sequential(*(Block(WIDTH, NUM_HEADS) for _ in range(DEPTH)))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB_SIZE, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        return self.lm_head(self.ln_f(self.blocks(x)))


def gpt2_small() -> GPT2:
    return GPT2()


def make_token_batch(batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random input tokens and next-token targets, both ``[B, seq_len]`` int64."""
    return (
        torch.randint(0, VOCAB_SIZE, (batch, seq_len)),
        torch.randint(0, VOCAB_SIZE, (batch, seq_len)),
    )


def next_token_loss(logits: Any, targets: Any) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
