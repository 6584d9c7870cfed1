"""Under ``--json`` every failure puts one ``batchplan/error@1`` document on stdout (``planner.cli.json_error``)
and the one ``error:`` line on stderr; without ``--json`` stdout stays empty. In-process (``main(argv)``)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main
from planner.cli.json_error import ERROR_SCHEMA
from planner.errors import InfeasiblePlanError

NO_SUCH_CONFIG = "/nonexistent/cluster.yaml"


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli_main.main(argv)
    except SystemExit as exc:  # argparse's errors end the run here
        code = int(exc.code)
    out, err = capsys.readouterr()
    return code, out, err


def _the_error_line(err: str) -> str:
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    return line.removeprefix("error: ")


@pytest.mark.parametrize(
    "argv, code, command",
    [
        (["plan", "--json", "--cluster", NO_SUCH_CONFIG, "--model", "resnet18", "--no-write"], 2, "plan"),
        (["preflight", "--json", "--cluster", NO_SUCH_CONFIG, "--model", "resnet18"], 2, "preflight"),
        (["profile", "--json", "--gpu", "NO-SUCH-GPU", "--model", "resnet18"], 2, "profile"),
        (["plan", "--json", "--cluster", NO_SUCH_CONFIG], 2, "plan"),  # argparse: --model missing
        (["plan", "--json", "--model", "resnet18", "--imgsz", "2147483648"], 2, "plan"),
    ],
)
def test_a_failure_under_json_is_one_error_document_and_one_error_line(capsys, argv, code, command) -> None:
    returned, out, err = _run(capsys, argv)
    assert returned == code
    doc = json.loads(out)
    assert doc == {
        "schema": ERROR_SCHEMA,
        "command": command,
        "error": _the_error_line(err),
        "exit_code": code,
    }


def test_without_json_a_failure_leaves_stdout_empty(capsys) -> None:
    returned, out, err = _run(
        capsys, ["plan", "--cluster", NO_SUCH_CONFIG, "--model", "resnet18", "--no-write"]
    )
    assert (returned, out) == (2, "")
    assert NO_SUCH_CONFIG in _the_error_line(err)


def test_an_infeasible_plan_under_json_is_an_error_document_with_exit_1(capsys, monkeypatch) -> None:
    from planner.cli import plan

    def infeasible(args):
        raise InfeasiblePlanError("nothing fits (lower --multiple-of)")

    monkeypatch.setattr(plan, "run", infeasible)
    returned, out, err = _run(capsys, ["plan", "--json", "--model", "resnet18", "--no-write"])
    assert returned == 1
    assert json.loads(out) == {
        "schema": ERROR_SCHEMA,
        "command": "plan",
        "error": "nothing fits (lower --multiple-of)",
        "exit_code": 1,
    }
    assert _the_error_line(err) == "nothing fits (lower --multiple-of)"


def test_no_error_document_follows_a_result_already_begun(capsys, monkeypatch) -> None:
    """A second document after a partly written one would make stdout unreadable: the stderr line says it."""
    import sys

    from planner.cli import plan

    def begins_then_fails(args):
        sys.stdout.write('{"schema": "batchplan/plan@1",')
        raise InfeasiblePlanError("cut short")

    monkeypatch.setattr(plan, "run", begins_then_fails)
    returned, out, err = _run(capsys, ["plan", "--json", "--model", "resnet18", "--no-write"])
    assert (returned, out) == (1, '{"schema": "batchplan/plan@1",')
    assert _the_error_line(err) == "cut short"


def test_a_bug_under_json_still_gives_a_document_and_its_traceback(capsys, monkeypatch) -> None:
    from planner.cli import plan

    def bug(args):
        raise RuntimeError("an invariant broke")

    monkeypatch.setattr(plan, "run", bug)
    with pytest.raises(RuntimeError, match="an invariant broke"):
        cli_main.main(["plan", "--json", "--model", "resnet18", "--no-write"])
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "schema": ERROR_SCHEMA,
        "command": "plan",
        "error": "internal error: RuntimeError: an invariant broke",
        "exit_code": 1,
    }
