"""Shared fixtures: environment restored after each test; one local Ray cluster per test run."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests may set CUDA_VISIBLE_DEVICES, RANK, ...; put the environment back afterwards."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
