"""The optional libraries of the integrations: each is imported only by its own integration, at that module's
top (so the layering contracts see it), and a missing one is one line naming the pip command, never a
traceback from deep inside an import::

    try:
        import transformers
    except Exception as exc:
        raise missing_library(exc, "transformers", integration=__name__, pip=PIP) from None
"""

from __future__ import annotations

from planner.errors import UserError

__all__ = ["MissingLibraryError", "missing_library"]


class MissingLibraryError(UserError, ImportError):
    """An integration's library is not installed, or is installed but cannot be imported."""


def missing_library(exc: BaseException, library: str, *, integration: str, pip: str) -> MissingLibraryError:
    """The one-line error for ``library`` failing to import in ``integration``.

    Args:
        exc: what the import raised.
        library: the top-level package (``"transformers"``, ``"lightning"``).
        integration: who needs it, for the message (``"planner.integrations.huggingface"``).
        pip: the requirement(s) to install, as a user types them (``"'transformers>=4.45' 'accelerate>=0.26'"``).

    A library that is installed but fails to import (transformers beside a torchvision built for another
    torch) is named with the first line of the error at the root of the chain (transformers' lazy modules wrap
    it in their own), since installing the library again would not help.
    """
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing is not None and missing.split(".")[0] == library:
        return MissingLibraryError(
            f"{integration} needs {library}, which is not installed (pip install {pip})"
        )
    root = _root_cause(exc)
    first_line = (str(root).strip().splitlines() or [type(root).__name__])[0][:300]
    return MissingLibraryError(
        f"{integration} needs {library}, which is installed but fails to import: "
        f"{type(root).__name__}: {first_line} (fix or reinstall the package it names)"
    )


def _root_cause(exc: BaseException) -> BaseException:
    """The first exception of ``exc``'s chain (its cause, or the one it was raised while handling)."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or exc.__context__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner
