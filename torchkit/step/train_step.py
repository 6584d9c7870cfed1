"""The one training step: what the fake-tensor estimator simulates, what ``torchkit.step.measure`` and the
CPU ground truth run, and what the seed's ``autobatch`` probes (``probe_step``) run.

``train_step``: ``zero_grad(set_to_none=True) → forward + loss under autocast → backward → optimizer step``.
The estimator and the measurement run two iterations of it (``run_training_iterations``) on one batch built
once, so the second iteration runs with optimizer state and gradients of the first already allocated, as
every later iteration of a real job does; autobatch runs it once per probe after a warm-up probe.

Why this optimizer (``make_optimizer``) for all three: SGD with momentum and weight decay 5e-4 (Ultralytics'
``weight_decay``), ``foreach=True``. Autobatch used to build its own (Nesterov momentum 0.937, no weight
decay, torch's default implementation); the estimator's is the one pinned byte for byte to the CPU ground
truth, and the memory of a step depends on the optimizer's shape, not on the momentum value: one momentum
buffer per weight either way, plus the ``grad + wd·param`` temporary of weight decay, which a real
Ultralytics run has. One definition means autobatch, measurement and estimate count the same bytes.

Optimizers use ``foreach=True``: that is what ``torch.optim`` picks by default for CUDA parameters
(``_default_to_fused_or_foreach``), and its list-wide temporaries are part of the CUDA peak; on CPU the
same flag runs the same operators through the per-tensor fallback, so the CPU ground truth and the
estimate stay the same step. GradScaler is not run: its ``found_inf`` check reads a value to the host,
which fake tensors cannot do, and its memory is a few scalars.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torchkit.errors import ConfigError
from torchkit.step.options import AMP_MODES, OPTIMIZERS

NUM_ITERATIONS = 2

SGD_SETTINGS = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4}
"""Ultralytics' SGD defaults (lr0 0.01, momentum 0.937≈0.9, weight_decay 5e-4); weight decay matters for
memory: foreach SGD builds ``grad + wd·param`` as a new list (one gradient-sized temporary)."""
ADAMW_SETTINGS = {"lr": 1e-3, "weight_decay": 0.01}
"""torch's AdamW defaults"""


def check_options(amp: str, optimizer: str) -> None:
    if amp not in AMP_MODES:
        raise ConfigError(f"unknown amp mode {amp!r} (use one of: {', '.join(AMP_MODES)})")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r} (use one of: {', '.join(OPTIMIZERS)})")


def make_optimizer(name: str, params: list) -> Any:
    """``torch.optim.SGD`` (momentum) or ``AdamW`` over ``params``, foreach, with the settings above: the
    optimizer of the one training step (see the module docstring for why these settings)."""
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, foreach=True, **SGD_SETTINGS)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=True, **ADAMW_SETTINGS)
    raise ConfigError(f"unknown optimizer {name!r} (use one of: {', '.join(OPTIMIZERS)})")


def autocast_context(amp: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """``torch.autocast`` in the amp dtype on ``device_type``, or nothing for ``off``."""
    import torch

    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    return torch.autocast(device_type, dtype=dtype)


def optimizer_state_tensors(optimizer: Any) -> Iterator[Any]:
    """Every tensor in the optimizer's per-parameter state (momentum, exp_avg, exp_avg_sq, step)."""
    import torch

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


class StepHooks:
    """Called by :func:`run_training_iterations` between phases; the estimator's tracker overrides them."""

    def iteration(self, index: int) -> None: ...
    def forward(self) -> None: ...
    def backward(self) -> None: ...
    def after_backward(self, params: list) -> None: ...
    def optimizer(self) -> None: ...
    def after_step(self, optimizer: Any) -> None: ...


def train_step(
    model: Any,
    optimizer: Any,
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    amp: str,
    hooks: StepHooks | None = None,
    device_type: str = "cpu",
    forward: Callable[[Any, Any], Any] | None = None,
) -> None:
    """One training step: free the gradients, forward and loss under autocast, backward, optimizer step.

    ``optimizer`` None runs forward and backward only (the seed's probe without an optimizer).
    ``forward(model, inputs)`` calls the model (default ``model(inputs)``; autobatch also accepts tuples
    and dicts of inputs). ``amp="off"`` adds no autocast (a caller's own autocast context stays in force).
    """
    hooks = hooks or StepHooks()
    params = [] if optimizer is None else [p for group in optimizer.param_groups for p in group["params"]]
    hooks.optimizer()
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    hooks.forward()
    with autocast_context(amp, device_type):
        output = model(inputs) if forward is None else forward(model, inputs)
        loss = loss_fn(output, targets)
        del output
    hooks.backward()
    loss.backward()
    del loss
    hooks.after_backward(params)
    hooks.optimizer()
    if optimizer is not None:
        optimizer.step()
    hooks.after_step(optimizer)


def run_training_iterations(
    model: Any,
    optimizer: Any,
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    *,
    amp: str,
    hooks: StepHooks | None = None,
    num_iterations: int = NUM_ITERATIONS,
    device_type: str = "cpu",
    warm_start: bool = False,
) -> None:
    """Run ``num_iterations`` training iterations (real or fake tensors, any device the inputs are on). A
    dict of inputs is passed as keyword arguments.

    ``warm_start`` replaces the first iteration by an optimizer step on zero gradients: it creates the
    optimizer state the first iteration would (same tensors, any optimizer) without a forward and
    backward. The fake pass uses it (half the work); the memory of every later iteration is the same,
    which the CPU ground-truth comparisons check byte for byte.
    """
    from torchkit.workloads import call_model

    hooks = hooks or StepHooks()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model.train()
    first = 0
    if warm_start:
        import torch

        hooks.iteration(0)
        hooks.optimizer()
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        hooks.after_step(optimizer)
        first = 1
    for index in range(first, num_iterations):
        hooks.iteration(index)
        train_step(
            model,
            optimizer,
            inputs,
            targets,
            loss_fn,
            amp=amp,
            hooks=hooks,
            device_type=device_type,
            forward=call_model,
        )


def to_device(value: Any, device: Any) -> Any:
    """``value`` (a tensor, or dicts/tuples/lists of them) moved to ``device``; other values as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, device) for v in value)
    return value
