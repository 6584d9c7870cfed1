"""Importing an optional model library (timm, transformers, ultralytics, torchvision) when a model source
needs it, with a one-line error naming the extra when it is missing or cannot import.

The libraries are the ``[models]`` extra of the ``batchplan`` distribution (pyproject.toml: timm,
transformers, ultralytics); nothing imports them until a ``timm:``/``hf:``/``ultralytics:``/``torchvision:``
model is asked for. The error's command is the one for how batchplan was installed (``extra_hint``): from a
wheel or an index ``pip install 'batchplan[models]'``, from a checkout in editable mode
``pip install -e '/path/to/checkout[models]'`` (its ``direct_url.json``, PEP 610).

timm and Ultralytics need torchvision (timm imports it, Ultralytics reads its version). PyPI's x86_64
torchvision wheels are CUDA builds: beside a CPU build of torch their C++ operators do not load and
``import torchvision`` fails with ``operator torchvision::nms does not exist``; transformers then fails too,
since it imports torchvision whenever it is installed. The error says so and what to do.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import json
import shlex
import sys
import urllib.parse
import urllib.request
from types import ModuleType

from torchkit.errors import WorkloadError

#: the distribution that declares the ``models`` extra (pyproject.toml ``[project] name``)
DISTRIBUTION = "batchplan"
EXTRA = "models"


@functools.cache
def extra_hint(extra: str = EXTRA) -> str:
    """The pip command that installs the ``[models]`` extra (or another ``extra``) for this install of batchplan:
    editable from a checkout (the checkout's path), else by name (a wheel, an index, or batchplan not installed
    at all)."""
    by_name = f"pip install {shlex.quote(f'{DISTRIBUTION}[{extra}]')}"
    try:
        direct = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        origin = json.loads(direct) if direct else {}
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return by_name
    url = origin.get("url", "") if isinstance(origin, dict) else ""
    editable = (
        isinstance(origin, dict)
        and isinstance(origin.get("dir_info"), dict)
        and origin["dir_info"].get("editable") is True
    )
    if editable and url.startswith("file:"):
        checkout = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
        return f"pip install -e {shlex.quote(f'{checkout}[{extra}]')}"
    return by_name


TORCHVISION_HINT = (
    "install the torchvision build that matches your torch (a CUDA torch takes PyPI's torchvision; a CPU torch "
    "needs a CPU torchvision), or pip uninstall torchvision where the library does not need it"
)


def import_library(module: str, *, model: str, subject: str | None = None, extra: str = EXTRA) -> ModuleType:
    """``import module`` for ``model``, with its stdout sent to stderr (Ultralytics prints its settings
    banner there, and stdout carries only results).

    Args:
        subject: what needs the library, as the message names it (default ``model 'NAME'``).
        extra: the extra whose install command a missing library's message gives.

    Raises:
        WorkloadError: the library is not installed (names the extra) or fails to import (names the cause;
            for torchvision trouble, the fix).
    """
    who = subject if subject is not None else f"model {model!r}"
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing == module.split(".")[0]:
            fix = TORCHVISION_HINT if missing == "torchvision" else extra_hint(extra)
            raise WorkloadError(f"{who} needs {missing}, which is not installed ({fix})") from e
        if missing == "torchvision":
            raise WorkloadError(
                f"{who}: {module.split('.')[0]} needs torchvision, which is not installed ({TORCHVISION_HINT})"
            ) from e
        raise WorkloadError(
            f"{who}: importing {module} failed: {e} (pip install {missing}, or {extra_hint(extra)})"
        ) from e
    except importlib.metadata.PackageNotFoundError as e:  # Ultralytics reads torchvision's version at import
        raise WorkloadError(
            f"{who}: {module.split('.')[0]} needs the package {e.args[0] if e.args else '?'}, which is "
            f"not installed ({TORCHVISION_HINT if 'torchvision' in str(e) else extra_hint(extra)})"
        ) from e
    except Exception as e:  # a library that is installed but broken: say which and why
        library = module.split(".")[0]
        cause = _torchvision_trouble()
        if cause:
            raise WorkloadError(f"{who}: {library} cannot import: {cause} ({TORCHVISION_HINT})") from e
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise WorkloadError(
            f"{who}: {library} is installed but cannot import: {type(e).__name__}: {text} "
            f"(reinstall it: {extra_hint(extra)})"
        ) from e


def _torchvision_trouble() -> str:
    """Why torchvision cannot import here, or "" when it imports (or is not installed)."""
    try:
        version = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        return ""
    try:
        importlib.import_module("torchvision")
    except Exception as e:
        import torch

        return (
            f"torchvision {version} cannot import beside torch {torch.__version__} ({type(e).__name__}: {e})"
        )
    return ""
