"""torchkit.seed_api.stats: parameter counts, FLOPs against hand-computed figures, and the model summary."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchkit.seed_api.stats import (
    count_forward_flops,
    get_flops,
    get_num_gradients,
    get_num_params,
    model_info,
    model_info_for_loggers,
)


def _conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),  # → 16 × H/2 × W/2
        nn.BatchNorm2d(16),
        nn.SiLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2, bias=False),  # → 32 × H/4 × W/4
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def _conv_net_flops(h: int, w: int) -> int:
    """2 FLOPs per multiply-add: conv = 2·C_out·(C_in/groups·k²)·H_out·W_out, linear = 2·in·out."""
    conv1 = 2 * 16 * (3 * 9) * (h // 2) * (w // 2)
    conv2 = 2 * 32 * (16 // 2 * 9) * (h // 4) * (w // 4)
    linear = 2 * 32 * 10
    return conv1 + conv2 + linear


class _Attention(nn.Module):
    """Linear QKV projection, SDPA over 2 heads of 8, output projection."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


def test_num_params_and_gradients_count_elements_and_frozen_ones():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 15 + 8
    model[0].weight.requires_grad_(False)  # 12 frozen
    assert get_num_params(model) == 23
    assert get_num_gradients(model) == 11


def test_num_params_counts_tied_weights_once():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    assert get_num_params(model) == 16


def test_get_flops_of_conv_linear_net_equals_hand_count():
    assert get_flops(_conv_net(), imgsz=64) == pytest.approx(_conv_net_flops(64, 64) / 1e9, rel=0, abs=1e-12)


def test_get_flops_accepts_height_width_pair():
    assert get_flops(_conv_net(), imgsz=(32, 96)) == pytest.approx(_conv_net_flops(32, 96) / 1e9, abs=1e-12)


def test_get_flops_counts_attention():
    b, n, d, heads = 1, 10, 16, 2
    linears = 2 * n * d * 3 * d + 2 * n * d * d
    attention = 2 * b * heads * n * n * (d // heads) * 2  # Q·Kᵀ and P·V
    flops = get_flops(_Attention(d, heads), inputs=torch.randn(b, n, d))
    assert flops * 1e9 == pytest.approx(linears + attention)
    assert attention / (linears + attention) > 0.1  # the attention part is not negligible in this check


def test_get_flops_neither_runs_nor_changes_the_model():
    model = _conv_net().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    get_flops(model, imgsz=32)
    assert model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert type(model[0].weight) is nn.Parameter and not model[0].weight.is_meta


def test_get_flops_unwraps_data_parallel():
    model = _conv_net()
    assert get_flops(nn.DataParallel(model), imgsz=32) == get_flops(model, imgsz=32)


class _DataDependent(nn.Module):
    """Uses a tensor value for control flow, which fake tensors cannot do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum().item() > -1e9 else y


def test_get_flops_falls_back_to_a_real_forward_for_data_dependent_models(caplog):
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.stats"):
        flops = get_flops(_DataDependent(), inputs=torch.randn(3, 8))
    assert flops * 1e9 == 2 * 3 * 8 * 4
    assert "fake-tensor count failed" in caplog.text


def test_get_flops_returns_zero_with_warning_when_the_model_cannot_run(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.stats"):
        flops = get_flops(nn.Linear(5, 2), inputs=torch.randn(1, 7))
    assert flops == 0.0
    assert "could not count FLOPs of Linear" in caplog.text


def test_get_flops_without_parameters_asks_for_inputs(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.stats"):
        assert get_flops(nn.ReLU()) == 0.0
    assert "pass inputs=" in caplog.text


def test_count_forward_flops_of_a_plain_callable():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert count_forward_flops(torch.matmul, (a, b)) == 2 * 3 * 5 * 7


def test_model_info_returns_counts_and_logs_summary(caplog):
    model = _conv_net()
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.stats"):
        n_layers, n_params, n_grads, gflops = model_info(model, imgsz=640)
    assert n_layers == 7
    assert n_params == get_num_params(model) == (16 * 27 + 16) + 32 + (32 * 72) + (320 + 10)
    assert n_grads == n_params
    assert gflops == pytest.approx(_conv_net_flops(640, 640) / 1e9)
    assert (
        f"Model summary: 7 layers, {n_params:,} parameters, {n_params:,} gradients, {gflops:.1f} GFLOPs"
        in caplog.text
    )


def test_model_info_names_yolo_yaml_and_fused_and_omits_zero_flops(caplog):
    model = nn.Sequential(nn.ReLU())  # no parameters: FLOPs cannot be counted → 0 → left out
    model.yaml_file = "cfg/yolov8n.yaml"
    model.is_fused = lambda: True
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.stats"):
        assert model_info(model) == (1, 0, 0, 0.0)
    assert "YOLOv8n summary (fused): 1 layers, 0 parameters, 0 gradients\n" in caplog.text + "\n"
    assert "GFLOPs" not in caplog.text


def test_model_info_detailed_logs_a_row_per_parameter(caplog):
    model = nn.Sequential(nn.Conv2d(3, 2, 1), nn.ReLU())
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.stats"):
        model_info(model, detailed=True, imgsz=8)
    rows = [r.getMessage() for r in caplog.records]
    assert "dtype" in rows[0] and "sigma" in rows[0]
    assert any("0.weight" in r and "[2, 3, 1, 1]" in r and "float32" in r for r in rows)
    assert any("0.bias" in r for r in rows)
    assert any(r.strip().startswith("1") and "ReLU" in r for r in rows)


def test_model_info_not_verbose_returns_none():
    assert model_info(_conv_net(), verbose=False) is None


def test_model_info_for_loggers_reports_params_flops_and_speed(caplog):
    model = _conv_net()
    trainer = SimpleNamespace(
        model=model,
        args=SimpleNamespace(profile=False, imgsz=64),
        validator=SimpleNamespace(speed={"inference": 1.23456}),
    )
    assert model_info_for_loggers(trainer) == {
        "model/parameters": get_num_params(model),
        "model/GFLOPs": round(_conv_net_flops(64, 64) / 1e9, 3),
        "model/speed_PyTorch(ms)": 1.235,
    }
    trainer.args.profile = True
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.stats"):
        assert model_info_for_loggers(trainer)["model/parameters"] == get_num_params(model)
    assert "ONNX/TensorRT profiling" in caplog.text
