"""Importing is cheap and complete: every module imports; ``import planner`` pulls in neither torch, Ray nor
pynvml; every public torchkit name resolves without initialising CUDA or NVML."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import planner
import torchkit


def _modules(package) -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."))


@pytest.mark.parametrize("name", _modules(planner) + _modules(torchkit))
def test_every_module_imports(name):
    importlib.import_module(name)


def _run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_public_torchkit_name_resolves_without_initialising_cuda_or_nvml():
    _run(
        "import sys, torchkit\n"
        "missing = [n for n in torchkit.__all__ if getattr(torchkit, n, None) is None]\n"
        "assert not missing, missing\n"
        "import torch\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised by an import'\n"
        # torch.cuda imports the pynvml module when it is installed; what must not happen is NVML's init
        "nvml = sys.modules.get('pynvml')\n"
        "assert nvml is None or nvml._nvmlLib_refcount == 0, 'NVML initialised by an import'\n"
    )


def test_the_planner_core_imports_neither_torch_ray_nor_pynvml():
    _run(
        "import sys\n"
        "import planner, planner.job, planner.profiles.profile, planner.allocate.solver, planner.allocate.advice, planner.plan.build\n"
        "import planner.cluster\n"
        "import planner.preflight, planner.profiles.cache, planner.errors, planner.runtime\n"
        "heavy = [m for m in ('torch', 'ray', 'pynvml') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
