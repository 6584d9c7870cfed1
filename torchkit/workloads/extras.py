"""Importing an optional model library (timm, transformers, ultralytics, torchvision) when a model source
needs it, with a one-line error naming the extra when it is missing or cannot import.

The libraries are the ``[models]`` extra (``pip install -e '.[models]'``); nothing imports them until a
``timm:``/``hf:``/``ultralytics:``/``torchvision:`` model is asked for.

timm and Ultralytics need torchvision (timm imports it, Ultralytics reads its version). PyPI's x86_64
torchvision wheels are CUDA builds: beside a CPU build of torch their C++ operators do not load and
``import torchvision`` fails with ``operator torchvision::nms does not exist``; transformers then fails too,
since it imports torchvision whenever it is installed. The error says so and what to do.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
from types import ModuleType

from torchkit.errors import WorkloadError

EXTRA_HINT = "pip install -e '.[models]'"

TORCHVISION_HINT = (
    "install the torchvision build that matches your torch (a CUDA torch takes PyPI's torchvision; a CPU torch "
    "needs a CPU torchvision), or pip uninstall torchvision where the library does not need it"
)


def import_library(module: str, *, model: str) -> ModuleType:
    """``import module`` for ``model``, with its stdout sent to stderr (Ultralytics prints its settings
    banner there, and stdout carries only results).

    Raises:
        WorkloadError: the library is not installed (names the extra) or fails to import (names the cause;
            for torchvision trouble, the fix).
    """
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing == module.split(".")[0]:
            fix = TORCHVISION_HINT if missing == "torchvision" else EXTRA_HINT
            raise WorkloadError(f"model {model!r} needs {missing}, which is not installed ({fix})") from e
        if missing == "torchvision":
            raise WorkloadError(
                f"model {model!r}: {module.split('.')[0]} needs torchvision, which is not installed ({TORCHVISION_HINT})"
            ) from e
        raise WorkloadError(
            f"model {model!r}: importing {module} failed: {e} (pip install {missing}, or {EXTRA_HINT})"
        ) from e
    except importlib.metadata.PackageNotFoundError as e:  # Ultralytics reads torchvision's version at import
        raise WorkloadError(
            f"model {model!r}: {module.split('.')[0]} needs the package {e.args[0] if e.args else '?'}, which is "
            f"not installed ({TORCHVISION_HINT if 'torchvision' in str(e) else EXTRA_HINT})"
        ) from e
    except Exception as e:  # a library that is installed but broken: say which and why
        library = module.split(".")[0]
        cause = _torchvision_trouble()
        if cause:
            raise WorkloadError(f"model {model!r}: {library} cannot import: {cause} ({TORCHVISION_HINT})") from e
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise WorkloadError(
            f"model {model!r}: {library} is installed but cannot import: {type(e).__name__}: {text} "
            f"(reinstall it: {EXTRA_HINT})"
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

        return f"torchvision {version} cannot import beside torch {torch.__version__} ({type(e).__name__}: {e})"
    return ""
