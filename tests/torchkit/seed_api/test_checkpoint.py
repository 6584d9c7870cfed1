"""torchkit.seed_api.checkpoint: optimizer-state FP16 rules, strip_optimizer round trip, safe loading, atomic write."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from torchkit.errors import UserError
from torchkit.seed_api.checkpoint import (
    CheckpointError,
    convert_optimizer_state_dict_to_fp16,
    load_checkpoint,
    strip_optimizer,
)
from torchkit.seed_api.training import ModelEMA


def _trained(optimizer_cls=torch.optim.SGD, **kwargs) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    optimizer = optimizer_cls(model.parameters(), lr=0.1, **kwargs)
    model(torch.randn(8, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


# --------------------------------------------------------------------------------------------------------
# convert_optimizer_state_dict_to_fp16
# --------------------------------------------------------------------------------------------------------


def test_convert_sgd_momentum_buffer_to_fp16_in_place():
    _, optimizer = _trained(torch.optim.SGD, momentum=0.9)
    state_dict = optimizer.state_dict()
    out = convert_optimizer_state_dict_to_fp16(state_dict)
    assert out is state_dict
    buffers = [s["momentum_buffer"] for s in state_dict["state"].values()]
    assert buffers and all(b.dtype == torch.float16 for b in buffers)


def test_convert_keeps_adam_moments_and_step_in_fp32():
    _, optimizer = _trained(torch.optim.AdamW)
    state_dict = convert_optimizer_state_dict_to_fp16(optimizer.state_dict())
    for state in state_dict["state"].values():
        assert state["exp_avg"].dtype == torch.float32
        assert state["exp_avg_sq"].dtype == torch.float32
        assert state["step"].dtype == torch.float32 and state["step"].item() == 1.0


def test_convert_only_touches_fp32_tensors_outside_the_kept_keys():
    state_dict = {
        "state": {
            0: {
                "square_avg": torch.ones(2),
                "other": torch.ones(2),
                "double": torch.ones(2, dtype=torch.float64),
                "counter": torch.tensor(3),
                "half": torch.ones(2, dtype=torch.float16),
                "scalar": 1.5,
            }
        },
        "param_groups": [{"lr": 0.1}],
    }
    state = convert_optimizer_state_dict_to_fp16(state_dict)["state"][0]
    assert {k: v.dtype for k, v in state.items() if isinstance(v, torch.Tensor)} == {
        "square_avg": torch.float32,
        "other": torch.float16,
        "double": torch.float64,
        "counter": torch.int64,
        "half": torch.float16,
    }
    assert state["scalar"] == 1.5 and state_dict["param_groups"] == [{"lr": 0.1}]


# --------------------------------------------------------------------------------------------------------
# strip_optimizer
# --------------------------------------------------------------------------------------------------------


def _training_checkpoint() -> tuple[dict, nn.Module]:
    model, optimizer = _trained(torch.optim.SGD, momentum=0.9)
    ema = ModelEMA(model, decay=0.5, tau=1e-9)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)  # the EMA now differs from the model
    ckpt = {
        "epoch": 7,
        "best_fitness": 0.42,
        "model": model,
        "ema": ema.ema,
        "updates": ema.updates,
        "optimizer": optimizer.state_dict(),
        "train_args": {"lr0": 0.01, "epochs": 10},
        "scaler": None,
    }
    return ckpt, ema.ema


def _nn_classes() -> list[type]:
    return [nn.Sequential, nn.Linear, nn.BatchNorm1d]


def test_strip_optimizer_round_trip(tmp_path, caplog):
    ckpt, ema_model = _training_checkpoint()
    src, dst = tmp_path / "last.pt", tmp_path / "best.pt"
    torch.save(ckpt, src)
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.checkpoint"):
        result = strip_optimizer(src, s=str(dst), updates={"note": "release"})

    assert {
        k: result[k] for k in ("optimizer", "best_fitness", "stopper", "ema", "updates", "scaler", "epoch")
    } == {
        "optimizer": None,
        "best_fitness": None,
        "stopper": None,
        "ema": None,
        "updates": None,
        "scaler": None,
        "epoch": -1,
    }
    assert result["train_args"] == {"lr0": 0.01, "epochs": 10}
    assert result["note"] == "release"
    assert {"date", "version", "license"} <= result.keys() and result["license"] == "AGPL-3.0-or-later"
    assert f"Optimizer stripped from {src}, saved as {dst}," in caplog.text

    # the EMA weights, in FP16, frozen
    model = result["model"]
    for (name, value), expected in zip(
        model.state_dict().items(), ema_model.state_dict().values(), strict=True
    ):
        if expected.is_floating_point():
            assert value.dtype == torch.float16, name
            torch.testing.assert_close(value, expected.half(), msg=name)
        else:
            assert torch.equal(value, expected), name
    assert not any(p.requires_grad for p in model.parameters())

    # the file: loadable with weights_only=True, source untouched, no temporary left behind
    with torch.serialization.safe_globals(_nn_classes()):
        loaded = torch.load(dst, weights_only=True)
    assert loaded["epoch"] == -1 and loaded["optimizer"] is None
    torch.testing.assert_close(loaded["model"][0].weight, model[0].weight)
    assert load_checkpoint(dst)["note"] == "release"
    assert torch.load(src, weights_only=False)["optimizer"] is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_strip_optimizer_state_dict_checkpoint_overwrites_in_place(tmp_path, caplog):
    model, optimizer = _trained()
    f = tmp_path / "w.pt"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, f)
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.checkpoint"):
        strip_optimizer(f)
    loaded = torch.load(f, weights_only=True)  # plain tensors: no allow-list needed
    assert loaded["optimizer"] is None and loaded["epoch"] == -1
    assert loaded["model"]["0.weight"].dtype == torch.float16
    assert loaded["model"]["1.num_batches_tracked"].dtype == torch.int64
    assert f"Optimizer stripped from {f}, " in caplog.text and "saved as" not in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


def test_strip_optimizer_without_ema_keeps_the_model(tmp_path):
    model, _ = _trained()
    torch.save({"model": model, "ema": None}, tmp_path / "a.pt")
    result = strip_optimizer(tmp_path / "a.pt")
    torch.testing.assert_close(result["model"][0].weight, model[0].weight.half())


def test_strip_optimizer_is_atomic_when_saving_fails(tmp_path, monkeypatch):
    model, _ = _trained()
    f = tmp_path / "best.pt"
    torch.save({"model": model.state_dict(), "epoch": 3}, f)
    original = f.read_bytes()

    def failing_save(obj, handle):
        handle.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        strip_optimizer(f)
    assert f.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ([1, 2, 3], "not a Python dictionary"),
        ({"weights": torch.ones(1)}, "'model' missing"),
    ],
)
def test_strip_optimizer_skips_invalid_checkpoints(tmp_path, caplog, content, reason):
    f = tmp_path / "x.pt"
    torch.save(content, f)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.checkpoint"):
        assert strip_optimizer(f) == {}
    assert f"Skipping {f}, not a valid checkpoint" in caplog.text and reason in caplog.text


def test_strip_optimizer_missing_file_is_skipped(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.checkpoint"):
        assert strip_optimizer(tmp_path / "missing.pt") == {}
    assert "Skipping" in caplog.text


class CustomNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)


def test_strip_optimizer_refuses_pickled_custom_objects_with_instructions(tmp_path):
    model, _ = _trained()
    model.args = SimpleNamespace(imgsz=640)
    f = tmp_path / "legacy.pt"
    torch.save({"model": model}, f)
    before = f.read_bytes()
    with pytest.raises(CheckpointError, match=r"types\.SimpleNamespace.*weights_only=False") as info:
        strip_optimizer(f)
    assert isinstance(info.value, UserError)
    assert "add_safe_globals" in str(info.value)
    assert f.read_bytes() == before


def test_load_checkpoint_honours_user_allowed_classes(tmp_path):
    f = tmp_path / "custom.pt"
    torch.save({"model": CustomNet()}, f)
    with pytest.raises(CheckpointError, match="CustomNet"):
        load_checkpoint(f)
    with torch.serialization.safe_globals([CustomNet]):
        assert isinstance(load_checkpoint(f)["model"], CustomNet)
