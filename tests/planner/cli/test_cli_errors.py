"""Bad input to ``batchplan``, driven as a user would (``run_cli``: ``main`` in this process, read as a
subprocess would be): every case exits 2 (1 for an infeasible plan), prints nothing on stdout, ends stderr with
one ``error: ...`` line naming what was wrong (the file, the flag, the value), names only flags that exist, and
shows no traceback unless ``--debug`` is given.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.planner.cli_helpers import (
    DEMO_MIXED,
    TINY_MODEL,
    assert_user_error,
    describe,
    flags_named_in,
    known_flags,
    run_cli,
)

#: plan a simulated cluster in-process (no Ray), no cache, no plan.json
NO_RAY = ("--no-ray", "--cluster", str(DEMO_MIXED), "--no-cache", "--no-write")

_T4_CONFIG = "name: t4-only\nnodes:\n  - name: box\n    gpus: [{type: T4, count: 2}]\n"
_FILES = {
    # a flow sequence that never closes
    "bad_syntax.yaml": "name: x\nnodes:\n  - name: a\n    gpus: [{type: T4, count: 1}\n",
    "unknown_gpu.yaml": "name: x\nnodes:\n  - name: a\n    gpus: [{type: A100-80, count: 1}]\n",
    "unknown_key.yaml": "name: x\nnodes:\n  - name: a\n    colour: red\n    gpus: [{type: T4, count: 1}]\n",
    "count_zero.yaml": "name: x\nnodes:\n  - name: a\n    gpus: [{type: T4, count: 0}]\n",
    "empty.yaml": "",
    "t4.yaml": _T4_CONFIG,
    "not_json.json": "{not json\n",
    "wrong_schema.json": '{"schema": "someone-else/plan@7", "ranks": []}\n',
    "a_list.json": "[1, 2, 3]\n",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The bad input files, by stem (``bad_syntax``, ...), plus ``dir`` (where they are)."""
    where = tmp_path_factory.mktemp("bad_inputs")
    paths = {"dir": str(where)}
    for name, text in _FILES.items():
        (where / name).write_text(text)
        paths[name.split(".")[0]] = str(where / name)
    paths["missing_yaml"] = str(where / "no-such-cluster.yaml")
    paths["missing_json"] = str(where / "no-such-plan.json")
    return paths


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# (argv, exit code, words the error line must contain); "{name}" is replaced by the path of file ``name``
CASES = [
    # ---- cluster config files
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{bad_syntax}", *TINY_MODEL),
        2,
        ("{bad_syntax}", "YAML"),
        id="yaml-syntax",
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{unknown_gpu}", *TINY_MODEL),
        2,
        ("{unknown_gpu}", "A100-80", "catalog"),
        id="unknown-gpu-type",
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{unknown_key}", *TINY_MODEL),
        2,
        ("{unknown_key}", "colour"),
        id="unknown-config-key",
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{count_zero}", *TINY_MODEL),
        2,
        ("{count_zero}", "count"),
        id="gpu-count-0",
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{empty}", *TINY_MODEL), 2, ("{empty}", "empty"), id="empty-config"
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{missing_yaml}", *TINY_MODEL),
        2,
        ("{missing_yaml}", "does not exist"),
        id="missing-cluster-file",
    ),
    pytest.param(
        ("preflight", "--no-ray", "--cluster", "{missing_yaml}", *TINY_MODEL),
        2,
        ("{missing_yaml}",),
        id="preflight-missing-cluster-file",
    ),
    pytest.param(
        ("catalog", "--cluster", "{unknown_key}"), 2, ("{unknown_key}", "colour"), id="catalog-bad-config"
    ),
    # ---- plan files
    pytest.param(("show", "{missing_json}"), 2, ("{missing_json}", "does not exist"), id="missing-plan-file"),
    pytest.param(("show", "{not_json}"), 2, ("{not_json}", "not valid JSON"), id="plan-not-json"),
    pytest.param(
        ("show", "{wrong_schema}"), 2, ("{wrong_schema}", "batchplan/plan@1"), id="plan-wrong-schema"
    ),
    pytest.param(("show", "{a_list}"), 2, ("{a_list}", "object"), id="plan-not-an-object"),
    # ---- job flags
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--fraction", "1.5"), 2, ("--fraction 1.5",), id="fraction-1.5"
    ),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--fraction", "0"), 2, ("--fraction",), id="fraction-0"),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--fraction", "nan"), 2, ("--fraction nan",), id="fraction-nan"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--global-batch", "-4"),
        2,
        ("--global-batch -4",),
        id="global-batch-negative",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--global-batch", "1e3"),
        2,
        ("--global-batch", "1e3"),
        id="global-batch-not-int",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--global-batch", "10", "--multiple-of", "4"),
        2,
        ("--global-batch 10", "--multiple-of 4", "8 or 12"),
        id="global-batch-not-multiple",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--multiple-of", "0"), 2, ("--multiple-of 0",), id="multiple-of-0"
    ),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--min-batch", "0"), 2, ("--min-batch 0",), id="min-batch-0"),
    pytest.param(("plan", *NO_RAY, "--model", "resnet18", "--imgsz", "0"), 2, ("--imgsz 0",), id="imgsz-0"),
    pytest.param(
        ("plan", *NO_RAY, "--model", "gpt2-small", "--seq-len", "-1"),
        2,
        ("--seq-len -1",),
        id="seq-len-negative",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--mode", "fastest"), 2, ("--mode", "fastest"), id="mode-unknown"
    ),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--amp", "fp8"), 2, ("--amp", "fp8"), id="amp-unknown"),
    pytest.param(
        ("plan", *NO_RAY, "--model", "tests.planner.tiny_models:convnet", "--input-shape", "0,32,32"),
        2,
        ("--input-shape", "0,32,32"),
        id="input-shape-zero",
    ),
    pytest.param(
        ("plan", *NO_RAY, "--model", "tests.planner.tiny_models:convnet", "--input-shape", "3,x,2"),
        2,
        ("--input-shape", "3,x,2"),
        id="input-shape-not-numbers",
    ),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--gpus", "a,b"), 2, ("a,b",), id="gpus-malformed"),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--gpus", "5"), 2, ("GPU 5", "0, 1"), id="gpus-index-missing"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--max-utilization", "2"),
        2,
        ("--max-utilization",),
        id="max-utilization-2",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--min-memory-fraction", "-0.1"),
        2,
        ("--min-memory-fraction",),
        id="min-memory-fraction-negative",
    ),
    # ---- cluster and output flags
    pytest.param(
        ("plan", "--no-ray", *TINY_MODEL), 2, ("--no-ray", "--cluster"), id="no-ray-without-cluster"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--plot", "file.txt"),
        2,
        ("--plot file.txt", ".png"),
        id="plot-not-png",
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--raylet-cap", "0"), 2, ("--raylet-cap 0",), id="raylet-cap-0"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--probe-timeout", "0"), 2, ("--probe-timeout",), id="probe-timeout-0"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--workers", "-1"), 2, ("--workers -1",), id="workers-negative"
    ),
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--master-port", "70000"),
        2,
        ("--master-port 70000",),
        id="master-port-too-big",
    ),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--emit", "yaml"), 2, ("--emit", "yaml"), id="emit-unknown"),
    pytest.param(
        ("plan", "--cluster", str(DEMO_MIXED), "--address", "auto", *TINY_MODEL),
        2,
        ("--address", "--cluster"),
        id="cluster-and-address",
    ),
    # ---- preflight thresholds
    pytest.param(
        ("preflight", *NO_RAY[:-1], *TINY_MODEL, "--max-imbalance", "2"),
        2,
        ("--max-imbalance",),
        id="max-imbalance-2",
    ),
    pytest.param(
        ("preflight", *NO_RAY[:-1], *TINY_MODEL, "--expect-gpus", "0"),
        2,
        ("--expect-gpus 0",),
        id="expect-gpus-0",
    ),
    pytest.param(
        ("preflight", *NO_RAY[:-1], *TINY_MODEL, "--min-subset-gain", "0.5"),
        2,
        ("--min-subset-gain 0.5",),
        id="min-subset-gain-below-1",
    ),
    # ---- profile
    pytest.param(("profile", *TINY_MODEL), 2, ("--gpu", "--device"), id="profile-without-gpu-or-device"),
    pytest.param(
        ("profile", *TINY_MODEL, "--gpu", "UNKNOWN"), 2, ("UNKNOWN", "catalog"), id="profile-unknown-gpu"
    ),
    pytest.param(
        ("profile", *TINY_MODEL, "--gpu", "T4", "--method", "measure"),
        2,
        ("--method measure",),
        id="profile-measure-a-catalog-gpu",
    ),
    pytest.param(
        ("profile", *TINY_MODEL, "--gpu", "T4", "--plot", "curve.pdf"),
        2,
        ("--plot curve.pdf",),
        id="profile-plot-not-png",
    ),
    pytest.param(
        ("profile", *TINY_MODEL, "--device", "0"),
        2,
        ("--device 0", "--gpu"),
        id="profile-device-no-cuda",
        marks=[pytest.mark.skipif("_cuda_available()", reason="this machine has a CUDA GPU")],
    ),
    # ---- devices
    pytest.param(("devices", "--select", "a,b"), 2, ("a,b",), id="devices-select-malformed"),
    pytest.param(
        ("devices", "--max-utilization", "2"), 2, ("--max-utilization",), id="devices-max-utilization-2"
    ),
    # ---- models (these build the model: a few seconds each)
    pytest.param(
        ("plan", *NO_RAY, "--model", "nosuchmodel"), 2, ("nosuchmodel", "resnet50"), id="unknown-model"
    ),
    pytest.param(
        ("plan", *NO_RAY, "--model", "nosuch_pkg.models:net", "--input-shape", "3,32,32"),
        2,
        ("nosuch_pkg",),
        id="factory-module-missing",
    ),
    pytest.param(
        ("plan", *NO_RAY, "--model", "tests.planner.tiny_models:nosuch", "--input-shape", "3,32,32"),
        2,
        ("nosuch",),
        id="factory-function-missing",
    ),
    pytest.param(
        ("plan", *NO_RAY, "--model", "tests.planner.tiny_models:convnet"),
        2,
        ("--input-shape",),
        id="factory-without-input-shape",
    ),
    pytest.param(
        ("plan", *NO_RAY, "--model", "tests.planner.tiny_models:convnet", "--input-shape", "5,32,32"),
        2,
        ("5, 32, 32", "--input-shape"),
        id="input-shape-does-not-fit-model",
    ),
    pytest.param(
        ("plan", "--no-ray", "--cluster", "{t4}", "--no-cache", "--no-write", *TINY_MODEL, "--amp", "bf16"),
        2,
        ("--amp bf16", "T4"),
        id="bf16-on-t4",
    ),
    # ---- infeasible: exit 1
    pytest.param(
        ("plan", *NO_RAY, *TINY_MODEL, "--global-batch", "3"),
        1,
        ("global batch 3", "6"),
        id="global-batch-below-one-per-rank",
    ),
    # ---- the command line itself
    pytest.param(("frobnicate",), 2, ("frobnicate",), id="unknown-command"),
    pytest.param(("plan", *NO_RAY, *TINY_MODEL, "--colour", "red"), 2, ("--colour",), id="unknown-flag"),
    pytest.param(("plan", *NO_RAY), 2, ("--model",), id="model-missing"),
]


def _command_of(argv: tuple[str, ...]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


@pytest.mark.parametrize(("argv", "code", "words"), CASES)
def test_bad_input_is_one_error_line_with_the_documented_exit_code(
    argv: tuple[str, ...], code: int, words: tuple[str, ...], files: dict[str, str]
) -> None:
    argv = tuple(a.format(**files) for a in argv)
    result = run_cli(*argv, cwd=files["dir"])
    last = assert_user_error(result, code, *(w.format(**files) for w in words))
    assert sum(line.startswith("error:") for line in result.stderr.splitlines()) == 1, describe(result)
    unknown = flags_named_in(last) - known_flags(_command_of(argv)) - set(argv)  # (an unknown flag is echoed)
    assert not unknown, f"the error names flags that do not exist: {sorted(unknown)}: {last}"


def test_there_are_at_least_twenty_bad_inputs() -> None:
    assert len(CASES) >= 20


# ---------------------------------------------------------------------------------------------------------
# writing results: the path is checked


def _plan_argv(*extra: str) -> tuple[str, ...]:
    return ("plan", "--no-ray", "--cluster", str(DEMO_MIXED), "--no-cache", *TINY_MODEL, *extra)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "flag"),
    [
        pytest.param("directory", "-o", id="output-is-a-directory"),
        pytest.param("under-a-file", "-o", id="output-under-a-file"),
        pytest.param("under-a-file", "--plot", id="plot-under-a-file"),
    ],
)
def test_an_unwritable_output_path_is_a_user_error(tmp_path: Path, where: str, flag: str) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    name = "plan.json" if flag == "-o" else "plan.png"
    target = tmp_path / "out-dir" if where == "directory" else tmp_path / "a-file" / name
    if where == "directory":
        target.mkdir()
    extra = ("-o", str(target)) if flag == "-o" else ("--no-write", "--plot", str(target))
    result = run_cli(*_plan_argv(*extra), cwd=tmp_path)
    assert_user_error(result, 2, str(target))


# ---------------------------------------------------------------------------------------------------------
# an unreachable cluster


@pytest.mark.slow
def test_an_unreachable_address_fails_fast_with_exit_2_naming_it(tmp_path: Path) -> None:
    result = run_cli(
        "plan", "--address", "127.0.0.1:1", *TINY_MODEL, "--no-cache", "--no-write", cwd=tmp_path, timeout=60
    )
    assert_user_error(result, 2, "127.0.0.1:1")


# ---------------------------------------------------------------------------------------------------------
# --debug


def test_debug_shows_the_traceback_of_a_user_error(files: dict[str, str]) -> None:
    result = run_cli(
        "--debug", "plan", "--no-ray", "--cluster", files["unknown_key"], *TINY_MODEL, cwd=files["dir"]
    )
    assert result.returncode != 0, describe(result)
    assert "Traceback (most recent call last)" in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    raised = next(line for line in lines if line.startswith("torchkit.errors.ConfigError: "))
    assert files["unknown_key"] in raised and "colour" in raised
    assert lines[-1].startswith("error: ") and "colour" in lines[-1]


def test_debug_keeps_the_exit_code_of_a_user_error(files: dict[str, str]) -> None:
    result = run_cli(
        "--debug", "plan", "--no-ray", "--cluster", files["unknown_key"], *TINY_MODEL, cwd=files["dir"]
    )
    assert result.returncode == 2, describe(result)
