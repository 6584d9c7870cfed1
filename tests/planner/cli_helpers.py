"""Helpers shared by the CLI tests (``test_cli_*.py``): run ``batchplan`` and check what it printed against the
documented interfaces (DESIGN.md, "Interfaces that others depend on").

:func:`run_cli` calls ``planner.cli.main.main(argv)`` in the test's own process (``tests/cli_in_process.py``:
stdout and stderr captured at the file-descriptor level, the exit code, and the process's global state put
back afterwards), as ``python -m planner.cli.main ARGS`` would run from ``cwd``: the working directory first
on ``sys.path``, the environment of :func:`cli_env`. A test about the process itself (a signal, a killed run,
what a real process leaves on its stdout, the installed console script) uses :func:`run_cli_process`, the
same call in a subprocess; both return an object with ``args``, ``returncode``, ``stdout`` and ``stderr``.

The subprocess gets the repository root on ``PYTHONPATH`` whatever its working directory, so the tiny test
workloads (``tests.planner.tiny_models:convnet``) import while ``plan.json`` lands in a test's tmp_path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.codec import convert
from planner.plan.io import validate_plan
from planner.profiles.profile import DeviceProfile
from tests.cli_in_process import CliRun, run_main_in_process

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = REPO_ROOT / "cluster_configs"
DEMO_MIXED = CONFIGS / "demo-mixed.yaml"
HOMOGENEOUS = CONFIGS / "homogeneous-a100.yaml"
SHARED_NODE = CONFIGS / "shared-node.yaml"

#: a small CNN whose fake-tensor estimate takes about a second (tests/planner/tiny_models.py)
TINY_MODEL = ("--model", "tests.planner.tiny_models:convnet", "--input-shape", "3,32,32")

#: what every PNG file starts with (PNG specification, section 5.2)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: seconds a CLI subprocess may take before the test fails instead of hanging (a plan with a fake-tensor
#: estimate takes 4-10 s on the shared test machine)
DEFAULT_TIMEOUT_S = 180.0

PLAN_SCHEMA = "batchplan/plan@1"
PREFLIGHT_SCHEMA = "batchplan/preflight@1"
PROFILE_SCHEMA = "batchplan/profile@1"
ERROR_SCHEMA = "batchplan/error@1"


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI subprocess: this one, the repo root on PYTHONPATH, wide and plain output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    env.pop("BATCHPLAN_CACHE_DIR", None)  # a test names its cache explicitly
    env.update(extra or {})
    return env


def run_cli(
    *args: str | os.PathLike,
    cwd: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    console_script: bool = False,
) -> CliRun | subprocess.CompletedProcess[str]:
    """Run ``batchplan ARGS`` in this process, as ``python -m planner.cli.main ARGS`` would run from ``cwd``,
    and return its exit code and what it wrote on stdout and stderr.

    Args:
        cwd: working directory; pass a tmp_path so a default ``./plan.json`` never lands in the repository.
        env: extra environment variables on top of :func:`cli_env`.
        timeout: for :func:`run_cli_process`; in this process a hang is caught by pytest-timeout.
        console_script: run the installed ``batchplan`` entry point in a subprocess instead.
    """
    if console_script:
        return run_cli_process(*args, cwd=cwd, env=env, timeout=timeout, console_script=True)
    return run_main_in_process([str(a) for a in args], cwd=cwd, env=cli_env(env))


def run_cli_process(
    *args: str | os.PathLike,
    cwd: str | os.PathLike,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    console_script: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``batchplan ARGS`` in a subprocess (``python -m planner.cli.main``, or with ``console_script`` the
    installed ``batchplan`` entry point) and return it with stdout and stderr as text. For tests about the
    process itself; everything else uses :func:`run_cli`.

    Args:
        cwd: working directory; pass a tmp_path so a default ``./plan.json`` never lands in the repository.
        env: extra environment variables on top of :func:`cli_env`.
    """
    if console_script:
        script = shutil.which("batchplan", path=str(Path(sys.executable).parent)) or shutil.which("batchplan")
        assert script is not None, "the batchplan console script is not installed (pip install -e .)"
        command = [script]
    else:
        command = [sys.executable, "-m", "planner.cli.main"]
    return subprocess.run(
        [*command, *(str(a) for a in args)],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def describe(result: CliRun | subprocess.CompletedProcess[str]) -> str:
    """The command, exit code and output of a run, for assertion messages."""
    return (
        f"$ {shlex.join(str(a) for a in result.args)}\nexit {result.returncode}\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )


def assert_ok(result: CliRun | subprocess.CompletedProcess[str], code: int = 0) -> None:
    """The run exited with ``code`` and without a traceback."""
    assert result.returncode == code, describe(result)
    assert "Traceback" not in result.stderr, describe(result)


def assert_user_error(result: CliRun | subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The run failed the documented way: exit ``code``, no traceback, stdout empty (with ``--json``: exactly
    the ``batchplan/error@1`` document of that line and code), and stderr's last line is ``error: ...``
    containing every one of ``words``. Returns that line."""
    assert result.returncode == code, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    assert lines, describe(result)
    last = lines[-1]
    assert last.startswith("error: "), describe(result)
    if "--json" in [str(a) for a in result.args]:
        assert_error_document(result, code, last)
    else:
        assert result.stdout == "", describe(result)
    for word in words:
        assert word in last, f"{word!r} not in: {last}"
    return last


def assert_error_document(result: CliRun | subprocess.CompletedProcess[str], code: int, line: str) -> dict:
    """stdout is exactly the ``--json`` error document (``planner.cli.json_error``) of the stderr ``line``."""
    doc = parse_json_stdout(result)
    assert doc == {
        "schema": ERROR_SCHEMA,
        "command": doc.get("command"),
        "error": line.removeprefix("error: "),
        "exit_code": code,
    }, describe(result)
    return doc


def parse_json_stdout(result: CliRun | subprocess.CompletedProcess[str]) -> Any:
    """stdout is exactly one JSON document (logs go to stderr)."""
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"stdout is not JSON ({exc})\n{describe(result)}") from exc


def check_plan(doc: Any) -> dict:
    """A plan document: ``planner.plan.io.validate_plan`` (the schema the runtime reads) plus the loss weights
    DESIGN.md defines (w_i = b_i · W / B_step, so they average to 1)."""
    validate_plan(doc, where="plan under test")
    weights = [r["loss_weight"] for r in doc["ranks"]]
    assert abs(sum(weights) - doc["world_size"]) < 1e-9 * max(1, doc["world_size"])
    for rank in doc["ranks"]:
        assert rank["batch"] <= rank["max_batch"]
        assert rank["predicted_memory_bytes"] <= rank["memory_budget_bytes"] <= rank["total_memory_bytes"]
        assert rank["batch"] % doc["job"]["multiple_of"] == 0
    return doc


def check_preflight(doc: Any) -> dict:
    """A ``batchplan/preflight@1`` document: schema, ok, checks[{name, ok, detail} and, on a failed check, its
    ``fix``], plan (valid or null), and ``ok`` is the conjunction of the checks."""
    assert isinstance(doc, dict)
    assert set(doc) == {"schema", "ok", "checks", "plan"}, sorted(doc)
    assert doc["schema"] == PREFLIGHT_SCHEMA
    assert isinstance(doc["ok"], bool)
    assert isinstance(doc["checks"], list) and doc["checks"]
    for check in doc["checks"]:
        assert set(check) - {"fix"} == {"name", "ok", "detail"}, check
        assert "fix" not in check or (not check["ok"] and isinstance(check["fix"], str) and check["fix"]), (
            check
        )
        assert isinstance(check["name"], str) and check["name"]
        assert isinstance(check["ok"], bool)
        assert isinstance(check["detail"], str) and check["detail"]
    names = [c["name"] for c in doc["checks"]]
    assert len(names) == len(set(names)), names
    assert doc["ok"] == all(c["ok"] for c in doc["checks"])
    if doc["plan"] is not None:
        check_plan(doc["plan"])
    return doc


def check_profile(doc: Any) -> dict:
    """A ``batchplan/profile@1`` document: figures consistent with each other and its profile parseable."""
    assert isinstance(doc, dict)
    assert doc["schema"] == PROFILE_SCHEMA
    for name in ("total_memory_bytes", "available_memory_bytes", "memory_budget_bytes", "chosen_batch"):
        assert isinstance(doc[name], int) and not isinstance(doc[name], bool), name
    assert 0 < doc["memory_budget_bytes"] <= doc["available_memory_bytes"] <= doc["total_memory_bytes"]
    assert doc["memory_budget_bytes"] == int(doc["job"]["fraction"] * doc["available_memory_bytes"])
    profile = convert(DeviceProfile, doc["profile"], where="profile")
    assert profile.gpu == doc["gpu"]
    if doc["chosen_batch"]:
        assert doc["predicted_memory_bytes"] == profile.memory_bytes(doc["chosen_batch"])
        assert doc["predicted_memory_bytes"] <= doc["memory_budget_bytes"]
        assert doc["predicted_step_time_s"] > 0
        assert doc["throughput_samples_per_s"] > 0
    return doc


def is_png(path: str | os.PathLike) -> bool:
    data = Path(path).read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


def readme_first_bash_block() -> str:
    """The text of README.md's first ```bash block."""
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("```bash\n") + len("```bash\n")
    return text[start : text.index("```", start)]


def readme_batchplan_command() -> list[str]:
    """argv of the ``batchplan ...`` command in README.md's first bash block (after the set-up steps that
    precede it with ``&&``)."""
    block = readme_first_bash_block()
    commands = [part.strip() for line in block.splitlines() for part in line.split("&&")]
    found = [shlex.split(c) for c in commands if c.startswith("batchplan ")]
    assert len(found) == 1, f"expected one batchplan command in README's first bash block:\n{block}"
    return found[0]


def known_flags(command: str | None) -> set[str]:
    """The option strings ``batchplan COMMAND`` accepts (with the global ones), from the real parser."""
    from planner.cli.main import build_parser

    parser = build_parser()
    flags = {s for action in parser._actions for s in action.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            flags |= {s for a in action.choices[command]._actions for s in a.option_strings}
    return flags


def flags_named_in(message: str) -> set[str]:
    """The ``--long-flags`` a message names."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", message))
