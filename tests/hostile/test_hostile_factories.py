"""User code and the environment against ``batchplan plan`` (issue #34, item 6): a factory that moves the working
directory, leaves a thread running, raises KeyboardInterrupt, calls ``os._exit(0)`` or raises text full of escape
sequences; a stdout that is closed or cannot encode the tables; an ``-o`` too long for the file system or naming a
directory. Each is one line and the right exit code (or the plan where it should be), never a traceback, never a
process that outlives its result.

Every run is a fresh ``batchplan plan --no-ray`` of a tiny convnet (a few seconds); the subprocess timeouts tell
a bounded run from one that hangs, with room for a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.hostile_factories import COUNT_FILE_VAR
from tests.planner.cli_helpers import DEMO_MIXED, assert_ok, assert_user_error, cli_env, describe, run_cli

pytestmark = pytest.mark.slow

ARGS = ("--no-ray", "--cluster", str(DEMO_MIXED), "--input-shape", "3,16,16", "--no-cache")


def _model(name: str) -> tuple[str, str]:
    return "--model", f"tests.hostile.hostile_factories:{name}"


def test_a_factory_that_changes_directory_cannot_move_the_plan(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run_cli(
        "plan",
        *ARGS,
        *_model("moves_the_working_directory"),
        "-o",
        "plan.json",
        cwd=tmp_path,
        env={"BATCHPLAN_TEST_ELSEWHERE": str(elsewhere)},
    )
    assert_ok(result)
    assert (tmp_path / "plan.json").is_file() and not (elsewhere / "plan.json").exists()
    assert "--plan plan.json" in result.stdout  # the launch lines keep the path as it was given


def test_a_thread_the_factory_leaves_running_does_not_keep_the_run_alive(tmp_path: Path) -> None:
    # the timeout is the test: on 173e00e the process never ended (the thread sleeps an hour)
    result = run_cli(
        "plan",
        *ARGS,
        *_model("leaves_a_thread_running"),
        "--no-write",
        cwd=tmp_path,
        timeout=180,
        console_script=True,
    )
    assert_ok(result)
    assert (
        "thread(s) still running (factory-thread" in result.stderr
        and "exiting without waiting" in result.stderr
    )


def test_a_keyboard_interrupt_from_the_factory_is_not_reported_as_ctrl_c(tmp_path: Path) -> None:
    result = run_cli("plan", *ARGS, *_model("raises_keyboard_interrupt"), "--no-write", cwd=tmp_path)
    last = assert_user_error(
        result, 2, "raised KeyboardInterrupt('from the factory') with no Ctrl-C or signal"
    )
    assert "Ctrl-C)" not in last


def test_os_exit_in_the_factory_is_an_error_not_a_silent_success(tmp_path: Path) -> None:
    result = run_cli("plan", *ARGS, *_model("exits_with_os_exit"), "--no-write", cwd=tmp_path)
    assert_user_error(result, 2, "called os._exit(0)")


def test_escape_sequences_in_a_factory_s_error_are_shown_escaped(tmp_path: Path) -> None:
    result = run_cli("plan", *ARGS, *_model("raises_with_escapes"), "--no-write", cwd=tmp_path)
    last = assert_user_error(result, 2, r"\x1b[2J\x1b]0;owned\x07boom\nerror: a forged line \u202egnp.exe")
    assert not any(c in result.stderr for c in "\x1b\x07\u202e")
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [last]


def test_the_factory_runs_at_most_twice_in_one_plan(tmp_path: Path) -> None:
    count = tmp_path / "count"
    result = run_cli(
        "plan", *ARGS, *_model("counted"), "--no-write", cwd=tmp_path, env={COUNT_FILE_VAR: str(count)}
    )
    assert_ok(result)
    # the template (on the meta device) and the gradient layout's meta build; it ran 6 times for 3 GPU types
    assert len(count.read_text()) <= 2, count.read_text()


def test_a_stdout_that_cannot_encode_the_tables_gets_escapes(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "planner.cli.main", "plan", *ARGS, *_model("counted"), "--no-write"]
    env = cli_env({"PYTHONIOENCODING": "latin-1", COUNT_FILE_VAR: str(tmp_path / "count")})
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, timeout=120)
    stdout, stderr = result.stdout.decode("latin-1"), result.stderr.decode("latin-1")
    assert result.returncode == 0 and "Traceback" not in stderr, stderr
    assert "\\u03c3" in stdout and "\u00b1" in stdout  # sigma escaped (latin-1 has no byte for it), ± kept


def test_a_closed_stdout_is_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "planner.cli.main", "plan", *ARGS, *_model("counted"), "--no-write"]
    result = subprocess.run(
        argv,
        cwd=tmp_path,
        env=cli_env({COUNT_FILE_VAR: str(tmp_path / "count")}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: stdout is closed: batchplan prints its result there (redirect it, e.g. > plan.txt or > /dev/null, "
        "rather than closing it)"
    ]


@pytest.mark.parametrize(
    ("output", "words"),
    [
        ("a" * 300 + ".json", ("File name too long",)),
        ("a" * 245 + ".json", ("over what the file system holds",)),
        ("newdir/", ("-o newdir/ is a directory", "newdir/plan.json")),
    ],
)
def test_an_output_path_the_file_system_cannot_take_is_one_line(tmp_path: Path, output: str, words) -> None:
    result = run_cli(
        "plan",
        *ARGS,
        *_model("counted"),
        "-o",
        output,
        cwd=tmp_path,
        env={COUNT_FILE_VAR: str(tmp_path / "count")},
    )
    assert_user_error(result, 2, *words)
    assert not (tmp_path / "newdir").exists(), describe(result)
    assert not list(tmp_path.glob("*.json")), json.dumps(os.listdir(tmp_path))
