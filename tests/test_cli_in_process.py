"""tests/cli_in_process.py: ``batchplan`` run in the test's process reads as a subprocess would, and leaves the
process as it found it (the next test must not inherit a working directory, a handler or a module)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    assert_ok,
    assert_user_error,
    parse_json_stdout,
    run_cli,
    run_cli_process,
)


def _process_state() -> dict:
    root = logging.getLogger()
    return {
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "path": list(sys.path),
        "argv": list(sys.argv),
        "stdout": sys.stdout,
        "stderr": sys.stderr,
        "excepthook": sys.excepthook,
        "handlers": list(root.handlers),
        "level": root.level,
        "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)},
        "mask": signal.pthread_sigmask(signal.SIG_BLOCK, []),
    }


def test_a_run_leaves_the_process_as_it_found_it(tmp_path: Path) -> None:
    before = _process_state()
    result = run_cli("catalog", "--json", cwd=tmp_path, env={"BATCHPLAN_SOMETHING": "1"})
    assert_ok(result)
    assert _process_state() == before
    assert "BATCHPLAN_SOMETHING" not in os.environ


def test_stdout_and_stderr_are_apart_and_the_exit_code_is_main_s(tmp_path: Path) -> None:
    doc = parse_json_stdout(run_cli("catalog", "--json", cwd=tmp_path))
    assert doc["schema"] == "batchplan/catalog@1"
    failed = run_cli("show", tmp_path / "missing.json", cwd=tmp_path)
    assert_user_error(failed, 2, "missing.json")
    assert failed.args == ["batchplan", "show", str(tmp_path / "missing.json")]


def test_argparse_exits_become_exit_codes(tmp_path: Path) -> None:
    version = run_cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("batchplan ")
    unknown = run_cli("catalog", "--no-such-flag", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.startswith(
        "error: unrecognized arguments: --no-such-flag"
    )


def test_log_lines_reach_the_captured_stderr(tmp_path: Path) -> None:
    # main's logging.basicConfig must find a root logger without pytest's handlers, as in a fresh process
    (tmp_path / "logging_cli_model.py").write_text(
        "import logging\nimport torch\n\ndef build():\n"
        "    logging.getLogger('user').warning('built by the factory')\n    return torch.nn.Linear(8, 2)\n"
    )
    result = run_cli(
        "profile",
        "--gpu",
        "T4",
        "--model",
        "logging_cli_model:build",
        "--input-shape",
        "8",
        "--no-cache",
        "--json",
        cwd=tmp_path,
    )
    assert_ok(result)
    assert "built by the factory" in result.stderr and "built by" not in result.stdout


def test_a_user_module_edited_between_runs_is_imported_again(tmp_path: Path) -> None:
    module = tmp_path / "edited_cli_model.py"
    shapes = []
    for width in (16, 24):
        module.write_text(
            "import torch\n\ndef build():\n"
            f"    return torch.nn.Sequential(torch.nn.Linear(8, {width}), torch.nn.Linear({width}, 2))\n"
        )
        result = run_cli(
            "profile",
            "--gpu",
            "T4",
            "--model",
            "edited_cli_model:build",
            "--input-shape",
            "8",
            "--no-cache",
            "--json",
            cwd=tmp_path,
        )
        assert_ok(result)
        shapes.append(parse_json_stdout(result)["profile"]["memory_points"])
        assert "edited_cli_model" not in sys.modules
    assert shapes[0] != shapes[1]


@pytest.mark.slow  # the subprocess imports the CLI: seconds on a loaded machine
def test_in_process_and_subprocess_print_the_same(tmp_path: Path) -> None:
    args = ("catalog", "--json")
    here, there = run_cli(*args, cwd=tmp_path), run_cli_process(*args, cwd=tmp_path)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)
    assert json.loads(here.stdout)["gpus"]
