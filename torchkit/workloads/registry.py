"""The one list of model sources: the built-in workloads (name, input, default size, factory) and the library
prefixes of the ``[models]`` extra. ``--model``'s help, the unknown-name error, the defaults of
``get_workload`` and the calibration data's check of its model names all read it.

Pure Python, no torch: the CLI imports it to write its help, and factories are named as
``module:function`` strings, imported only when a workload is built (``torchkit.workloads.builtin``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

InputKind = Literal["image", "tokens"]


@dataclass(frozen=True, kw_only=True)
class BuiltinModel:
    """A built-in workload: plain torch, in this package, trained on random inputs."""

    name: str
    """what ``--model`` takes, e.g. ``resnet50``"""
    family: Literal["classifier", "vit", "yolo", "gpt2"]
    """how its workload is put together (loss, batch, size checks): ``torchkit.workloads.builtin``"""
    input: InputKind
    """square RGB images (``--imgsz``) or token ids (``--seq-len``)"""
    default_size: int
    """image side in pixels, or sequence length in tokens, when none is given"""
    factory: str
    """``module:function`` building the model (image models that depend on the size take it as argument)"""
    factory_args: tuple[str, ...] = ()
    """fixed arguments of the factory (the YOLO variant)"""


@dataclass(frozen=True, kw_only=True)
class LibrarySource:
    """A model source of the ``[models]`` extra: ``PREFIX`` + what the library calls the model."""

    prefix: str
    """``timm:``, ``torchvision:``, ``hf:``, ``ultralytics:``"""
    distribution: str
    """the installed distribution whose version is part of a model's fingerprint"""
    forms: tuple[str, ...]
    """how the source is written, for help and errors (``hf:ARCH``, ``hf:config.json``)"""
    example: str
    """a model that exists, for the error when none is named"""
    input: InputKind
    builder: str
    """``module:function`` making the workload (``torchkit.workloads.image_models:timm_workload``)"""


_RESNETS = "torchkit.workloads.resnet"
BUILTINS: tuple[BuiltinModel, ...] = (
    BuiltinModel(
        name="resnet18", family="classifier", input="image", default_size=224, factory=f"{_RESNETS}:resnet18"
    ),
    BuiltinModel(
        name="resnet50", family="classifier", input="image", default_size=224, factory=f"{_RESNETS}:resnet50"
    ),
    BuiltinModel(
        name="resnext101-32x4d",
        family="classifier",
        input="image",
        default_size=224,
        factory=f"{_RESNETS}:resnext101_32x4d",
    ),
    BuiltinModel(
        name="se-resnext101-32x4d",
        family="classifier",
        input="image",
        default_size=224,
        factory=f"{_RESNETS}:se_resnext101_32x4d",
    ),
    BuiltinModel(
        name="yolo-n",
        family="yolo",
        input="image",
        default_size=640,
        factory="torchkit.workloads.yolo:yolo_detector",
        factory_args=("n",),
    ),
    BuiltinModel(
        name="yolo-s",
        family="yolo",
        input="image",
        default_size=640,
        factory="torchkit.workloads.yolo:yolo_detector",
        factory_args=("s",),
    ),
    BuiltinModel(
        name="vit-b16",
        family="vit",
        input="image",
        default_size=224,
        factory="torchkit.workloads.vit:vit_b16",
    ),
    BuiltinModel(
        name="gpt2-small",
        family="gpt2",
        input="tokens",
        default_size=1024,
        factory="torchkit.workloads.gpt2:gpt2_small",
    ),
)
LIBRARY_SOURCES: tuple[LibrarySource, ...] = (
    LibrarySource(
        prefix="timm:",
        distribution="timm",
        forms=("timm:NAME",),
        example="resnet18",
        input="image",
        builder="torchkit.workloads.image_models:timm_workload",
    ),
    LibrarySource(
        prefix="torchvision:",
        distribution="torchvision",
        forms=("torchvision:NAME",),
        example="mobilenet_v3_small",
        input="image",
        builder="torchkit.workloads.image_models:torchvision_workload",
    ),
    LibrarySource(
        prefix="hf:",
        distribution="transformers",
        forms=("hf:ARCH", "hf:config.json"),
        example="gpt2",
        input="tokens",
        builder="torchkit.workloads.hf_models:hf_workload",
    ),
    LibrarySource(
        prefix="ultralytics:",
        distribution="ultralytics",
        forms=("ultralytics:FILE.yaml",),
        example="yolov8n.yaml",
        input="image",
        builder="torchkit.workloads.ultralytics_models:ultralytics_workload",
    ),
)
USER_FORM = "package.module:factory"

WORKLOAD_NAMES: tuple[str, ...] = tuple(b.name for b in BUILTINS)
"""the built-in workload names, in the order help and errors show them"""
LIBRARY_PREFIXES: tuple[str, ...] = tuple(s.prefix for s in LIBRARY_SOURCES)
"""model sources of the ``[models]`` extra; they take precedence over ``package.module:factory``"""
DEFAULT_IMGSZ: dict[str, int] = {b.name: b.default_size for b in BUILTINS if b.input == "image"}
"""built-in image model -> its default square image size"""
DEFAULT_SEQ_LEN: int = next(b.default_size for b in BUILTINS if b.name == "gpt2-small")
"""gpt2-small's default sequence length (its context)"""


def builtin_model(name: str) -> BuiltinModel | None:
    """The built-in called ``name``, or None."""
    return next((b for b in BUILTINS if b.name == name), None)


def library_source(name: str) -> LibrarySource | None:
    """The library source a model name starts with (``timm:resnet18`` -> timm), or None."""
    return next((s for s in LIBRARY_SOURCES if name.startswith(s.prefix)), None)


def is_user_factory(name: str) -> bool:
    """``package.module:factory``: a colon, and no library prefix."""
    return ":" in name and library_source(name) is None


def takes_tokens(name: str) -> bool:
    """Whether the model named ``name`` (built-in or library; not a user factory) takes token ids."""
    builtin = builtin_model(name)
    source = library_source(name)
    kind = builtin.input if builtin is not None else source.input if source is not None else None
    return kind == "tokens"


def other_sources() -> str:
    """The model sources besides the built-in names, as help and errors write them."""
    forms = [form for s in LIBRARY_SOURCES for form in s.forms]
    return ", ".join(forms) + f", {USER_FORM}"


def model_help() -> str:
    """``--model``'s help text."""
    forms = [form for s in LIBRARY_SOURCES for form in s.forms]
    return f"workload name ({', '.join(WORKLOAD_NAMES)}), {', '.join(forms)}, or {USER_FORM}"
