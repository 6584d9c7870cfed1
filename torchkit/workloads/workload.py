"""The ``Workload`` type (what a training step needs: a model factory, a batch builder and a loss) and what is
checked about one: its model template, that it has parameters, that a batch goes through forward and loss.

Inputs that are a dict are passed to the model as keyword arguments (``model(**inputs)``). Every
``make_batch`` builds its tensors with ``torch.rand*``/``torch.randint`` and no real data, so it works under
``FakeTensorMode`` (the estimator's fake passes) as well as for real.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchkit.errors import WorkloadError


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One training workload: model, inputs and loss."""

    name: str
    """``resnet50`` for a built-in, ``pkg.mod:factory`` for a user factory"""
    sample_shape: tuple[int, ...]
    """per-sample input shape, e.g. ``(3, 224, 224)`` or ``(seq_len,)`` for token inputs"""
    build_model: Callable[[], torch.nn.Module]
    """builds the model with fresh parameters on the current default device (CPU); no arguments"""
    make_batch: Callable[[int], tuple[Any, Any]]
    """batch size -> (inputs, targets) on CPU; must work under FakeTensorMode (random tensors only)"""
    loss_fn: Callable[[Any, Any], torch.Tensor]
    """(model output, targets) -> scalar loss"""
    config: str = ""
    """settings that shape memory beyond the model and the input (YOLO ``max_obj``, ``nc``); part of the
    fingerprint"""
    description: str = ""
    """one line for people"""
    notes: tuple[str, ...] = ()
    """what the estimate of this workload leaves out or stands in for (shown with the profile)"""
    margin_bytes: int = 0
    """device bytes added to every estimate for memory the simulated step does not hold (e.g. the EMA
    copy of the weights an Ultralytics trainer keeps); stated in ``notes``"""

    def __post_init__(self) -> None:
        if not self.sample_shape or any(int(d) <= 0 for d in self.sample_shape):
            raise WorkloadError(
                f"workload {self.name!r}: sample_shape {self.sample_shape} must be non-empty positive "
                "dimensions (e.g. --input-shape 3,224,224)"
            )


def model_template(workload: Workload) -> torch.nn.Module:
    """The workload's model built outside fake mode (meta device, else CPU; cached for the last two), what
    the estimator and the fingerprint copy with fake parameters (:mod:`torchkit.workloads.construct`).

    Raises:
        WorkloadError: the factory fails or returns no ``nn.Module``.
    """
    from torchkit.workloads.construct import template_for

    try:
        model, _ = template_for(workload.build_model)
    except WorkloadError:
        raise
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise WorkloadError(
            f"model factory of {workload.name!r} failed: {type(e).__name__}: {text} "
            "(it must build the model with no arguments)"
        ) from e
    if not isinstance(model, torch.nn.Module):
        raise WorkloadError(
            f"model factory of {workload.name!r} returned {type(model).__name__}, not an nn.Module"
        )
    return model


def call_model(model: Any, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict of named inputs (Hugging Face), else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def check_model(model: torch.nn.Module, workload: Workload, *, inputs: Any = None) -> None:
    """Check that ``model`` (a template, built outside fake mode) has trainable parameters and that a batch
    of 2 of ``workload`` goes through forward and loss, on a fake copy (no memory, no compute).

    Args:
        inputs: the ``InputSpec`` of a user model, to say whether a failure is the dtype or the shape.

    Raises:
        WorkloadError: no trainable parameters, or the input does not fit the model (dtype or shape).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchkit.workloads.construct import fake_copy

    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(
            f"model {workload.name!r} has no trainable parameters (a training step needs some; check the factory)"
        )
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = fake_copy(model, mode)
    with mode:
        batch, targets = workload.make_batch(2)
        try:
            loss = workload.loss_fn(call_model(fake.train(), batch), targets)
        except WorkloadError:
            raise
        except Exception as e:
            raise WorkloadError(_input_mismatch(workload, e, inputs)) from e
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise WorkloadError(f"loss of workload {workload.name!r} is not a scalar tensor")


#: words of torch's dtype complaints ("expected scalar type Long", "not implemented for 'Long'",
#: "Input type (long int) and bias type (float)", "must have the same dtype")
_DTYPE_WORDS = ("scalar type", "dtype", "not implemented for", "type (", "indices")


def _input_mismatch(workload: Workload, e: Exception, inputs: Any) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cause = f"{type(e).__name__}: {text}"
    if inputs is None:
        return f"model {workload.name!r} cannot take its input {workload.sample_shape}: {cause} (check the model's input options)"
    if any(word in text for word in _DTYPE_WORDS):
        if not inputs.is_tokens and ("indices" in text or "Long" in text or "Int" in text):
            fix = "it takes integer token ids: give --seq-len N --vocab-size V, or --input-dtype int64 --vocab-size V"
        elif inputs.is_tokens:
            fix = (
                "it takes floating-point inputs: drop --vocab-size and give --input-shape (and --input-dtype)"
            )
        else:
            fix = "give the dtype it expects with --input-dtype"
        return f"model {workload.name!r} cannot take input dtype {inputs.dtype} ({inputs.describe()}): {cause} ({fix})"
    return (
        f"model {workload.name!r} cannot take input shape {inputs.shape} per sample ({inputs.describe()}): {cause} "
        "(give the shape the model's first layer expects with --input-shape)"
    )
