"""A closed stderr drops the logs, never the result (``planner.cli.log_stream``): the plan is still written and
the exit code is the run's; and a run whose plan was not written never exits 0.

The closed pipe is made before the run starts (its read end closed at once), so the first progress line meets
it: the same moment as ``batchplan plan ... 2>&1 | head -1``, without the race of when ``head`` closes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from planner.cli import main as cli_main
from tests.planner.cli_helpers import DEMO_MIXED, TINY_MODEL, check_plan, cli_env

STALE = {"schema": "batchplan/plan@1", "global_batch": 768, "stale": True}


def _run_with_closed_stderr(tmp_path, *args: str) -> tuple[int, str]:
    """``batchplan ARGS`` with stderr a pipe nobody reads (closed before the run); (exit code, stdout)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    out_path = tmp_path / "stdout.txt"
    try:
        with open(out_path, "w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "planner.cli.main", *args],
                cwd=tmp_path,
                env=cli_env({"BATCHPLAN_CACHE_DIR": str(tmp_path / "cache")}),
                stdout=out,
                stderr=write_end,
                timeout=300,
            )
    finally:
        os.close(write_end)
    return done.returncode, out_path.read_text()


def _stale_plan(tmp_path):
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(STALE))
    return path


@pytest.mark.slow
def test_a_closed_stderr_still_writes_the_plan_without_ray(tmp_path) -> None:
    stale = _stale_plan(tmp_path)
    code, out = _run_with_closed_stderr(
        tmp_path,
        "plan",
        "--cluster",
        str(DEMO_MIXED),
        *TINY_MODEL,
        "--global-batch",
        "96",
        "--no-ray",
        "-o",
        str(stale),
    )
    assert code == 0, out
    plan = check_plan(json.loads(stale.read_text()))
    assert plan["global_batch"] == 96
    assert out.startswith("plan for tests.planner.tiny_models:convnet"), out  # the result is whole on stdout


@pytest.mark.slow
@pytest.mark.ray
def test_a_closed_stderr_still_writes_the_plan_with_ray(tmp_path) -> None:
    stale = _stale_plan(tmp_path)
    code, out = _run_with_closed_stderr(
        tmp_path,
        "plan",
        "--cluster",
        str(DEMO_MIXED),
        *TINY_MODEL,
        "--global-batch",
        "96",
        "-o",
        str(stale),
        "--json",
    )
    assert code == 0, out
    assert check_plan(json.loads(out)) == check_plan(json.loads(stale.read_text()))
    assert json.loads(stale.read_text())["global_batch"] == 96


class _ClosedPipe:
    """A stream whose reader has gone: every write raises, as a pipe's does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_in_process_a_closed_stderr_changes_neither_the_result_nor_the_exit_code(
    tmp_path, monkeypatch, capsys
) -> None:
    from planner.cli import plan

    def logs_then_writes(args):
        sys.stderr.write("probing 3 nodes\n")  # the first progress line meets the closed pipe
        sys.stderr.flush()
        (tmp_path / "plan.json").write_text("{}")
        sys.stdout.write("the result\n")
        return 0

    monkeypatch.setattr(plan, "run", logs_then_writes)
    monkeypatch.setattr(sys, "stderr", _ClosedPipe())
    assert cli_main.main(["plan", "--model", "resnet18"]) == 0
    assert (tmp_path / "plan.json").read_text() == "{}"
    assert capsys.readouterr().out == "the result\n"
    assert isinstance(sys.stderr, _ClosedPipe)  # main put the stream it was given back


def test_a_broken_pipe_before_the_plan_is_written_is_not_exit_0(monkeypatch) -> None:
    """Only the result's reader going away ends a run with 0: a pipe that breaks anywhere else (a socket, a
    file written through) means the plan was not written."""
    from planner.cli import plan

    def breaks_before_writing(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(plan, "run", breaks_before_writing)
    with pytest.raises(BrokenPipeError):
        cli_main.main(["plan", "--model", "resnet18"])


def test_the_result_reader_going_away_after_the_plan_is_written_is_exit_0(tmp_path, monkeypatch) -> None:
    """``batchplan plan | head``: the files are written, the reader took what it wanted."""
    from planner.cli import plan

    def writes_then_prints(args):
        (tmp_path / "plan.json").write_text("{}")
        sys.stdout.write("the result\n")
        sys.stdout.flush()
        return 0

    monkeypatch.setattr(plan, "run", writes_then_prints)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    monkeypatch.setattr(cli_main, "_silence_stdout", lambda: None)  # the fake stream has no descriptor
    assert cli_main.main(["plan", "--model", "resnet18"]) == 0
    assert (tmp_path / "plan.json").read_text() == "{}"
