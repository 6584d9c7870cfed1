"""torchkit.workloads.registry: the one list of model sources, read by the CLI help, the errors, the defaults and
the calibration data's check; importable without torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from torchkit.errors import WorkloadError
from torchkit.estimate.calibration.data import CALIBRATION_MODELS
from torchkit.workloads import DEFAULT_IMGSZ, DEFAULT_SEQ_LEN, LIBRARY_PREFIXES, WORKLOAD_NAMES, get_workload
from torchkit.workloads.registry import (
    BUILTINS,
    LIBRARY_SOURCES,
    builtin_model,
    is_user_factory,
    library_source,
    model_help,
    takes_tokens,
)


def test_the_registry_imports_without_torch():
    code = "import sys, torchkit.workloads.registry, torchkit.workloads; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_factory_and_builder_the_registry_names_exists():
    for entry in BUILTINS:
        module, _, function = entry.factory.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), entry.name
    for source in LIBRARY_SOURCES:
        module, _, function = source.builder.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), source.prefix


def test_the_names_and_defaults_come_from_the_registry():
    assert tuple(b.name for b in BUILTINS) == WORKLOAD_NAMES
    assert len(set(WORKLOAD_NAMES)) == len(WORKLOAD_NAMES)
    assert LIBRARY_PREFIXES == ("timm:", "torchvision:", "hf:", "ultralytics:")
    assert DEFAULT_IMGSZ == {
        "resnet18": 224,
        "resnet50": 224,
        "resnext101-32x4d": 224,
        "se-resnext101-32x4d": 224,
        "yolo-n": 640,
        "yolo-s": 640,
        "vit-b16": 224,
    }
    assert DEFAULT_SEQ_LEN == 1024
    assert get_workload("yolo-n").sample_shape == (3, 640, 640)
    assert get_workload("gpt2-small").sample_shape == (1024,)
    assert CALIBRATION_MODELS == WORKLOAD_NAMES


def test_the_model_help_and_the_unknown_name_error_list_every_source():
    text = model_help()
    for name in WORKLOAD_NAMES:
        assert name in text
    for form in (
        "timm:NAME",
        "torchvision:NAME",
        "hf:ARCH",
        "hf:config.json",
        "ultralytics:FILE.yaml",
        "package.module:factory",
    ):
        assert form in text
    with pytest.raises(
        WorkloadError, match=r"unknown workload 'resnet51' \(known: resnet18, .*gpt2-small; or timm:NAME"
    ):
        get_workload("resnet51")


@pytest.mark.parametrize(
    ("name", "builtin", "library", "user", "tokens"),
    [
        ("resnet50", True, None, False, False),
        ("gpt2-small", True, None, False, True),
        ("hf:gpt2", False, "hf:", False, True),
        ("timm:vit_base_patch16_224", False, "timm:", False, False),
        ("mypkg.models:net", False, None, True, False),
    ],
)
def test_a_name_is_classified_by_its_source(name, builtin, library, user, tokens):
    assert (builtin_model(name) is not None) == builtin
    source = library_source(name)
    assert (source.prefix if source else None) == library
    assert is_user_factory(name) == user
    assert takes_tokens(name) == tokens
