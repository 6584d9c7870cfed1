"""Ultralytics detection models from the YAML files the package ships (``ultralytics:yolov8n.yaml``,
``ultralytics:yolo11s.yaml``) or from a path to one, built as ``ultralytics.nn.tasks.DetectionModel(yaml)``:
fresh weights, no download, no torchvision import (the model-building path only reads torchvision's version).

The loss is a shape-static stand-in. Ultralytics' ``v8DetectionLoss`` assigns targets with boolean masks
and a box count taken from the batch's data, which fake tensors cannot run. Instead the training step runs
:func:`torchkit.workloads.yolo.dense_detection_loss` on the model's real outputs: the same task-aligned
assignment, CIoU, BCE and DFL terms computed densely over ``[B, max_obj, A]`` (``max_obj`` = 100 boxes per
image, as the reference ``yolo-n`` workload), so its memory is that of the outputs plus a dense assigner,
an upper bound of Ultralytics' masked one while no image holds more boxes. What the step leaves out is
stated in the workload's notes and added as a margin: the trainer's ``ModelEMA``, a full copy of the
weights and buffers.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from torchkit.errors import WorkloadError
from torchkit.units import MIB
from torchkit.workloads.extras import import_library

DEFAULT_IMGSZ = 640
"""Ultralytics' default training size"""


def ultralytics_workload(
    spec: str, yaml_name: str, *, imgsz: int | None, input_shape: tuple[int, ...] | None
):
    """The workload of ``ultralytics:FILE.yaml`` at ``imgsz``."""
    from torchkit.workloads import yolo as dense
    from torchkit.workloads.workload import Workload

    tasks = import_library("ultralytics.nn.tasks", model=spec)
    cfg = _check_yaml(spec, yaml_name, tasks)
    size = _image_size(spec, imgsz, input_shape)

    def build() -> torch.nn.Module:
        with contextlib.redirect_stdout(sys.stderr):  # Ultralytics logs the model summary to stdout
            return tasks.DetectionModel(cfg, verbose=False)

    def loss(preds: Any, targets: Any) -> torch.Tensor:
        branches = [preds["one2many"], preds["one2one"]] if "one2one" in preds else [preds]
        total = 0
        for branch in branches:
            feats = branch["feats"]
            strides = tuple(size // int(f.shape[2]) for f in feats)
            total = total + dense.dense_detection_loss(
                branch["boxes"], branch["scores"], feats, targets, strides
            )
        return total

    with contextlib.redirect_stdout(sys.stderr):
        model_yaml = tasks.yaml_model_load(cfg)
    nc = int(model_yaml.get("nc", dense.NUM_CLASSES))
    # the YAML defines the network: part of the fingerprint (with ultralytics' version, torchkit.workloads.fingerprint)
    yaml_text = json.dumps(model_yaml, sort_keys=True, default=str)
    ema_bytes = _ema_bytes(build)
    return Workload(
        name=spec,
        sample_shape=(3, size, size),
        build_model=build,
        make_batch=lambda b: dense.make_detection_batch(b, size, nc=nc),
        loss_fn=loss,
        config=f"max_obj={dense.MAX_OBJ},nc={nc},loss=dense-tal,yaml={yaml_text}",
        description=f"Ultralytics {Path(yaml_name).name} at {size}, {nc} classes, {dense.MAX_OBJ} boxes/image, "
        "dense task-aligned assigner loss (stand-in for v8DetectionLoss)",
        notes=(
            f"{spec}: loss is a shape-static stand-in for Ultralytics' v8DetectionLoss (dense task-aligned "
            f"assigner over {dense.MAX_OBJ} boxes per image; a batch whose densest image holds more boxes needs "
            "more memory)",
            f"{spec}: margin of {ema_bytes / MIB:.1f} MiB added for the trainer's ModelEMA copy of the weights",
        ),
        margin_bytes=ema_bytes,
    )


def _check_yaml(spec: str, yaml_name: str, tasks) -> str:
    if not yaml_name.endswith((".yaml", ".yml")):
        raise WorkloadError(
            f"model {spec!r}: give a model YAML such as ultralytics:yolov8n.yaml (weights files are not loaded)"
        )
    try:
        with contextlib.redirect_stdout(sys.stderr):
            task = tasks.guess_model_task(tasks.yaml_model_load(yaml_name))
    except (FileNotFoundError, OSError) as e:
        raise WorkloadError(
            f"model {spec!r}: Ultralytics has no model YAML {yaml_name!r} ({e}; the files it ships are in "
            "ultralytics/cfg/models, e.g. yolov8n.yaml, yolo11n.yaml)"
        ) from e
    if task != "detect":
        raise WorkloadError(
            f"model {spec!r} is a {task} model; only detection YAMLs (task detect) are supported"
        )
    return yaml_name


def _image_size(spec: str, imgsz: int | None, input_shape: tuple[int, ...] | None) -> int:
    size = DEFAULT_IMGSZ if imgsz is None else int(imgsz)
    if input_shape is not None:
        shape = tuple(int(d) for d in input_shape)
        if len(shape) != 3 or shape[0] != 3 or shape[1] != shape[2]:
            raise WorkloadError(
                f"model {spec!r} takes square RGB images: use --imgsz N, not --input-shape {shape}"
            )
        size = shape[1]
    if size % 32 or size < 32:
        raise WorkloadError(
            f"model {spec!r} needs an image size divisible by 32 (its largest stride), got {size}"
        )
    return size


def _ema_bytes(build) -> int:
    from torchkit.workloads.construct import template_for

    model, _ = template_for(build)
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())
