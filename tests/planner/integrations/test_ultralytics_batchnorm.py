"""planner.integrations.ultralytics_batchnorm: SyncBatchNorm in, the original BatchNorm kinds back out (same
tensors, same state dict), and a temporary plain model for a one-rank probe."""

from __future__ import annotations

import torch
from torch import nn

from planner.integrations.ultralytics_batchnorm import plain_batchnorm, to_plain_batchnorm, to_sync_batchnorm


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(5), nn.BatchNorm1d(5)
    )


def test_sync_then_plain_gives_back_each_original_kind_with_the_same_tensors():
    model = _model()
    model(torch.rand(2, 3, 8, 8))  # materialise the lazy layer; BatchNorm statistics move
    before = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[1].weight
    synced, count = to_sync_batchnorm(model)
    assert count == 2 and isinstance(synced[1], nn.SyncBatchNorm) and isinstance(synced[4], nn.SyncBatchNorm)
    assert synced[1].weight is weight
    assert to_plain_batchnorm(synced) == 2
    assert type(synced[1]) is nn.BatchNorm2d and type(synced[4]) is nn.BatchNorm1d
    assert synced[1].weight is weight and synced[1].running_mean.device.type == "cpu"
    assert synced.state_dict().keys() == before.keys()
    assert all(torch.equal(synced.state_dict()[k], v) for k, v in before.items())


def test_plain_batchnorm_is_temporary_and_keeps_the_mode():
    synced, _ = to_sync_batchnorm(_model())
    synced[1].eval()
    with plain_batchnorm(synced) as plain:
        assert type(plain[1]) is nn.BatchNorm2d and not plain[1].training and plain[4].training
        out = plain(torch.rand(2, 3, 8, 8))  # runs alone: a SyncBatchNorm in training would need a group
        assert out.shape == (2, 5)
    assert isinstance(synced[1], nn.SyncBatchNorm) and isinstance(synced[4], nn.SyncBatchNorm)


def test_a_model_without_batchnorm_is_left_alone():
    model = nn.Sequential(nn.Linear(3, 3))
    assert to_sync_batchnorm(model)[1] == 0 and to_plain_batchnorm(model) == 0
