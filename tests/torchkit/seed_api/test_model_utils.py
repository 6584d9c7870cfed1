"""torchkit.seed_api.model_utils: wrappers, attribute/state-dict copying, layer settings, image scaling, compile."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchkit.seed_api.model_utils as model_utils
from torchkit.seed_api.model_utils import (
    attempt_compile,
    copy_attr,
    initialize_weights,
    intersect_dicts,
    is_parallel,
    scale_img,
    unwrap_model,
)


def _ddp_like(module: nn.Module) -> DistributedDataParallel:
    """A real DistributedDataParallel instance without a process group (only its type and .module matter)."""
    wrapper = DistributedDataParallel.__new__(DistributedDataParallel)
    nn.Module.__init__(wrapper)
    wrapper.module = module
    return wrapper


@pytest.mark.slow
def test_is_parallel_for_data_parallel_and_ddp_only():
    model = nn.Linear(2, 2)
    assert is_parallel(nn.DataParallel(model))
    assert is_parallel(_ddp_like(model))
    assert not is_parallel(model)
    assert not is_parallel(torch.compile(model))


def test_unwrap_model_strips_nested_compile_and_parallel_wrappers():
    model = nn.Linear(2, 2)
    assert unwrap_model(model) is model
    assert unwrap_model(nn.DataParallel(model)) is model
    assert unwrap_model(_ddp_like(model)) is model
    assert unwrap_model(torch.compile(nn.DataParallel(model))) is model
    assert unwrap_model(_ddp_like(torch.compile(model))) is model


def test_unwrap_model_ignores_non_module_module_attribute():
    model = nn.Linear(2, 2)
    model.module = "not a module"
    assert unwrap_model(model) is model


def test_initialize_weights_sets_bn2d_eps_momentum_only():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.SiLU(), nn.ReLU(), nn.BatchNorm1d(4), nn.LeakyReLU()
    )
    conv_weight = model[0].weight.detach().clone()
    initialize_weights(model)
    assert (model[1].eps, model[1].momentum) == (1e-3, 0.03)
    assert (model[4].eps, model[4].momentum) == (1e-5, 0.1)  # only BatchNorm2d, as the seed
    assert torch.equal(model[0].weight, conv_weight)
    # newest seed: activations are left as built (<=8.4.0 set inplace=True)
    assert not model[2].inplace and not model[3].inplace and not model[5].inplace


@pytest.mark.parametrize(
    ("ratio", "same_shape", "expected_hw"),
    [
        (0.5, False, (64, 32)),  # 100×60 → 50×30, padded up to multiples of 32
        (1.3, False, (160, 96)),  # → 130×78 → 160×96
        (0.5, True, (100, 60)),  # padded back to the original size
        (1.3, True, (100, 60)),  # cropped back (negative padding)
    ],
)
def test_scale_img_shapes(ratio, same_shape, expected_hw):
    img = torch.rand(2, 3, 100, 60)
    out = scale_img(img, ratio, same_shape=same_shape)
    assert tuple(out.shape) == (2, 3, *expected_hw)


def test_scale_img_pads_right_and_bottom_with_0447():
    img = torch.ones(1, 1, 100, 60)
    out = scale_img(img, 0.5)
    assert torch.all(out[..., :50, :30] == 1)
    assert torch.all(out[..., 50:, :] == 0.447)
    assert torch.all(out[..., :, 30:] == 0.447)


def test_scale_img_ratio_one_returns_the_same_tensor():
    img = torch.rand(1, 3, 8, 8)
    assert scale_img(img, 1.0) is img


def test_copy_attr_include_exclude_and_private_rules():
    src = SimpleNamespace(a=1, b=2, c=3, _private=4)
    dst = SimpleNamespace()
    copy_attr(dst, src)
    assert vars(dst) == {"a": 1, "b": 2, "c": 3}
    dst = SimpleNamespace()
    copy_attr(dst, src, include=("a", "b", "_private"), exclude=("b",))
    assert vars(dst) == {"a": 1}
    dst = SimpleNamespace(c=0)
    copy_attr(dst, src, exclude=("a",))
    assert vars(dst) == {"b": 2, "c": 3}


def test_intersect_dicts_keeps_matching_shapes_and_drops_excluded_substrings():
    da = {
        "backbone.w": torch.zeros(2, 3),
        "head.w": torch.zeros(4),
        "anchors": torch.zeros(3),
        "only_a": torch.zeros(1),
    }
    db = {"backbone.w": torch.ones(2, 3), "head.w": torch.ones(5), "anchors": torch.ones(3)}
    out = intersect_dicts(da, db, exclude=("anchor",))
    assert list(out) == ["backbone.w"]
    assert out["backbone.w"] is da["backbone.w"]  # values from da
    assert set(intersect_dicts(da, db)) == {"backbone.w", "anchors"}


def test_attempt_compile_mode_false_returns_model_without_logging(caplog):
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.DEBUG, logger="torchkit.seed_api.model_utils"):
        assert attempt_compile(model, "cpu", mode=False) is model
    assert caplog.text == ""


def test_attempt_compile_without_torch_compile_logs_reason(monkeypatch, caplog):
    monkeypatch.delattr(torch, "compile")
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.model_utils"):
        assert attempt_compile(model, "cpu") is model
    assert "torch.compile is not available" in caplog.text


def test_attempt_compile_without_cpp_compiler_logs_reason(monkeypatch, caplog):
    import torch._inductor.cpp_builder as cpp_builder

    def no_compiler():
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.model_utils"):
        assert attempt_compile(model, torch.device("cpu")) is model
    assert (
        "inductor backend unavailable, continuing uncompiled: RuntimeError: no C++ compiler found"
        in caplog.text
    )


def test_attempt_compile_failure_returns_model(monkeypatch, caplog):
    def broken_compile(*args, **kwargs):
        raise RuntimeError("dynamo exploded")

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(model_utils, "_inductor_unavailable_reason", lambda device: None)
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.model_utils"):
        assert attempt_compile(model, "cpu") is model
    assert "torch.compile failed, continuing uncompiled: RuntimeError: dynamo exploded" in caplog.text


def test_attempt_compile_passes_mode_and_warms_up(monkeypatch, caplog):
    calls = []

    def fake_compile(model, mode, backend):
        calls.append((mode, backend))
        return lambda x: calls.append(("forward", tuple(x.shape), torch.is_inference_mode_enabled()))

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(model_utils, "_inductor_unavailable_reason", lambda device: None)
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.model_utils"):
        attempt_compile(nn.Linear(2, 2), "cpu", imgsz=32, warmup=True, mode=True)
    assert calls == [("default", "inductor"), ("forward", (1, 3, 32, 32), True)]
    assert "starting torch.compile with 'default' mode" in caplog.text
    assert "(compile " in caplog.text and "+ warmup " in caplog.text


def test_attempt_compile_warmup_failure_returns_uncompiled_model(monkeypatch, caplog):
    def compiled_forward(x):
        raise RuntimeError("inductor codegen failed")

    monkeypatch.setattr(torch, "compile", lambda model, mode, backend: compiled_forward)
    monkeypatch.setattr(model_utils, "_inductor_unavailable_reason", lambda device: None)
    model = nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.model_utils"):
        assert attempt_compile(model, "cpu", warmup=True) is model
    assert "warmup of the compiled model failed" in caplog.text


@pytest.mark.slow
def test_attempt_compile_really_compiles_on_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    compiled = attempt_compile(model, "cpu", imgsz=16, warmup=True)
    assert compiled is not model and unwrap_model(compiled) is model
    x = torch.randn(1, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
