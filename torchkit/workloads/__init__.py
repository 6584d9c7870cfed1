"""Reference workloads (plain torch, no torchvision), library models and user workloads, as one ``Workload``
type.

A workload is what a training step needs: a model factory, a batch builder and a loss. Model sources:

- built-in names: ``resnet18``, ``resnet50`` (224), ``yolo-n``, ``yolo-s`` (640), ``vit-b16`` (224),
  ``gpt2-small`` (sequence length 1024);
- ``timm:NAME``, ``torchvision:NAME`` (image classifiers, :mod:`.image_models`), ``hf:ARCH`` or
  ``hf:path/config.json`` (:mod:`.hf_models`), ``ultralytics:FILE.yaml`` (:mod:`.ultralytics_models`):
  the ``[models]`` extra, each library imported only when asked for, fresh weights, nothing downloaded;
- ``package.module:factory`` (:mod:`.user_models`): the factory returns an ``nn.Module`` (its input is
  described by ``input_shape``/``seq_len``/``vocab_size``/``input_dtype``, loss
  ``output.float().pow(2).mean()``) or a ``Workload`` itself.

Inputs that are a dict are passed to the model as keyword arguments (``model(**inputs)``).

Every ``make_batch`` builds its tensors with ``torch.rand*``/``torch.randint`` and no real data, so it
works under ``FakeTensorMode`` (the estimator's fake passes) as well as for real. Importing this package
imports torch; the model modules are imported when a workload is built.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchkit.errors import WorkloadError
from torchkit.workloads.inputs import INPUT_DTYPES, USER_INPUT_LOSS, InputSpec


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


WORKLOAD_NAMES: tuple[str, ...] = ("resnet18", "resnet50", "yolo-n", "yolo-s", "vit-b16", "gpt2-small")
DEFAULT_IMGSZ = {"resnet18": 224, "resnet50": 224, "yolo-n": 640, "yolo-s": 640, "vit-b16": 224}
DEFAULT_SEQ_LEN = 1024
LIBRARY_PREFIXES: tuple[str, ...] = ("timm:", "torchvision:", "hf:", "ultralytics:")
"""model sources of the ``[models]`` extra; they take precedence over ``package.module:factory``"""


def get_workload(
    name: str,
    *,
    imgsz: int | None = None,
    input_shape: tuple[int, ...] | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    input_dtype: str | None = None,
) -> Workload:
    """The workload called ``name``: a built-in name, a library model (``timm:``, ``torchvision:``, ``hf:``,
    ``ultralytics:``) or ``package.module:factory``.

    Args:
        imgsz: square image size for image models (default: the model's own, 224 or 640).
        input_shape: per-sample input shape; for a factory returning an ``nn.Module``, this or ``seq_len``
            is required; for an image model ``(3, H, W)`` is the same as ``imgsz``.
        seq_len: sequence length of token models (``gpt2-small``, ``hf:``, a factory with ``vocab_size``).
        vocab_size: a factory's input is integer token ids in ``[0, vocab_size)``.
        input_dtype: a factory's input dtype (``float32`` default; ``int64`` with ``vocab_size``; see
            ``inputs.INPUT_DTYPES``).

    Raises:
        WorkloadError: unknown name, a library that is missing, a factory that cannot be imported or fails,
            a model without parameters, an input the model cannot take, an invalid size, an option the
            source does not take.
    """
    _check_options(name, imgsz=imgsz, seq_len=seq_len, vocab_size=vocab_size, input_dtype=input_dtype)
    prefix = next((p for p in LIBRARY_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        return _library_workload(name, prefix, imgsz=imgsz, input_shape=input_shape, seq_len=seq_len)
    if ":" in name:
        from torchkit.workloads.user_models import user_workload

        return user_workload(
            name, input_shape=input_shape, seq_len=seq_len, vocab_size=vocab_size, input_dtype=input_dtype
        )
    if name not in WORKLOAD_NAMES:
        raise WorkloadError(
            f"unknown workload {name!r} (known: {', '.join(WORKLOAD_NAMES)}; or timm:NAME, torchvision:NAME, "
            "hf:ARCH, ultralytics:FILE.yaml, package.module:factory)"
        )
    if name == "gpt2-small":
        return _gpt2_workload(seq_len, input_shape)
    size = _image_size(name, imgsz, input_shape)
    if name.startswith("resnet"):
        from torchkit.workloads import resnet

        factory = resnet.resnet18 if name == "resnet18" else resnet.resnet50
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


def _check_options(
    name: str, *, imgsz: int | None, seq_len: int | None, vocab_size: int | None, input_dtype: str | None
) -> None:
    """Refuse options the source does not take (they would be silently ignored otherwise)."""
    user = ":" in name and not name.startswith(LIBRARY_PREFIXES)
    if (vocab_size is not None or input_dtype is not None) and not user:
        flag = "--vocab-size" if vocab_size is not None else "--input-dtype"
        raise WorkloadError(
            f"{flag} describes the input of a package.module:factory model; {name!r} brings its own input "
            "(drop the flag)"
        )
    if user and imgsz is not None:
        raise WorkloadError(
            f"model {name!r} is a user factory: give its per-sample input with --input-shape (or --seq-len N "
            "--vocab-size V for token ids); --imgsz is for the image models"
        )
    token_models = ("gpt2-small",)
    if seq_len is not None and not user and not name.startswith("hf:") and name not in token_models:
        raise WorkloadError(f"--seq-len is for token models (gpt2-small, hf:, a factory); {name!r} takes images")
    if imgsz is not None and (name.startswith("hf:") or name in token_models):
        raise WorkloadError(f"--imgsz is for image models; {name!r} takes token ids (use --seq-len)")


def _library_workload(
    name: str, prefix: str, *, imgsz: int | None, input_shape: tuple[int, ...] | None, seq_len: int | None
) -> Workload:
    target = name[len(prefix):]
    if not target:
        raise WorkloadError(f"model {name!r} names no model after {prefix!r} (e.g. {prefix}{_EXAMPLES[prefix]})")
    if prefix == "timm:":
        from torchkit.workloads.image_models import timm_workload

        workload = timm_workload(name, target, imgsz=imgsz, input_shape=input_shape)
    elif prefix == "torchvision:":
        from torchkit.workloads.image_models import torchvision_workload

        workload = torchvision_workload(name, target, imgsz=imgsz, input_shape=input_shape)
    elif prefix == "hf:":
        from torchkit.workloads.hf_models import hf_workload

        workload = hf_workload(name, target, seq_len=seq_len, input_shape=input_shape)
    else:
        from torchkit.workloads.ultralytics_models import ultralytics_workload

        workload = ultralytics_workload(name, target, imgsz=imgsz, input_shape=input_shape)
    check_model(model_template(workload), workload)
    return workload


_EXAMPLES = {"timm:": "resnet18", "torchvision:": "mobilenet_v3_small", "hf:": "gpt2", "ultralytics:": "yolov8n.yaml"}


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
        raise WorkloadError(f"model factory of {workload.name!r} returned {type(model).__name__}, not an nn.Module")
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
            fix = "it takes floating-point inputs: drop --vocab-size and give --input-shape (and --input-dtype)"
        else:
            fix = "give the dtype it expects with --input-dtype"
        return f"model {workload.name!r} cannot take input dtype {inputs.dtype} ({inputs.describe()}): {cause} ({fix})"
    return (
        f"model {workload.name!r} cannot take input shape {inputs.shape} per sample ({inputs.describe()}): {cause} "
        "(give the shape the model's first layer expects with --input-shape)"
    )


def workload_fingerprint(workload: Workload) -> str:
    """Content key of a workload (model structure, parameter shapes/dtypes, input, config), 16 hex digits.

    The model is the template (built on the meta device where it can be), so this costs little memory.
    Two workloads with the same key train the same architecture on the same input; the key is what
    profile caches are indexed by.
    """
    model = model_template(workload)
    params = [(n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    buffers = [(n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    text = repr((str(model), params, buffers, tuple(workload.sample_shape), workload.config))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = [
    "DEFAULT_IMGSZ",
    "DEFAULT_SEQ_LEN",
    "INPUT_DTYPES",
    "LIBRARY_PREFIXES",
    "USER_INPUT_LOSS",
    "InputSpec",
    "call_model",
    "model_template",
    "WORKLOAD_NAMES",
    "Workload",
    "check_model",
    "get_workload",
    "workload_fingerprint",
]
