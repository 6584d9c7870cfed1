"""BatchNorm for uneven per-rank batches in an Ultralytics DDP job: SyncBatchNorm while training, plain
BatchNorm wherever the model leaves the training step (the EMA copy that checkpoints are saved from, and the
one-rank memory probe).

Plain ``BatchNorm`` normalises over the rank's own ``b_i`` samples, so with uneven batches the ranks' batch
statistics differ in noise (planner/runtime/weights.py, Caveats). ``SyncBatchNorm`` all-gathers each rank's
count, sum and sum of squares and normalises over the whole step, unequal counts included; its forward pass in
training needs CUDA (a CPU tensor is refused by torch) and a collective on every rank.

Known limitations: the conversion replaces every ``_BatchNorm`` (1d/2d/3d) and remembers the class it
replaced, so the plain copy is of the original kind; a BatchNorm a model creates inside ``forward`` is not seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

#: attribute set on each SyncBatchNorm made here: the BatchNorm class it replaced
_PLAIN_CLASS = "batchplan_plain_class"


def to_sync_batchnorm(model: nn.Module) -> tuple[nn.Module, int]:
    """``model`` with every BatchNorm replaced by a SyncBatchNorm sharing its parameters and statistics, and how
    many were replaced (torch's ``convert_sync_batchnorm``, remembering each one's original class)."""
    kinds = {
        name: type(m)
        for name, m in model.named_modules()
        if isinstance(m, _BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
    }
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    count = 0
    for name, module in converted.named_modules():
        if isinstance(module, nn.SyncBatchNorm) and name in kinds:
            setattr(module, _PLAIN_CLASS, kinds[name])
            count += 1
    return converted, count


def _plain(sync: nn.SyncBatchNorm) -> _BatchNorm:
    """A BatchNorm of the class ``sync`` replaced, holding the very same parameters and buffers."""
    kind = getattr(sync, _PLAIN_CLASS, nn.BatchNorm2d)
    with torch.device("meta"):  # its own tensors are replaced at once: none is allocated
        plain = kind(sync.num_features, sync.eps, sync.momentum, sync.affine, sync.track_running_stats)
    for name in ("weight", "bias"):
        setattr(plain, name, getattr(sync, name))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        setattr(plain, name, getattr(sync, name))
    plain.train(sync.training)
    return plain


def _sync_children(model: nn.Module) -> list[tuple[nn.Module, str, nn.SyncBatchNorm]]:
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.SyncBatchNorm)
    ]


def to_plain_batchnorm(model: nn.Module) -> int:
    """Replace, in place, every SyncBatchNorm of ``model`` by the BatchNorm it came from (same tensors: a state
    dict keeps its keys and values). Returns how many were replaced."""
    swaps = _sync_children(model)
    for parent, name, child in swaps:
        setattr(parent, name, _plain(child))
    return len(swaps)


@contextlib.contextmanager
def plain_batchnorm(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with plain BatchNorm for the duration (one rank running it alone: a SyncBatchNorm would wait for
    the others), its SyncBatchNorm modules put back afterwards."""
    swaps = _sync_children(model)
    for parent, name, child in swaps:
        setattr(parent, name, _plain(child))
    try:
        yield model
    finally:
        for parent, name, child in reversed(swaps):
            setattr(parent, name, child)
