"""The built-in workloads (``torchkit.workloads.registry.BUILTINS``) as ``Workload``s: ResNets and ResNeXts
(``resnet``), ViT-B/16 (``vit``), YOLO-like detectors (``yolo``) and GPT-2 small (``gpt2``), plain torch,
at the size asked for or the registry's default."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from torchkit.errors import WorkloadError
from torchkit.workloads.registry import BuiltinModel
from torchkit.workloads.workload import Workload


def builtin_workload(
    entry: BuiltinModel, *, imgsz: int | None, input_shape: tuple[int, ...] | None, seq_len: int | None
) -> Workload:
    """The workload of the built-in ``entry`` (options already checked against its input kind)."""
    if entry.family == "gpt2":
        return _gpt2_workload(entry, seq_len, input_shape)
    return _image_workload(entry, _image_size(entry, imgsz, input_shape))


def _factory(entry: BuiltinModel, *args: object) -> Callable[[], torch.nn.Module]:
    """The entry's model factory with its fixed arguments (and ``args``), called with none."""
    module_name, _, function = entry.factory.partition(":")
    build = getattr(importlib.import_module(module_name), function)
    return functools.partial(build, *entry.factory_args, *args) if entry.factory_args or args else build


def _image_workload(entry: BuiltinModel, size: int) -> Workload:
    """A built-in image model at ``size``×``size``."""
    from torchkit.workloads import resnet

    name = entry.name
    if entry.family in ("classifier", "vit"):
        if entry.family == "classifier":
            build, title = _factory(entry), name
        else:
            from torchkit.workloads import vit

            if size % vit.PATCH_SIZE:
                raise WorkloadError(
                    f"{name} needs an image size divisible by 16, got {size} (use e.g. --imgsz 224)"
                )
            build, title = _factory(entry, size), "ViT-B/16"
        return Workload(
            name=name,
            sample_shape=(3, size, size),
            build_model=build,
            make_batch=functools.partial(resnet.make_image_classification_batch, imgsz=size),
            loss_fn=resnet.classification_loss,
            description=f"{title} at {size}, 1000 classes, cross-entropy",
        )
    from torchkit.workloads import yolo

    if size % max(yolo.STRIDES):
        raise WorkloadError(f"{name} needs an image size divisible by 32, got {size} (use e.g. --imgsz 640)")
    variant = entry.factory_args[0]
    return Workload(
        name=name,
        sample_shape=(3, size, size),
        build_model=_factory(entry),
        make_batch=functools.partial(yolo.make_detection_batch, imgsz=size),
        loss_fn=yolo.detection_loss,
        config=f"max_obj={yolo.MAX_OBJ},nc={yolo.NUM_CLASSES}",
        description=f"YOLO-like {variant} at {size}, {yolo.NUM_CLASSES} classes, {yolo.MAX_OBJ} boxes/image, "
        "dense TAL assigner loss",
    )


def _image_size(entry: BuiltinModel, imgsz: int | None, input_shape: tuple[int, ...] | None) -> int:
    name = entry.name
    size = entry.default_size if imgsz is None else int(imgsz)
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


def _gpt2_workload(entry: BuiltinModel, seq_len: int | None, input_shape: tuple[int, ...] | None) -> Workload:
    from torchkit.workloads import gpt2

    name = entry.name
    if input_shape is not None:
        if len(input_shape) != 1:
            raise WorkloadError(
                f"{name} takes token sequences, input shape {tuple(input_shape)} does not fit "
                f"(use --seq-len N or --input-shape N, N <= {gpt2.MAX_POSITIONS})"
            )
        if seq_len is not None and int(input_shape[0]) != seq_len:
            raise WorkloadError(
                f"{name}: --seq-len {seq_len} and --input-shape {tuple(input_shape)} disagree"
            )
        seq_len = int(input_shape[0])
    length = entry.default_size if seq_len is None else int(seq_len)
    if not 1 <= length <= gpt2.MAX_POSITIONS:
        raise WorkloadError(
            f"{name}: sequence length {length} is outside 1..{gpt2.MAX_POSITIONS} (use --seq-len {entry.default_size})"
        )
    return Workload(
        name=name,
        sample_shape=(length,),
        build_model=_factory(entry),
        make_batch=functools.partial(gpt2.make_token_batch, seq_len=length),
        loss_fn=gpt2.next_token_loss,
        description=f"GPT-2 small (124M), sequence length {length}, next-token cross-entropy",
    )
