"""torch version flags: ``TORCH_2_0`` and friends mean "the installed torch is at least that version".

Code that needs an API of a given torch release checks these flags instead of parsing ``torch.__version__``
again. Importing this module imports torch (the flags are read from ``torch.__version__``), so torchkit's
lazy ``__init__`` only loads it when a flag is asked for.
"""

from __future__ import annotations

import re

import torch

__all__ = [
    "TORCH_1_9",
    "TORCH_1_10",
    "TORCH_1_11",
    "TORCH_1_13",
    "TORCH_2_0",
    "TORCH_2_1",
    "TORCH_2_2",
    "TORCH_2_3",
    "TORCH_2_4",
    "TORCH_2_5",
    "TORCH_2_7",
    "TORCH_2_8",
    "TORCH_2_9",
    "TORCH_2_13",
    "check_torch_version",
    "release_tuple",
]

_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def release_tuple(version: str) -> tuple[int, ...]:
    """The numeric release part of a version string: ``"2.13.0+cpu"`` → ``(2, 13, 0)``.

    Pre-release, dev and local parts are ignored (``"2.5.0a0+git123"`` → ``(2, 5, 0)``), as in the seed's
    ``check_version``: a nightly of 2.5 has the 2.5 APIs the flags guard.

    Raises:
        ValueError: the string does not start with a number.
    """
    match = _RELEASE.match(version)
    if match is None:
        raise ValueError(f"cannot read a version number from {version!r} (expected e.g. '2.4.1')")
    return tuple(int(part) for part in match.group(1).split("."))


def check_torch_version(current: str | None = None, minimum: str = "0.0.0") -> bool:
    """Whether ``current`` (default: the installed torch) is at least ``minimum``.

    Versions compare by their release numbers, padded with zeros: ``"2.4" >= "2.4.0"`` is true.
    """
    current_release = release_tuple(torch.__version__ if current is None else current)
    minimum_release = release_tuple(minimum)
    width = max(len(current_release), len(minimum_release))
    pad = (0,) * width
    return (current_release + pad)[:width] >= (minimum_release + pad)[:width]


TORCH_1_9 = check_torch_version(minimum="1.9.0")
TORCH_1_10 = check_torch_version(minimum="1.10.0")
TORCH_1_11 = check_torch_version(minimum="1.11.0")
TORCH_1_13 = check_torch_version(minimum="1.13.0")
TORCH_2_0 = check_torch_version(minimum="2.0.0")
TORCH_2_1 = check_torch_version(minimum="2.1.0")
TORCH_2_2 = check_torch_version(minimum="2.2.0")
TORCH_2_3 = check_torch_version(minimum="2.3.0")
TORCH_2_4 = check_torch_version(minimum="2.4.0")
TORCH_2_5 = check_torch_version(minimum="2.5.0")
TORCH_2_7 = check_torch_version(minimum="2.7.0")
TORCH_2_8 = check_torch_version(minimum="2.8.0")
TORCH_2_9 = check_torch_version(minimum="2.9.0")
TORCH_2_13 = check_torch_version(minimum="2.13.0")
