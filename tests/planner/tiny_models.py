"""Small user workloads (``--model tests.planner.tiny_models:mlp --input-shape 64``) that keep planner tests
fast, and one that hangs on purpose for the probe-timeout tests.

Probe actors import these by module path: tests run from the repository root, whose directory the Ray
driver adds to the probes' PYTHONPATH for user factories.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

#: a probe building ``hang_where_marked`` on a Ray node whose id is a file name in this directory sleeps
FAULT_DIR_ENV = "BATCHPLAN_TEST_FAULT_DIR"


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def convnet() -> nn.Module:
    """A small CNN for ``--input-shape 3,32,32``: activations dominate, so caps differ by GPU memory."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def stride_probing_convnet() -> nn.Module:
    """``convnet()`` whose constructor reads a value, as Ultralytics' stride probe does (a forward pass and
    ``.item()``): it cannot be built on the meta device, only for real on the CPU."""
    model = convnet()
    with torch.no_grad():
        out = model[:3](torch.zeros(1, 3, 32, 32))
    model.probed_stride = 32 // int(out.shape[-1] + 0 * out.sum().item())
    return model


def hang_where_marked() -> nn.Module:
    """``convnet()``, except inside a Ray probe on a node marked in ``$BATCHPLAN_TEST_FAULT_DIR``: hangs."""
    fault_dir = os.environ.get(FAULT_DIR_ENV)
    if fault_dir:
        try:
            import ray

            context = ray.get_runtime_context() if ray.is_initialized() else None
            # only inside a probe actor: the driver builds the model too (for the cache key), on a marked node
            node_id = context.get_node_id() if context is not None and context.get_actor_id() else None
        except Exception:
            node_id = None
        if node_id and os.path.exists(os.path.join(fault_dir, node_id)):
            time.sleep(3600)
    return convnet()


class _LstmClassifier(nn.Module):
    """Token ids -> embedding -> 2-layer LSTM -> class logits of the last step."""

    def __init__(self, vocab_size: int = 1000, dim: int = 64, num_classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


def lstm_classifier() -> nn.Module:
    """For ``--seq-len 32 --vocab-size 1000``: a recurrent model on integer token ids."""
    torch.manual_seed(0)
    return _LstmClassifier()


class _EncoderClassifier(nn.Module):
    """Token ids -> embedding -> stock nn.TransformerEncoder (2 layers, deep-copied by its constructor)."""

    def __init__(self, vocab_size: int = 1000, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(1))


def transformer_encoder() -> nn.Module:
    """For ``--seq-len 32 --vocab-size 1000``: the stock encoder whose constructor deep-copies its layer."""
    torch.manual_seed(0)
    return _EncoderClassifier()
