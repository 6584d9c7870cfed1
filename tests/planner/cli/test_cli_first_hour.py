"""What a new user tripped on in the first hour (issue 33, item 7), each as it was seen: a misspelt flag, a
misspelt model given to ``profile``, a factory imported without a word, a cluster config given to ``show``, a
machine with no GPU, a range that says nothing, an ``advise`` that found nothing, Ctrl-C during a fake pass.
In-process (``main(argv)``) where the command's own code is what is checked; a subprocess where the process is
(its exit, its signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from planner.cli import main as cli_main
from planner.errors import NoGpuError
from tests.planner.cli_helpers import DEMO_MIXED, REPO_ROOT, cli_env


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = cli_main.main(argv)
    except SystemExit as exc:
        code = int(exc.code)
    out, err = capsys.readouterr()
    return code, out, err


def _error(err: str) -> str:
    [line] = [line for line in err.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.parametrize(
    "wrong, meant",
    [
        ("--global_batch", "did you mean --global-batch? "),
        ("--noray", "did you mean --no-ray? "),
        ("--batch-size", "did you mean --global-batch or --min-batch? "),
    ],
)
def test_a_wrong_flag_gets_the_flag_meant_and_the_commands_own_help(capsys, wrong, meant):
    code, out, err = _run(capsys, ["plan", "--cluster", str(DEMO_MIXED), "--model", "resnet18", wrong, "8"])
    assert (code, out) == (2, "")
    assert _error(err) == f"error: unrecognized arguments: {wrong} 8 ({meant}see 'batchplan plan --help')"


def test_a_flag_like_no_other_still_points_at_the_commands_help(capsys):
    code, _, err = _run(capsys, ["profile", "--gpu", "T4", "--model", "resnet18", "--zzz"])
    assert code == 2
    assert _error(err) == "error: unrecognized arguments: --zzz (see 'batchplan profile --help')"


def test_profile_refuses_a_misspelt_built_in_at_once_with_the_close_matches(capsys, monkeypatch):
    from planner.cli import profile

    def no_work(*_args, **_kwargs):
        raise AssertionError("profiled before the model name was checked")

    monkeypatch.setattr(profile, "_gather", no_work)
    code, _, err = _run(capsys, ["profile", "--gpu", "T4", "--model", "resnet51"])
    assert code == 2
    assert (
        "error: --model 'resnet51' is not a built-in workload (did you mean resnet50 or resnet18?"
        in _error(err)
    )


def test_profile_says_which_user_code_it_imports_before_it_runs_it(capsys, tmp_path):
    code, _, err = _run(
        capsys,
        [
            "profile",
            "--gpu",
            "T4",
            "--model",
            "tests.planner.tiny_models:convnet",
            "--input-shape",
            "3,32,32",
            "--cache-dir",
            str(tmp_path),
        ],
    )
    assert code == 0, err
    first = err.splitlines()[0]
    assert first.startswith("user code: importing module 'tests.planner.tiny_models' (from ")
    assert first.endswith("and calling convnet() to build the model, here")  # profile has no probes


def test_show_of_a_cluster_config_advises_planning_it_not_overwriting_it(capsys, tmp_path):
    config = tmp_path / "lab.yaml"
    config.write_text(DEMO_MIXED.read_text())
    code, _, err = _run(capsys, ["show", str(config)])
    line = _error(err)
    assert code == 2 and f"-o {config}" not in line
    assert (
        f"a cluster config rather than a plan: plan it with batchplan plan --cluster {config} -o plan.json"
        in line
    )


def test_no_gpu_and_no_cluster_named_suggests_a_simulated_cluster(capsys, monkeypatch):
    from planner.cli import planning

    def no_gpu(*_args, **_kwargs):
        raise NoGpuError("no usable GPU to plan on (no GPUs found)")

    monkeypatch.setattr(planning, "plan_with_ray", no_gpu)
    code, _, err = _run(capsys, ["plan", "--model", "resnet18", "--no-write"])
    assert code == 1
    assert "--cluster demo-mixed" in _error(err) and "none found on this machine" in _error(err)
    code, _, err = _run(capsys, ["plan", "--address", "10.0.0.1:6379", "--model", "resnet18", "--no-write"])
    assert code == 1 and _error(err) == "error: no usable GPU to plan on (no GPUs found)"  # a named cluster


def test_a_range_the_figures_cannot_show_is_not_printed(capsys):
    from planner.cli.render import render_plan
    from planner.plan.validate import validate_plan
    from tests.plans import make_plan

    document = make_plan((5, 3, 8))
    for span, shown in (([0.949, 0.951], False), ([0.90, 0.99], True)):
        render_plan(validate_plan({**document, "balance_efficiency": 0.95, "balance_efficiency_range": span}))
        out = capsys.readouterr().out
        assert ("expected at real speed" in out) is shown, out  # "0.95 (0.95-0.95 expected ...)" said nothing


def test_advise_with_an_empty_front_ends_with_an_error_line(capsys, tmp_path):
    offers = tmp_path / "offers.yaml"
    offers.write_text(
        "networks: {eth: {gbps: 10}}\noffers:\n  - {name: a, gpu: T4, gpus_per_node: 1, max_nodes: 1, "
        "price_per_node_hour: 5, network: eth, source: test, date: 2026-11-09}\n"
    )
    code, out, err = _run(
        capsys,
        [
            "advise",
            "--offers",
            str(offers),
            "--model",
            "tests.planner.tiny_models:convnet",
            "--input-shape",
            "3,32,32",
            "--budget-per-hour",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--write-clusters",
            str(tmp_path / "clusters"),
        ],
    )
    assert code == 1
    assert "rejected 1:" in out and "over --budget-per-hour 1" in out  # the result says why
    assert _error(err).startswith("error: no candidate cluster of these offers can run the job (1 left out")


@pytest.mark.slow
def test_ctrl_c_during_a_fake_pass_ends_at_the_error_line(tmp_path):
    """It exited 5.5-10 s after its error line at load 10 (the interpreter's teardown collecting the fake pass's
    tensors; torch's exit hook logged its cache statistics): the run now ends where its result is decided. The
    teardown is seen by an exit hook of the test's own (a sitecustomize on the path): it must not run."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import atexit, sys\natexit.register(lambda: sys.stderr.write('interpreter teardown ran\\n'))\n"
    )
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join((str(hooks), env["PYTHONPATH"]))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "plan",
            "--cluster",
            str(DEMO_MIXED),
            "--model",
            "resnet50",
            "--no-ray",
            "--no-cache",
            "--no-write",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while "fake pass 1 of " not in seen and time.monotonic() < deadline:
            seen += process.stderr.readline()
        process.send_signal(signal.SIGINT)  # inside the second fake pass (seconds of ResNet-50 each)
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert rest.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C)"), rest
    assert "interpreter teardown ran" not in rest and "FakeTensor cache stats" not in rest


@pytest.mark.slow  # a Python that imports torch (and Ray): about 2 s on an idle machine, over the unmarked budget
@pytest.mark.parametrize("script", ["train_ddp.py", "ray_train.py"])
def test_the_examples_help_says_what_they_do_in_whole_sentences(script):
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env({"COLUMNS": "80"}),
    )
    assert done.returncode == 0, done.stderr
    description = " ".join(done.stdout.split("\n\n")[1].split())
    assert description.startswith("Train with the batches of a plan") and description.endswith(
        "one big batch."
    )
