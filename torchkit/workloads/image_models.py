"""Image classifiers from timm (``timm:NAME``) and torchvision (``torchvision:NAME``), built with fresh
weights (``pretrained=False`` / ``weights=None``: nothing is downloaded), trained with cross-entropy on
random images and class ids.

The image size is the model's own default (timm's pretrained config, 224 for torchvision) unless
``--imgsz`` or ``--input-shape 3,H,W`` says otherwise; timm models that take ``img_size`` (ViTs) are built
for that size.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

import torch

from torchkit.errors import WorkloadError
from torchkit.workloads.extras import import_library
from torchkit.workloads.inputs import classification_loss

TORCHVISION_IMGSZ = 224
"""torchvision's classification weights are trained at 224 (``weights.transforms()``)"""
TORCHVISION_NUM_CLASSES = 1000
"""ImageNet-1k, torchvision's default ``num_classes``"""


def image_size(
    model: str, default: tuple[int, int], imgsz: int | None, input_shape: tuple[int, ...] | None
) -> tuple[int, int]:
    """(H, W) from ``--imgsz`` / ``--input-shape 3,H,W`` or the model's default."""
    if input_shape is not None:
        shape = tuple(int(d) for d in input_shape)
        if len(shape) != 3 or shape[0] != 3:
            raise WorkloadError(
                f"model {model!r} takes RGB images: use --input-shape 3,H,W or --imgsz N, not {shape}"
            )
        if imgsz is not None and shape[1:] != (imgsz, imgsz):
            raise WorkloadError(
                f"model {model!r}: --imgsz {imgsz} and --input-shape {shape} disagree (give one)"
            )
        return shape[1], shape[2]
    return (int(imgsz), int(imgsz)) if imgsz is not None else default


def classifier_workload(
    *,
    name: str,
    size: tuple[int, int],
    num_classes: int,
    build: Callable[[], torch.nn.Module],
    description: str,
):
    """A ``Workload`` training an image classifier with cross-entropy."""
    from torchkit.workloads.workload import Workload

    height, width = size
    return Workload(
        name=name,
        sample_shape=(3, height, width),
        build_model=build,
        make_batch=lambda b: (torch.randn(b, 3, height, width), torch.randint(0, num_classes, (b,))),
        loss_fn=classification_loss,
        config=f"classes={num_classes}",
        description=description,
    )


def timm_workload(spec: str, name: str, *, imgsz: int | None, input_shape: tuple[int, ...] | None):
    """``timm:NAME``: ``timm.create_model(NAME, pretrained=False)``."""
    timm = import_library("timm", model=spec)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        raise WorkloadError(
            f"timm has no model {name!r} ({'did you mean ' + ', '.join(close) + '? ' if close else ''}"
            "timm.list_models() lists them)"
        )
    cfg = timm.models.get_pretrained_cfg(name)
    default_size = tuple(cfg.input_size[1:]) if cfg is not None and cfg.input_size else (224, 224)
    num_classes = int(cfg.num_classes) if cfg is not None and cfg.num_classes else 1000
    size = image_size(spec, default_size, imgsz, input_shape)

    def build() -> torch.nn.Module:
        kwargs = {"pretrained": False, "num_classes": num_classes}
        if size != default_size:
            try:  # ViTs and other fixed-grid models are built for the size; CNNs take any size as they are
                return timm.create_model(name, img_size=size, **kwargs)
            except TypeError:
                pass
        return timm.create_model(name, **kwargs)

    return classifier_workload(
        name=spec,
        size=size,
        num_classes=num_classes,
        build=build,
        description=f"timm {name} at {size[0]}x{size[1]}, {num_classes} classes, cross-entropy (fresh weights)",
    )


def torchvision_workload(spec: str, name: str, *, imgsz: int | None, input_shape: tuple[int, ...] | None):
    """``torchvision:NAME``: ``torchvision.models.get_model(NAME, weights=None)`` (classification models)."""
    models = import_library("torchvision.models", model=spec)
    known = models.list_models(module=models)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        raise WorkloadError(
            f"torchvision has no classification model {name!r} "
            f"({'did you mean ' + ', '.join(close) + '? ' if close else ''}torchvision.models.list_models() lists them)"
        )
    size = image_size(spec, (TORCHVISION_IMGSZ, TORCHVISION_IMGSZ), imgsz, input_shape)
    return classifier_workload(
        name=spec,
        size=size,
        num_classes=TORCHVISION_NUM_CLASSES,
        build=lambda: models.get_model(name, weights=None),
        description=f"torchvision {name} at {size[0]}x{size[1]}, {TORCHVISION_NUM_CLASSES} classes, cross-entropy "
        "(fresh weights)",
    )
