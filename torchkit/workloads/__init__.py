"""Reference workloads (plain torch, no torchvision) and user workloads, as one ``Workload`` type.

A workload is what a training step needs: a model factory, a batch builder and a loss. Built-in names:
``resnet18``, ``resnet50``, ``resnext101-32x4d``, ``se-resnext101-32x4d`` (224), ``yolo-n``, ``yolo-s`` (640), ``vit-b16`` (224), ``gpt2-small``
(sequence length 1024). A user workload is ``package.module:factory``: the factory returns an
``nn.Module`` (its input is a float tensor of ``input_shape`` per sample, loss
``output.float().pow(2).mean()``) or a ``Workload`` itself.

Every ``make_batch`` builds its tensors with ``torch.rand*``/``torch.randint`` and no real data, so it
works under ``FakeTensorMode`` (the estimator's fake passes) as well as for real. Importing this package
imports torch; the model modules are imported when a workload is built.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
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

    def __post_init__(self) -> None:
        if not self.sample_shape or any(int(d) <= 0 for d in self.sample_shape):
            raise WorkloadError(
                f"workload {self.name!r}: sample_shape {self.sample_shape} must be non-empty positive "
                "dimensions (e.g. --input-shape 3,224,224)"
            )


WORKLOAD_NAMES: tuple[str, ...] = (
    "resnet18", "resnet50", "resnext101-32x4d", "se-resnext101-32x4d", "yolo-n", "yolo-s", "vit-b16", "gpt2-small"
)
DEFAULT_IMGSZ = {
    "resnet18": 224, "resnet50": 224, "resnext101-32x4d": 224, "se-resnext101-32x4d": 224, "yolo-n": 640,
    "yolo-s": 640, "vit-b16": 224,
}
DEFAULT_SEQ_LEN = 1024
USER_INPUT_LOSS = "output.float().pow(2).mean()"
"""the loss of a user factory that returns a bare nn.Module"""


def get_workload(
    name: str,
    *,
    imgsz: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seq_len: int | None = None,
) -> Workload:
    """The workload called ``name``: a built-in name or ``package.module:factory``.

    Args:
        imgsz: square image size for the image workloads (default 224 or 640).
        input_shape: per-sample input shape; required for a factory returning an ``nn.Module``; for a
            built-in image workload ``(3, H, W)`` with H == W is the same as ``imgsz``.
        seq_len: sequence length for ``gpt2-small`` (default 1024, at most 1024).

    Raises:
        WorkloadError: unknown name, a factory that cannot be imported or fails, a model without
            parameters, an input shape the model cannot take, an invalid size.
    """
    if ":" in name:
        if imgsz is not None or seq_len is not None:
            raise WorkloadError(
                f"model {name!r} is a user factory: give its per-sample input with --input-shape "
                "(--imgsz and --seq-len are for the built-in workloads)"
            )
        return _user_workload(name, input_shape)
    if name not in WORKLOAD_NAMES:
        raise WorkloadError(
            f"unknown workload {name!r} (known: {', '.join(WORKLOAD_NAMES)}; or give package.module:factory "
            "with --input-shape)"
        )
    if name == "gpt2-small":
        return _gpt2_workload(seq_len, input_shape)
    size = _image_size(name, imgsz, input_shape)
    if name.startswith(("resnet", "resnext", "se-resnext")):
        from torchkit.workloads import resnet

        factory = resnet.FACTORIES[name]
        return Workload(
            name=name,
            sample_shape=(3, size, size),
            build_model=factory,
            make_batch=lambda b: resnet.make_image_classification_batch(b, size),
            loss_fn=resnet.classification_loss,
            description=f"{name} at {size}, 1000 classes, cross-entropy",
        )
    if name == "vit-b16":
        from torchkit.workloads import resnet, vit

        if size % vit.PATCH_SIZE:
            raise WorkloadError(
                f"vit-b16 needs an image size divisible by 16, got {size} (use e.g. --imgsz 224)"
            )
        return Workload(
            name=name,
            sample_shape=(3, size, size),
            build_model=lambda: vit.vit_b16(size),
            make_batch=lambda b: resnet.make_image_classification_batch(b, size),
            loss_fn=resnet.classification_loss,
            description=f"ViT-B/16 at {size}, 1000 classes, cross-entropy",
        )
    from torchkit.workloads import yolo

    if size % max(yolo.STRIDES):
        raise WorkloadError(f"{name} needs an image size divisible by 32, got {size} (use e.g. --imgsz 640)")
    variant = name.split("-")[1]
    return Workload(
        name=name,
        sample_shape=(3, size, size),
        build_model=lambda: yolo.yolo_detector(variant),
        make_batch=lambda b: yolo.make_detection_batch(b, size),
        loss_fn=yolo.detection_loss,
        config=f"max_obj={yolo.MAX_OBJ},nc={yolo.NUM_CLASSES}",
        description=f"YOLO-like {variant} at {size}, {yolo.NUM_CLASSES} classes, {yolo.MAX_OBJ} boxes/image, "
        "dense TAL assigner loss",
    )


def _image_size(name: str, imgsz: int | None, input_shape: tuple[int, ...] | None) -> int:
    size = DEFAULT_IMGSZ[name] if imgsz is None else int(imgsz)
    if input_shape is not None:
        shape = tuple(int(d) for d in input_shape)
        if len(shape) != 3 or shape[0] != 3 or shape[1] != shape[2]:
            raise WorkloadError(
                f"{name} takes square RGB images, input shape {shape} does not fit (use --input-shape 3,{size},{size} "
                f"or --imgsz {size})"
            )
        if imgsz is not None and shape[1] != imgsz:
            raise WorkloadError(
                f"{name}: --imgsz {imgsz} and --input-shape {shape} disagree (give one of them)"
            )
        size = shape[1]
    if size < 32:
        raise WorkloadError(f"{name}: image size {size} is too small (use --imgsz 32 or more)")
    return size


def _gpt2_workload(seq_len: int | None, input_shape: tuple[int, ...] | None) -> Workload:
    from torchkit.workloads import gpt2

    if input_shape is not None:
        if len(input_shape) != 1:
            raise WorkloadError(
                f"gpt2-small takes token sequences, input shape {tuple(input_shape)} does not fit "
                f"(use --seq-len N or --input-shape N, N <= {gpt2.MAX_POSITIONS})"
            )
        if seq_len is not None and int(input_shape[0]) != seq_len:
            raise WorkloadError(
                f"gpt2-small: --seq-len {seq_len} and --input-shape {tuple(input_shape)} disagree"
            )
        seq_len = int(input_shape[0])
    length = DEFAULT_SEQ_LEN if seq_len is None else int(seq_len)
    if not 1 <= length <= gpt2.MAX_POSITIONS:
        raise WorkloadError(
            f"gpt2-small: sequence length {length} is outside 1..{gpt2.MAX_POSITIONS} (use --seq-len 1024)"
        )
    return Workload(
        name="gpt2-small",
        sample_shape=(length,),
        build_model=gpt2.gpt2_small,
        make_batch=lambda b: gpt2.make_token_batch(b, length),
        loss_fn=gpt2.next_token_loss,
        description=f"GPT-2 small (124M), sequence length {length}, next-token cross-entropy",
    )


def _user_workload(spec: str, input_shape: tuple[int, ...] | None) -> Workload:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise WorkloadError(f"model {spec!r} is not package.module:factory (e.g. mypkg.models:build_net)")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's module, report it with its cause
        raise WorkloadError(
            f"cannot import {module_name!r} for model {spec!r}: {type(e).__name__}: {e} "
            "(check the module is on PYTHONPATH / installed)"
        ) from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(
            f"{module_name!r} has no callable {attr!r} (model {spec!r}; name a function returning an nn.Module)"
        )

    def build() -> torch.nn.Module:
        try:
            model = factory()
        except Exception as e:
            raise WorkloadError(
                f"factory {spec!r} failed: {type(e).__name__}: {e} (it must build the model with no arguments)"
            ) from e
        if isinstance(model, Workload):
            return model.build_model()
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(
                f"factory {spec!r} returned {type(model).__name__}, not an nn.Module or a Workload"
            )
        return model

    # a factory may return a whole Workload; find out once, on fake tensors (no memory, no compute)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        probe = _call_factory(factory, spec)
        if isinstance(probe, Workload):
            return probe
        if input_shape is None:
            raise WorkloadError(
                f"model {spec!r} needs its per-sample input shape (use --input-shape C,H,W, e.g. 3,224,224)"
            )
        shape = tuple(int(d) for d in input_shape)
        workload = Workload(
            name=spec,
            sample_shape=shape,
            build_model=build,
            make_batch=lambda b: (torch.randn(b, *shape), None),
            loss_fn=_default_loss,
            description=f"user model {spec}, input {shape}, loss {USER_INPUT_LOSS}",
        )
        check_model(probe, workload)
    return workload


def _call_factory(factory: Callable[[], Any], spec: str) -> Any:
    try:
        model = factory()
    except WorkloadError:
        raise
    except Exception as e:
        raise WorkloadError(
            f"factory {spec!r} failed: {type(e).__name__}: {e} (it must build the model with no arguments)"
        ) from e
    if not isinstance(model, Workload | torch.nn.Module):
        raise WorkloadError(
            f"factory {spec!r} returned {type(model).__name__}, not an nn.Module or a Workload"
        )
    return model


def _default_loss(output: Any, targets: Any) -> torch.Tensor:
    if isinstance(output, tuple | list):
        output = output[0]
    return output.float().pow(2).mean()


def check_model(model: torch.nn.Module, workload: Workload) -> None:
    """Check that ``model`` has trainable parameters and that a batch of 2 of ``workload`` goes through
    forward and loss. Meant to run under ``FakeTensorMode`` (no memory, no compute).

    Raises:
        WorkloadError: no trainable parameters, or the input shape does not fit the model.
    """
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(
            f"model {workload.name!r} has no trainable parameters (a training step needs some; check the factory)"
        )
    inputs, targets = workload.make_batch(2)
    try:
        loss = workload.loss_fn(model(inputs), targets)
    except Exception as e:
        raise WorkloadError(
            f"model {workload.name!r} cannot take input shape {workload.sample_shape} per sample: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
            "(give the shape the model's first layer expects with --input-shape)"
        ) from e
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise WorkloadError(f"loss of workload {workload.name!r} is not a scalar tensor")


def workload_fingerprint(workload: Workload) -> str:
    """Content key of a workload (model structure, parameter shapes/dtypes, input, config), 16 hex digits.

    The model is built on fake tensors, so this costs no memory. Two workloads with the same key train the
    same architecture on the same input shape; the key is what profile caches are indexed by.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = workload.build_model()
        params = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
        buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    text = repr((str(model), params, buffers, tuple(workload.sample_shape), workload.config))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "DEFAULT_IMGSZ",
    "DEFAULT_SEQ_LEN",
    "WORKLOAD_NAMES",
    "Workload",
    "check_model",
    "get_workload",
    "workload_fingerprint",
]
