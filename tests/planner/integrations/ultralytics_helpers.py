"""Shared pieces of the Ultralytics trainer tests: the tiny dataset they write, the training settings that make
a run deterministic and cheap, the environment that keeps Ultralytics off the network, and the skip (with its
reason) where Ultralytics cannot import.

Nothing is downloaded: the model is built from Ultralytics' own ``yolov8n.yaml``, the dataset is written here,
``plots=False`` (no font), ``YOLO_OFFLINE=1`` (no connectivity probe, no analytics) and ``YOLO_CONFIG_DIR`` a
temporary directory (Ultralytics' settings file; its Ray Tune callback off).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("ultralytics_worker.py")

#: one image, written under many names: Ultralytics' detection losses normalise each rank's loss by that
#: rank's own target-score sum, so a DDP step equals the single-process step over the same images only when
#: those sums are in proportion to the ranks' batches (true of Ultralytics' own even split too); identical
#: images make them so. Which image each rank took is checked by name (``im_file``).
IMAGE_SIDE = 64
#: four overlapping boxes over the quadrants: on a fresh model their target scores sum to about 2.7 an image, so
#: no rank's sum is clamped to 1 (``target_scores.sum().clamp_(min=1)``, which would break the proportion)
LABELS = "0 0.35 0.35 0.6 0.6\n1 0.65 0.65 0.6 0.6\n0 0.35 0.65 0.6 0.6\n1 0.65 0.35 0.6 0.6\n"

#: a run whose augmentation changes nothing (no mosaic, flips, HSV, affine), with AMP and plots off, SGD, no
#: warm-up, one epoch; nbs 20 over a global batch of 10 makes accumulate 2 on every rank (a rank taking its own
#: batch would take round(20 / b_i) instead); a weight decay large enough to show; loss gains small enough that
#: Ultralytics' gradient clipping (norm 10) never acts, so that a scaled gradient stays visible
TRAIN_SETTINGS: dict = {
    "model": "yolov8n.yaml",
    "imgsz": IMAGE_SIDE,
    "epochs": 1,
    "workers": 0,
    "seed": 0,
    "deterministic": True,
    "amp": False,
    "mosaic": 0.0,
    "mixup": 0.0,
    "cutmix": 0.0,
    "copy_paste": 0.0,
    "fliplr": 0.0,
    "flipud": 0.0,
    "hsv_h": 0.0,
    "hsv_s": 0.0,
    "hsv_v": 0.0,
    "degrees": 0.0,
    "translate": 0.0,
    "scale": 0.0,
    "shear": 0.0,
    "perspective": 0.0,
    "close_mosaic": 0,
    "multi_scale": 0.0,
    "optimizer": "SGD",
    "lr0": 0.01,
    "momentum": 0.9,
    "weight_decay": 0.05,
    "warmup_epochs": 0,
    "nbs": 20,
    "box": 0.05,
    "cls": 0.05,
    "dfl": 0.05,
    "plots": False,
    "val": False,
    "verbose": False,
    "exist_ok": True,
}


def require_ultralytics() -> None:
    """Skip, with the one-line reason, where the planned trainer cannot import Ultralytics (not installed, or
    beside a torchvision that does not load: CI's main venv). CI's "torch unpinned" stage runs these tests and
    fails if any skips."""
    from planner.integrations.ultralytics import UltralyticsUnavailableError, trainer_class

    try:
        trainer_class("detect")
    except UltralyticsUnavailableError as e:
        pytest.skip(str(e))


def write_dataset(root: Path, train_images: int, val_images: int = 2) -> Path:
    """A YOLO detection dataset of identical images under distinct names; returns its data.yaml."""
    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(0).random((IMAGE_SIDE, IMAGE_SIDE, 3)) * 255).astype(np.uint8)
    for split, count in (("train", train_images), ("val", val_images)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(pixels).save(root / "images" / split / f"im{i:03d}.png")
            (root / "labels" / split / f"im{i:03d}.txt").write_text(LABELS)
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n  1: b\n")
    return data


def child_env(config_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that runs Ultralytics: offline, its settings in ``config_dir``, one thread
    per process (three ranks share two cores), no GPU, no launcher variables of ours."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE"}
    }
    env.update(
        YOLO_OFFLINE="1",
        YOLO_CONFIG_DIR=str(config_dir),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        **extra,
    )
    return env
