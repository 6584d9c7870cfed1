"""torchkit.seed_api.training: one-cycle schedule, EMA maths, early-stopping sequences, seeding."""

from __future__ import annotations

import logging
import math
import os
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from torchkit.seed_api.training import EarlyStopping, ModelEMA, init_seeds, one_cycle, unset_deterministic

# --------------------------------------------------------------------------------------------------------
# one_cycle
# --------------------------------------------------------------------------------------------------------


def test_one_cycle_values_at_known_points():
    f = one_cycle(1.0, 0.01, 100)
    assert [round(f(x), 3) for x in (0, 25, 50, 100)] == [1.0, 0.855, 0.505, 0.01]
    assert f(25) == pytest.approx(1 - (1 - math.cos(math.pi / 4)) / 2 * 0.99)


def test_one_cycle_is_periodic_past_steps():
    f = one_cycle(1.0, 0.01, 100)
    assert f(150) == pytest.approx(0.505)
    assert f(200) == pytest.approx(1.0)


def test_one_cycle_defaults_ramp_zero_to_one():
    f = one_cycle()
    assert (f(0), f(50), f(100)) == (0.0, pytest.approx(0.5), pytest.approx(1.0))


# --------------------------------------------------------------------------------------------------------
# ModelEMA
# --------------------------------------------------------------------------------------------------------


def _small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))


def test_ema_decay_ramp_values():
    ema = ModelEMA(nn.Linear(1, 1))
    assert ema.decay(1) == pytest.approx(0.0005, abs=1e-6)
    assert ema.decay(100) == pytest.approx(0.0488, abs=1e-4)
    assert ema.decay(2000) == pytest.approx(0.632, abs=1e-3)
    assert ema.decay(10000) == pytest.approx(0.99316, abs=1e-5)
    assert ema.decay(100) == pytest.approx(0.9999 * (1 - math.exp(-100 / 2000)))


def test_ema_copy_is_eval_frozen_and_separate():
    model = _small_model().train()
    ema = ModelEMA(model)
    assert ema.ema is not model and not ema.ema.training
    assert not any(p.requires_grad for p in ema.ema.parameters())
    assert all(p.requires_grad for p in model.parameters())
    assert ema.updates == 0 and ema.enabled


def test_ema_update_weights_follow_the_formula():
    model = _small_model()
    ema = ModelEMA(model, decay=0.9, tau=2.0)
    start = {k: v.clone() for k, v in ema.ema.state_dict().items()}

    expected = start
    for step in (1, 2):
        with torch.no_grad():  # a fake "optimizer step" and BN statistics update
            for p in model.parameters():
                p.add_(float(step))
            model[1].running_mean.fill_(float(10 * step))
            model[1].num_batches_tracked += 5
        ema.update(model)
        d = 0.9 * (1 - math.exp(-step / 2.0))
        current = model.state_dict()
        expected = {
            k: d * v + (1 - d) * current[k] if v.dtype.is_floating_point else v for k, v in expected.items()
        }
        for key, value in ema.ema.state_dict().items():
            torch.testing.assert_close(value, expected[key], msg=key)
    assert ema.updates == 2
    assert ema.ema[1].num_batches_tracked.item() == 0  # integer buffers are not averaged


def test_ema_update_from_a_new_model_object_uses_that_model():
    model = _small_model()
    ema = ModelEMA(model, decay=0.5, tau=1e-9)  # d = 0.5 from the first update
    ema.update(model)
    other = _small_model()
    with torch.no_grad():
        for p in other.parameters():
            p.fill_(4.0)
    before = ema.ema[0].weight.clone()
    ema.update(nn.DataParallel(other))
    torch.testing.assert_close(ema.ema[0].weight, 0.5 * before + 0.5 * 4.0)


def test_ema_disabled_does_nothing():
    model = _small_model()
    ema = ModelEMA(model)
    ema.enabled = False
    with torch.no_grad():
        model[0].weight.add_(1)
    ema.update(model)
    ema.update_attr(SimpleNamespace(names=["a"]))
    assert ema.updates == 0
    assert not torch.equal(ema.ema[0].weight, model[0].weight)
    assert not hasattr(ema.ema, "names")


def test_ema_from_wrapped_model_and_update_attr_rules():
    model = _small_model()
    model.names = {0: "cat"}
    model.stride = 8
    ema = ModelEMA(nn.DataParallel(model), updates=5)
    assert isinstance(ema.ema, nn.Sequential) and ema.updates == 5
    model.names, model.stride, model.extra = {0: "dog"}, 16, "x"
    ema.update_attr(nn.DataParallel(model), include=("names", "stride", "extra"), exclude=("extra",))
    assert ema.ema.names == {0: "dog"} and ema.ema.stride == 16
    assert not hasattr(ema.ema, "extra")


def test_ema_drops_a_distillation_teacher():
    model = _small_model()
    model.teacher_model = nn.Linear(2, 2)
    assert ModelEMA(model).ema.teacher_model is None
    assert model.teacher_model is not None


# --------------------------------------------------------------------------------------------------------
# EarlyStopping
# --------------------------------------------------------------------------------------------------------


def _run(stopper: EarlyStopping, fitnesses) -> list[tuple[bool, bool, int]]:
    """(stop, possible_stop, best_epoch) after each epoch, epochs numbered from 1 as the trainer does."""
    return [
        (stopper(epoch, f), stopper.possible_stop, stopper.best_epoch)
        for epoch, f in enumerate(fitnesses, start=1)
    ]


def test_early_stopping_seed_sequence(caplog):
    stopper = EarlyStopping(patience=3)
    with caplog.at_level(logging.INFO, logger="torchkit.seed_api.training"):
        states = _run(stopper, [0, 0, 0.1, 0.1, 0.1, 0.1])
    assert states == [
        (False, False, 1),
        (False, False, 2),
        (False, False, 3),
        (False, False, 3),
        (False, True, 3),
        (True, True, 3),
    ]
    assert "no improvement observed in last 3 epochs. Best results observed at epoch 3" in caplog.text
    assert "EarlyStopping(patience=3)" in caplog.text


def test_early_stopping_improvement_resets_the_count():
    stopper = EarlyStopping(patience=2)
    assert [s[0] for s in _run(stopper, [0.1, 0.1, 0.2, 0.15, 0.3, 0.3, 0.3])] == [
        False,
        False,
        False,
        False,
        False,
        False,
        True,
    ]
    assert (stopper.best_epoch, stopper.best_fitness) == (5, 0.3)


@pytest.mark.parametrize("patience", [0, None])
def test_early_stopping_patience_zero_or_none_never_stops(patience):
    stopper = EarlyStopping(patience=patience)
    assert stopper.patience == float("inf")
    assert not any(s[0] for s in _run(stopper, [0.5] + [0.1] * 500))


def test_early_stopping_none_fitness_is_ignored():
    stopper = EarlyStopping(patience=1)
    assert stopper(1, 0.5) is False
    assert stopper(5, None) is False
    assert (stopper.best_epoch, stopper.best_fitness) == (1, 0.5)


def test_early_stopping_nan_while_best_is_zero_becomes_best_and_blocks_improvements(caplog):
    stopper = EarlyStopping(patience=2)
    with caplog.at_level(logging.WARNING, logger="torchkit.seed_api.training"):
        states = _run(stopper, [0.0, float("nan"), 0.5, 0.9])
    assert states == [(False, False, 1), (False, False, 2), (False, True, 2), (True, True, 2)]
    assert math.isnan(stopper.best_fitness)
    assert "fitness is nan at epoch 2" in caplog.text


def test_early_stopping_nan_after_a_positive_best_is_no_improvement():
    stopper = EarlyStopping(patience=2)
    assert [s[0] for s in _run(stopper, [0.3, float("nan"), float("nan")])] == [False, False, True]
    assert stopper.best_fitness == 0.3


def test_early_stopping_inf_is_never_beaten():
    stopper = EarlyStopping(patience=2)
    assert [s[0] for s in _run(stopper, [0.3, float("inf"), 1e9, 1e10])] == [False, False, False, True]
    assert (stopper.best_epoch, stopper.best_fitness) == (2, float("inf"))


# --------------------------------------------------------------------------------------------------------
# seeding
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_determinism(monkeypatch):
    for name in ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"):
        monkeypatch.delenv(name, raising=False)  # restored to the original value afterwards
    yield
    unset_deterministic()


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_init_seeds_makes_python_numpy_and_torch_reproducible(restore_determinism):
    init_seeds(7)
    first = _draws()
    init_seeds(7)
    assert _draws() == first
    init_seeds(8)
    assert _draws() != first


def test_init_seeds_deterministic_then_unset(restore_determinism):
    init_seeds(3, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert os.environ["PYTHONHASHSEED"] == "3"

    init_seeds(3, deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic
    assert torch.utils.deterministic.fill_uninitialized_memory is True
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and "PYTHONHASHSEED" not in os.environ
