"""The backward share a measured profile carries: ``torchkit.step.measure.PhaseTimer`` marks each training
step's forward start, backward start and backward end through ``train_step``'s hooks (CUDA events on a GPU; on
CPU the host clock it is given, here a fake one that the model's own passes advance, so no wall clock is read)."""

from __future__ import annotations

import pytest
import torch

from torchkit.step.measure import PhaseTimer
from torchkit.step.train_step import make_optimizer, run_training_iterations


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ticking_model(clock: _Clock, forward_s: float, backward_s: float) -> torch.nn.Module:
    """A Linear whose forward advances ``clock`` by ``forward_s`` and whose backward by ``backward_s``."""

    class Tick(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            clock.now += forward_s
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            clock.now += backward_s
            return grad

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x):
            return Tick.apply(self.linear(x))

    return Model()


@pytest.mark.parametrize(("forward_s", "backward_s"), [(1.0, 2.0), (0.01, 0.03), (5.0, 1.0)])
def test_each_steps_share_is_its_backward_over_forward_plus_backward(forward_s, backward_s):
    clock = _Clock()
    model = _ticking_model(clock, forward_s, backward_s)
    optimizer = make_optimizer("sgd", list(model.parameters()))
    timer = PhaseTimer(torch.device("cpu"), clock=clock)
    run_training_iterations(
        model,
        optimizer,
        torch.randn(3, 4),
        torch.randn(3, 2),
        torch.nn.functional.mse_loss,
        amp="off",
        hooks=timer,
        num_iterations=3,
    )
    assert timer.backward_shares() == pytest.approx([backward_s / (forward_s + backward_s)] * 3)


def test_a_step_that_did_not_reach_its_backward_end_or_took_no_time_is_left_out():
    clock = _Clock()
    timer = PhaseTimer(torch.device("cpu"), clock=clock)
    timer.forward()
    timer.backward()  # a step stopped in its backward (an out-of-memory error)
    assert timer.backward_shares() == []
    timer.forward()
    timer.backward()
    timer.after_backward([])  # no time passed: no share to tell
    assert timer.backward_shares() == []
