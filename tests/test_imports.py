"""Importing is cheap and complete, and the code keeps its shape: every module imports; ``import planner``
and the planner core pull in neither torch, Ray nor pynvml; every public torchkit name resolves without
initialising CUDA or NVML; no private name crosses a module.
(The layering and the absence of import cycles are import-linter's contracts, ``lint-imports`` in .ci/run.)"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import planner
import torchkit

REPO = Path(__file__).resolve().parents[1]
#: the code whose shape is checked: the packages, the benches and the examples (tests are exempt)
SOURCES = sorted(p for d in ("planner", "torchkit", "cluster_configs", "bench", "examples") for p in (REPO / d).rglob("*.py"))


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


def test_the_seed_names_are_the_seed_api_modules_names():
    # every lazy export names the module that defines it, so `from torchkit import X` is that object
    from torchkit import _EXPORTS

    for name, module in _EXPORTS.items():
        assert getattr(importlib.import_module(module), name) is getattr(torchkit, name), name


def test_the_planner_core_imports_neither_torch_ray_nor_pynvml():
    _run(
        "import sys\n"
        "import planner, planner.job, planner.cluster, planner.errors, planner.events\n"
        "import planner.profiles.profile, planner.profiles.key, planner.profiles.cache\n"
        "import planner.allocate.allocation, planner.allocate.advice, planner.allocate.solver\n"
        "import planner.plan.build, planner.plan.io, planner.plan.launch, planner.plan.types\n"
        "import planner.preflight, planner.runtime, planner.cli.main\n"
        "heavy = [m for m in ('torch', 'ray', 'pynvml') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )


def _project_module(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").split(".")[0] in {"planner", "torchkit", "cluster_configs"}


def test_no_private_name_is_imported_from_another_module():
    # tests may reach into the module they test; the code itself may not
    crossings = [
        f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import {alias.name}"
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and _project_module(node)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]
    assert not crossings, "private names used outside their module:\n" + "\n".join(crossings)


#: STYLE.md: no function over 80 lines outside tests
MAX_FUNCTION_LINES = 80


def test_no_function_outside_tests_is_longer_than_80_lines():
    long = [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.name} has {node.end_lineno - node.lineno + 1} lines"
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)
