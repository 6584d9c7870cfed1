"""Build a model outside fake mode, then hand the estimator copies whose parameters and buffers are fake.

Many real constructors read tensor values while they build: timm computes drop-path rates with
``torch.linspace(...).tolist()``, Ultralytics runs a stride-probing forward and initialises biases from the
strides, ``nn.TransformerEncoder`` deep-copies its layer. Under ``FakeTensorMode`` the first two raise
``DataDependentOutputException`` and the last ``Mixing fake modes NYI``. So the model is constructed
first, without fake tensors:

1. on the ``meta`` device (no memory, no compute: enough for a model of any size whose constructor only
   needs shapes, e.g. a Hugging Face model from its config);
2. if that fails (the constructor read a value), for real on the CPU, where every construction-time
   ``.item()`` works (memory: the model's parameters, once).

:func:`fake_copy` then deep-copies that template with every parameter and buffer replaced by a fake tensor
of the same shape, stride, dtype and ``requires_grad`` on the CPU, so tied weights stay tied and the
template is never touched. Plain tensor attributes that are not parameters or buffers (Ultralytics keeps
``stride`` that way) are copied as they are; a ``meta`` one becomes a fake CPU tensor.

Known limitations: a constructor that succeeds on ``meta`` but stores a value-dependent Python number
computed from a meta tensor cannot exist (meta tensors have no values, reading one raises, and the CPU
build takes over); two parameters that are different views of one storage are counted separately.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

log = logging.getLogger(__name__)

BuiltOn = Literal["meta", "cpu"]


def build_outside_fake_mode(factory: Callable[[], object]) -> tuple[object, BuiltOn]:
    """Call ``factory`` on the meta device, or (when that raises) for real on the CPU.

    Returns what the factory returned and where it was built. Exceptions of the CPU attempt propagate
    (they are the factory's own errors).
    """
    try:
        with torch.device("meta"):
            return factory(), "meta"
    except Exception as e:  # any failure on meta: the constructor needs values; build it for real
        log.debug("building on the meta device failed (%s: %s); building on the CPU", type(e).__name__, e)
    return factory(), "cpu"


@functools.lru_cache(maxsize=2)
def template_for(factory: Callable[[], object]) -> tuple[object, BuiltOn]:
    """:func:`build_outside_fake_mode`, kept for the last two factories: a workload's fingerprint, its
    check and its fake passes all copy one template instead of building the model each time."""
    return build_outside_fake_mode(factory)


def fake_copy(template: nn.Module, fake_mode: object) -> nn.Module:
    """A deep copy of ``template`` whose parameters and buffers are fake CPU tensors of ``fake_mode``.

    Tied parameters (one object under two names) stay one parameter. Must not be called inside
    ``fake_mode`` for the deep copy (it copies non-tensor state for real); the fakes are made inside it.
    """
    memo: dict[int, object] = {}
    with fake_mode:
        for tensor in _module_tensors(template):
            if id(tensor) not in memo:
                memo[id(tensor)] = _fake_like(tensor)
    model = copy.deepcopy(template, memo)
    with fake_mode:
        for module in model.modules():
            for name, value in list(vars(module).items()):
                if isinstance(value, torch.Tensor) and value.device.type == "meta":
                    setattr(module, name, _fake_like(value))
    return model


def _module_tensors(module: nn.Module):
    for sub in module.modules():
        yield from (p for p in sub._parameters.values() if p is not None)
        yield from (b for b in sub._buffers.values() if b is not None)


def _fake_like(tensor: torch.Tensor) -> torch.Tensor:
    data = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=tensor.dtype, device="cpu")
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data
