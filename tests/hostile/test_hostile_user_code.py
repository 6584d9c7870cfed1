"""A user's factory that exits, hangs or prints: ``sys.exit(7)`` at import or in the factory is one ``error:``
line and exit 2 (not batchplan ending with the user's code), a factory that hangs is stopped after
``--user-code-timeout`` seconds, and what user code prints never reaches stdout, with ``--json`` or without
(``profile`` builds the model in this process)."""

from __future__ import annotations

import json

import pytest

from planner.job import DEFAULT_USER_CODE_TIMEOUT_S, JobFieldError, JobSpec
from tests.planner.cli_helpers import assert_ok, assert_user_error, check_profile, parse_json_stdout, run_cli

USER_MODULE = """
import sys
from tests.planner.tiny_models import convnet


def exits():
    sys.exit(7)


def hangs():
    import time
    try:
        time.sleep(3600)
    except Exception:  # a factory that swallows exceptions is still stopped
        time.sleep(3600)


def talks():
    print("hello from the factory")
    sys.stdout.write("no newline, then a brace {")
    return convnet()
"""
EXITS_ON_IMPORT = "import sys\nsys.exit(7)\n"
MODEL = ("--input-shape", "3,32,32", "--no-cache")


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "usermod.py").write_text(USER_MODULE)
    (tmp_path / "exitmod.py").write_text(EXITS_ON_IMPORT)
    (tmp_path / "one.yaml").write_text("nodes:\n  - {name: a, gpus: [{type: T4}]}\n")
    return tmp_path


@pytest.mark.parametrize("model", ["usermod:exits", "exitmod:factory"])
@pytest.mark.parametrize("command", ["profile", "plan"])
def test_sys_exit_in_user_code_is_one_line_and_exit_2(workdir, model, command) -> None:
    where = (
        ("--gpu", "T4")
        if command == "profile"
        else ("--no-ray", "--cluster", workdir / "one.yaml", "--no-write")
    )
    result = run_cli(command, *where, "--model", model, *MODEL, cwd=workdir)
    line = assert_user_error(result, 2, "sys.exit(7)")
    assert model.partition(":")[0] in line


def test_what_a_factory_prints_goes_to_stderr_under_profile_json(workdir) -> None:
    result = run_cli("profile", "--gpu", "T4", "--model", "usermod:talks", *MODEL, "--json", cwd=workdir)
    assert_ok(result)
    check_profile(parse_json_stdout(result))
    assert "hello from the factory" in result.stderr and "hello" not in result.stdout


def test_what_a_factory_prints_goes_to_stderr_under_plan_json(workdir) -> None:
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        workdir / "one.yaml",
        "--model",
        "usermod:talks",
        *MODEL,
        "--json",
        "--no-write",
        cwd=workdir,
    )
    assert_ok(result)
    assert json.loads(result.stdout)["schema"] == "batchplan/plan@1"
    assert "hello from the factory" in result.stderr


@pytest.mark.slow  # waits out the 2 s user-code time limit
@pytest.mark.parametrize("command", ["profile", "plan"])
def test_a_factory_that_hangs_is_stopped_after_the_user_code_timeout(workdir, command) -> None:
    where = (
        ("--gpu", "T4")
        if command == "profile"
        else ("--no-ray", "--cluster", workdir / "one.yaml", "--no-write")
    )
    result = run_cli(
        command,
        *where,
        "--model",
        "usermod:hangs",
        *MODEL,
        "--user-code-timeout",
        "2",
        "--json",
        cwd=workdir,
        timeout=240,
    )
    assert_user_error(result, 2, "usermod:hangs", "2 s", "--user-code-timeout")


@pytest.mark.parametrize("value", [0, -1, 10**6, float("nan")])
def test_the_user_code_timeout_is_range_checked(value) -> None:
    with pytest.raises(JobFieldError, match="user_code_timeout_s"):
        JobSpec(model="pkg.mod:factory", user_code_timeout_s=value)


def test_the_user_code_timeout_has_a_stated_default() -> None:
    assert JobSpec(model="resnet18").user_code_timeout_s == DEFAULT_USER_CODE_TIMEOUT_S == 300.0
