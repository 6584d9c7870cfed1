"""torchkit.versions: release parsing, version comparison and the TORCH_x_y flags."""

from __future__ import annotations

import pytest
import torch

from torchkit import versions
from torchkit.versions import check_torch_version, release_tuple


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("2.5.0a0+git1234abc", (2, 5, 0)),
        ("2.6.0.dev20241112+cu124", (2, 6, 0)),  # ".dev" ends the release part
        ("1.10", (1, 10)),
        ("v2.4.1", (2, 4, 1)),
    ],
)
def test_release_tuple_reads_the_numeric_release(text, expected):
    assert release_tuple(text) == expected


def test_release_tuple_rejects_text_without_a_number():
    with pytest.raises(ValueError, match="cannot read a version number from 'nightly'"):
        release_tuple("nightly")


@pytest.mark.parametrize(
    ("current", "minimum", "expected"),
    [
        ("2.4.0", "2.4", True),  # padded with zeros
        ("2.4", "2.4.0", True),
        ("2.3.1", "2.4.0", False),
        ("1.10.0", "1.9.0", True),  # numeric, not lexicographic
        ("2.5.0a0+git", "2.5.0", True),  # a pre-release of 2.5 has the 2.5 APIs
        ("2.13.0+cpu", "2.13.0", True),
        ("2.12.9", "2.13.0", False),
    ],
)
def test_check_torch_version_compares_release_numbers(current, minimum, expected):
    assert check_torch_version(current, minimum) is expected


def test_check_torch_version_defaults_to_the_installed_torch():
    assert check_torch_version(minimum=torch.__version__) is True
    major, minor = release_tuple(torch.__version__)[:2]
    assert check_torch_version(minimum=f"{major}.{minor + 1}.0") is False


def test_flags_match_the_installed_torch():
    installed = release_tuple(torch.__version__)
    for name in versions.__all__:
        if not name.startswith("TORCH_"):
            continue
        major, minor = (int(part) for part in name.removeprefix("TORCH_").split("_"))
        assert getattr(versions, name) is ((installed + (0, 0))[:2] >= (major, minor)), name


def test_flags_are_exported_lazily_by_torchkit():
    import torchkit

    assert torchkit.TORCH_2_0 is versions.TORCH_2_0
    assert torchkit.check_torch_version is check_torch_version
