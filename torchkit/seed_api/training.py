"""Training mechanics: weight EMA, early stopping, the one-cycle schedule and seeding
(shared/reference/ultralytics-behaviour.md §2.19 ``one_cycle``, §2.22, §2.23, §2.26).
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Collection
from copy import deepcopy

import numpy as np
import torch
from torch import nn

from torchkit.seed_api.model_utils import copy_attr, unwrap_model

LOGGER = logging.getLogger(__name__)


def one_cycle(y1: float = 0.0, y2: float = 1.0, steps: int = 100) -> Callable[[float], float]:
    """Cosine ramp from ``y1`` (x=0) to ``y2`` (x=steps): ``x ↦ max((1 − cos(π·x/steps))/2, 0)·(y2 − y1) + y1``.

    As the seed it is not clamped: past ``steps`` it runs back (period ``2·steps``), e.g. 1 → 0.01 over 100
    steps gives 0.505 at x=150 (https://arxiv.org/pdf/1812.01187.pdf).
    """

    def ramp(x: float) -> float:
        return max((1 - math.cos(x * math.pi / steps)) / 2, 0) * (y2 - y1) + y1

    return ramp


def init_seeds(seed: int = 0, deterministic: bool = False) -> None:
    """Seed Python ``random``, NumPy and torch (every device); with ``deterministic`` also ask torch for
    deterministic algorithms, otherwise undo that (``unset_deterministic``).

    Deterministic mode (https://pytorch.org/docs/stable/notes/randomness.html): deterministic algorithms with
    ``warn_only=True`` (an op without a deterministic kernel warns instead of failing), cuDNN deterministic,
    uninitialised memory not filled (filling costs time and only matters for ops reading it),
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (needed by cuBLAS >= 10.2 for reproducible results) and
    ``PYTHONHASHSEED`` (affects child processes only).
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds CUDA (and other accelerators) too, lazily: CUDA is not initialised here
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.utils.deterministic.fill_uninitialized_memory = False
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        os.environ["PYTHONHASHSEED"] = str(seed)
    else:
        unset_deterministic()


def unset_deterministic() -> None:
    """Undo ``init_seeds(deterministic=True)``: torch's defaults back, both environment variables removed."""
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    torch.utils.deterministic.fill_uninitialized_memory = True
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    os.environ.pop("PYTHONHASHSEED", None)


class ModelEMA:
    """Exponential moving average of a model's state (parameters and floating-point buffers), in FP32.

    ``ema ← d·ema + (1 − d)·model`` after each optimizer step, with ``d = decay·(1 − exp(−updates/tau))``: the
    ramp lets early updates count (d ≈ 0.0005 at update 1, 0.632·decay at update ``tau``).
    References: timm's ModelEmaV2; TensorFlow's ExponentialMovingAverage.

    Attributes:
        ema: deep copy of the unwrapped model, in eval mode, without gradients.
        updates: number of ``update`` calls so far (start from a checkpoint's value to resume).
        enabled: set False to make ``update``/``update_attr`` no-ops.

    Known limitations: the pairs of tensors are cached at the first ``update`` (as the seed does, to skip a
    ``state_dict()`` per step) and rebuilt when another model object is passed; if the *same* model's
    parameters are replaced afterwards (``model.to(other_device)``, ``model.half()``), call
    ``clear_cache()``.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000, updates: int = 0) -> None:
        self.ema = deepcopy(unwrap_model(model)).eval()
        if hasattr(self.ema, "teacher_model"):  # a distillation model: the teacher is not averaged
            self.ema.teacher_model = None
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self.updates = updates
        self.max_decay = decay
        self.tau = tau
        self.enabled = True
        self._cache_key: int | None = None
        self._ema_tensors: list[torch.Tensor] = []
        self._model_tensors: list[torch.Tensor] = []

    def decay(self, updates: float) -> float:
        """Decay after ``updates`` updates: ``max_decay·(1 − exp(−updates/tau))``."""
        return self.max_decay * (1 - math.exp(-updates / self.tau))

    def clear_cache(self) -> None:
        """Forget the cached tensor pairs; the next ``update`` reads both state dicts again."""
        self._cache_key = None
        self._ema_tensors, self._model_tensors = [], []

    def _pairs(self, model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._cache_key != id(model):
            model_state = unwrap_model(model).state_dict()
            ema_tensors, model_tensors = [], []
            for key, value in self.ema.state_dict().items():
                if value.dtype.is_floating_point:  # integer buffers (num_batches_tracked) are not averaged
                    ema_tensors.append(value)
                    model_tensors.append(model_state[key])
            self._cache_key = id(model)
            self._ema_tensors, self._model_tensors = ema_tensors, model_tensors
        return self._ema_tensors, self._model_tensors

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Average ``model``'s current state into the EMA (call after each optimizer step)."""
        if not self.enabled:
            return
        self.updates += 1
        weight = 1 - self.decay(
            self.updates
        )  # lerp(ema, model, w) = (1 − w)·ema + w·model = d·ema + (1−d)·model
        ema_tensors, model_tensors = self._pairs(model)
        if not ema_tensors:
            return
        if ema_tensors[0].device.type == "npu":  # no fused foreach kernels on Ascend (as the seed)
            for e, m in zip(ema_tensors, model_tensors, strict=True):
                e.lerp_(m, weight)
        else:
            torch._foreach_lerp_(ema_tensors, model_tensors, weight)

    def update_attr(
        self, model: nn.Module, include: Collection[str] = (), exclude: Collection[str] = ()
    ) -> None:
        """Copy non-private attributes of the unwrapped ``model`` onto the EMA (see ``copy_attr``)."""
        if self.enabled:
            copy_attr(self.ema, unwrap_model(model), include, exclude)


class EarlyStopping:
    """Stop training after ``patience`` epochs without a fitness above the best so far.

    Exactly the seed's rules: a fitness counts as an improvement if it is above the best **or the best is
    still 0** (so an early zero-fitness stage keeps moving the best epoch); ``patience`` 0 or None disables
    stopping. A NaN fitness compares False with everything, so it becomes the best only while the best is 0
    and, once it has, no later fitness beats it; an infinite fitness is never beaten either. Both are logged
    as warnings.
    """

    def __init__(self, patience: int | None = 50) -> None:
        self.best_fitness = 0.0
        self.best_epoch = 0
        self.patience: float = patience or float("inf")
        self.possible_stop = False
        """True when the next epoch without improvement will stop training"""

    def __call__(self, epoch: int, fitness: float | None) -> bool:
        """Record ``fitness`` of ``epoch``; True if training should stop now. ``None`` (no validation) → False."""
        if fitness is None:
            return False
        if not math.isfinite(fitness):
            LOGGER.warning(
                "EarlyStopping: fitness is %s at epoch %d; nothing after a best of NaN or inf counts "
                "as an improvement",
                fitness,
                epoch,
            )
        if fitness > self.best_fitness or self.best_fitness == 0:
            self.best_epoch = epoch
            self.best_fitness = fitness
        delta = epoch - self.best_epoch
        self.possible_stop = delta >= (self.patience - 1)
        stop = delta >= self.patience
        if stop:
            LOGGER.info(
                f"EarlyStopping: Training stopped early as no improvement observed in last {self.patience} epochs. "
                f"Best results observed at epoch {self.best_epoch}, best model saved as best.pt.\n"
                f"To update EarlyStopping(patience={self.patience}) pass a new patience value, "
                "i.e. `patience=300` or use `patience=0` to disable EarlyStopping."
            )
        return stop
