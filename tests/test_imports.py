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
SOURCES = sorted(
    p
    for d in ("planner", "torchkit", "cluster_configs", "bench", "examples")
    for p in (REPO / d).rglob("*.py")
)


def _modules(package) -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."))


@pytest.mark.parametrize("name", _modules(planner) + _modules(torchkit))
def test_every_module_imports(name):
    from planner.integrations.optional import MissingLibraryError

    try:
        importlib.import_module(name)
    except (
        MissingLibraryError
    ) as exc:  # a trainer integration whose library is not importable here: its one line
        assert name.startswith("planner.integrations."), name
        pytest.skip(str(exc))


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
    # every lazy export names the module that defines it, so `from torchkit import X` is that object; the one
    # name that is also a submodule (torchkit.autobatch) is the module once that was imported, and calls through
    from torchkit import _EXPORTS

    for name, module in _EXPORTS.items():
        value = getattr(torchkit, name)
        if isinstance(value, type(torchkit)):
            assert value.__name__ == f"torchkit.{name}" and getattr(value, name) is getattr(
                importlib.import_module(module), name
            ), name
        else:
            assert getattr(importlib.import_module(module), name) is value, name


def test_the_seed_api_keeps_the_names_the_engine_now_holds():
    # the four things the planner takes moved into the engine; the seed's modules still hand them out
    _run(
        "import torchkit, torchkit.seed_api.device as d, torchkit.seed_api.distributed as z\n"
        "import torchkit.seed_api.batch_choice as b, torchkit.step.budget as budget\n"
        "from torchkit.process.device import parse_device\n"
        "from torchkit.process.zero_first import torch_distributed_zero_first\n"
        "from torchkit.hardware.host import get_cpu_info\n"
        "assert d.parse_device is parse_device is torchkit.parse_device\n"
        "assert d.get_cpu_info is get_cpu_info is torchkit.get_cpu_info\n"
        "assert z.torch_distributed_zero_first is torch_distributed_zero_first is torchkit.torch_distributed_zero_first\n"
        "assert b.DEFAULT_FRACTION is budget.DEFAULT_FRACTION and b.memory_budget_bytes is budget.memory_budget_bytes\n"
    )


@pytest.mark.slow
def test_torchkit_autobatch_is_a_module_path_and_stays_callable_in_either_import_order():
    # Ultralytics users write `from ultralytics.utils.autobatch import check_train_batch_size`; ours is
    # `from torchkit.autobatch import ...`, while `torchkit.autobatch(...)` keeps working as the function
    for first in ("function", "module"):
        _run(
            "import logging, torch, torchkit\n"
            + ("f = torchkit.autobatch\n" if first == "function" else "")
            + "import torchkit.autobatch as m\n"
            "from torchkit.autobatch import autobatch, check_train_batch_size\n"
            "from torchkit.seed_api import autobatch as impl\n"
            "assert autobatch is impl.autobatch and check_train_batch_size is impl.check_train_batch_size\n"
            "assert m.autobatch is impl.autobatch\n"
            "model = torch.nn.Linear(3, 2)\n"
            "logging.disable(logging.WARNING)\n"
            "assert torchkit.autobatch(model, imgsz=32, batch_size=7) == 7  # CPU: the seed's default\n"
            "assert m(model, imgsz=32, batch_size=5) == 5\n"
        )


def test_the_planner_core_imports_neither_torch_ray_nor_pynvml():
    _run(
        "import sys\n"
        "import planner, planner.job, planner.cluster, planner.errors, planner.events\n"
        "import planner.profiles.profile, planner.profiles.key, planner.profiles.cache\n"
        "import planner.allocate.allocation, planner.allocate.advice, planner.allocate.solver\n"
        "import planner.plan.build, planner.plan.io, planner.plan.launch, planner.plan.types\n"
        "import planner.preflight, planner.runtime, planner.cli.main\n"
        "import planner.integrations, planner.integrations.plan_source, planner.integrations.planned_run\n"
        "heavy = [m for m in ('torch', 'ray', 'pynvml', 'transformers', 'accelerate', 'lightning') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )


def _project_module(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").split(".")[0] in {"planner", "torchkit", "cluster_configs"}


def _package_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1])


def _face_imports_its_package(package: str) -> bool:
    """Whether ``package``'s ``__init__`` imports any module of ``package`` (a face with children; one that
    only holds constants, like ``planner.__version__``, closes no cycle)."""
    face = REPO.joinpath(*package.split("."), "__init__.py")
    for node in ast.walk(ast.parse(face.read_text(), str(face))):
        names = (
            [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
        )
        if getattr(node, "level", 0) or any(n == package or n.startswith(package + ".") for n in names):
            return True
    return False


def _face_imports(path: Path) -> list[str]:
    """Imports in ``path`` of a name from the face (``__init__``) of its own package or of a package above it,
    where that face imports modules of its package: ``from torchkit.workloads import Workload`` inside
    ``torchkit/workloads/resnet.py``. A submodule named by ``from pkg import sub`` is not the face."""
    package = _package_of(path)
    if path.name == "__init__.py" or not package:
        return []
    ancestors = {".".join(package.split(".")[: i + 1]) for i in range(len(package.split(".")))}
    ancestors = {a for a in ancestors if _face_imports_its_package(a)}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module not in ancestors:
                continue
            folder = REPO.joinpath(*module.split("."))
            for alias in node.names:
                if not (
                    (folder / f"{alias.name}.py").exists() or (folder / alias.name / "__init__.py").exists()
                ):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {module} import {alias.name}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.relative_to(REPO)}:{node.lineno}: import {a.name}"
                for a in node.names
                if a.name in ancestors
            ]
    return found


def test_no_module_imports_the_face_of_its_own_package():
    # acyclic_siblings cannot see a parent-child cycle (a package face importing its children, a child
    # importing names from the face): a module takes what it needs from the sibling that defines it
    sources = [p for p in SOURCES if p.relative_to(REPO).parts[0] in {"planner", "torchkit"}]
    found = [line for path in sources for line in _face_imports(path)]
    assert not found, (
        "modules importing their own package's face (import from the defining module):\n" + "\n".join(found)
    )


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
