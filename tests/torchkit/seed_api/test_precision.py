"""torchkit.seed_api.precision: inference-mode decorator and autocast contexts, on CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from torchkit.seed_api.precision import autocast, smart_inference_mode


def _state() -> tuple[bool, bool]:
    return torch.is_inference_mode_enabled(), torch.is_grad_enabled()


def test_smart_inference_mode_runs_function_in_inference_mode():
    @smart_inference_mode()
    def f(x):
        return _state(), x * 2

    (inference, grad), y = f(torch.ones(2, requires_grad=True))
    assert (inference, grad) == (True, False)
    assert y.is_inference()
    assert _state() == (False, True)  # restored after the call


def test_smart_inference_mode_passes_through_when_already_in_inference_mode():
    def f():
        return _state()

    with torch.inference_mode():
        decorated = smart_inference_mode()(f)
    assert decorated is f


def test_smart_inference_mode_false_turns_inference_off_and_grad_off():
    @smart_inference_mode(False)
    def f(x):
        return _state(), x * 2

    with torch.inference_mode():
        (inference, grad), y = f(torch.ones(2))
    assert (inference, grad) == (False, False)
    assert not y.is_inference()
    assert not y.requires_grad


def test_smart_inference_mode_wraps_generators():
    @smart_inference_mode()
    def gen():
        yield _state()
        yield _state()

    assert list(gen()) == [(True, False), (True, False)]


def test_smart_inference_mode_used_bare_raises_with_fix():
    with pytest.raises(TypeError, match=r"@smart_inference_mode\(\)"):

        @smart_inference_mode
        def f():
            return None


def test_autocast_bfloat16_on_cpu_gives_bf16_matmuls():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(torch.bfloat16, "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        out = a @ b
    assert out.dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32  # off again after the block
    torch.testing.assert_close(out.float(), a @ b, atol=0.1, rtol=0.02)


def test_autocast_true_on_cpu_uses_cpu_default_dtype_bf16():
    with autocast(True, torch.device("cpu")):
        out = torch.randn(2, 2) @ torch.randn(2, 2)
    assert out.dtype == torch.bfloat16


def test_autocast_false_keeps_fp32():
    with autocast(False, "cpu"):
        assert not torch.is_autocast_enabled("cpu")
        out = torch.randn(2, 2) @ torch.randn(2, 2)
    assert out.dtype == torch.float32


def test_autocast_float16_dtype_on_indexed_cpu_string():
    with autocast(torch.float16, "cpu:0"):
        out = torch.randn(2, 2) @ torch.randn(2, 2)
    assert out.dtype == torch.float16


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False),
    reason="this GPU has native bf16",
)
def test_autocast_bfloat16_on_cuda_without_native_bf16_raises():
    with pytest.raises(RuntimeError, match="native bfloat16 support.*use torch.float16"):
        autocast(torch.bfloat16, "cuda")


def test_autocast_on_mps_with_old_torch_is_disabled_with_a_warning(monkeypatch, caplog):
    import torchkit.versions

    monkeypatch.setattr(torchkit.versions, "TORCH_2_5", False)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.precision"):
        ctx = autocast(True, "mps")
    assert "needs torch>=2.5" in caplog.text
    with ctx:
        out = torch.randn(2, 2) @ torch.randn(2, 2)
        assert not torch.is_autocast_enabled("cpu")
    assert out.dtype == torch.float32
