"""Hostile and damaged plan.json files: nothing in a plan can run a command when its output is sourced or
pasted, and ``show``, ``--emit env`` and the runtime's ``load_rank_plan`` refuse exactly the same plans.

The base plan is a real one (``batchplan plan --no-ray`` on demo-mixed); each case edits it as an attacker
or a careless hand would, and the shell side runs in a sandbox whose ``torchrun`` only records its argv.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.errors import ConfigError
from planner.runtime import load_rank_plan
from tests.hostile.shell_sandbox import Sandbox, launch_lines
from tests.planner.cli_helpers import DEMO_MIXED, TINY_MODEL, assert_ok, assert_user_error, run_cli

SCRIPT = "my jobs/train.py"
PLAN_PATH = "out dir/my plan.json"


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real 3-node plan written with a script path and a plan path that both hold a space."""
    where = tmp_path_factory.mktemp("base_plan")
    result = run_cli(
        "plan",
        "--no-ray",
        "--cluster",
        DEMO_MIXED,
        "--no-cache",
        *TINY_MODEL,
        "--global-batch",
        "480",
        "--script",
        SCRIPT,
        "-o",
        PLAN_PATH,
        cwd=where,
    )
    assert_ok(result)
    return json.loads((where / PLAN_PATH).read_text())


def _write(tmp_path: Path, plan: dict | str, name: str = "plan.json") -> Path:
    path = tmp_path / name
    path.write_text(plan if isinstance(plan, str) else json.dumps(plan, indent=1))
    return path


# --- injection: what a sourced env file or a pasted launch line could run -------------------------------


def _inject_devices(plan: dict, cmd: str) -> None:
    plan["nodes"][0]["cuda_visible_devices"] += f"; {cmd} #"


def _inject_master(plan: dict, cmd: str) -> None:
    plan["launch"]["master_addr"] = f"x; {cmd} #"


def _rename_node(plan: dict, name: str) -> None:
    old = plan["nodes"][0]["name"]
    plan["nodes"][0]["name"] = name
    for rank in plan["ranks"]:
        if rank["node"] == old:
            rank["node"] = name


def _inject_newline_name(plan: dict, cmd: str) -> None:
    _rename_node(plan, f"node-a\n{cmd} #\n")


def _inject_substitution_name(plan: dict, cmd: str) -> None:
    _rename_node(plan, f"node-$({cmd})")


def _inject_torchrun_line(plan: dict, cmd: str) -> None:
    plan["nodes"][1]["torchrun"] += f"; {cmd}"


def _inject_script(plan: dict, cmd: str) -> None:
    # what today's writer stores for --script 'x.py; CMD': the script unquoted in every line
    for node in plan["nodes"]:
        node["torchrun"] = (
            node["torchrun"].replace(shlex.quote(SCRIPT), SCRIPT).replace(SCRIPT, f"x.py; {cmd} #")
        )
    plan["launch"]["script"] = f"x.py; {cmd} #"


INJECTIONS: dict[str, Callable[[dict, str], None]] = {
    "cuda_visible_devices": _inject_devices,
    "master_addr": _inject_master,
    "node name with newlines": _inject_newline_name,
    "node name with $(...)": _inject_substitution_name,
    "torchrun line": _inject_torchrun_line,
    "script": _inject_script,
}


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_a_plan_that_would_run_a_command_is_refused_and_nothing_runs(planned, tmp_path, case) -> None:
    marker = tmp_path / "INJECTED"
    plan = copy.deepcopy(planned)
    INJECTIONS[case](plan, f"touch {marker}")
    path = _write(tmp_path, plan)
    sandbox = Sandbox(tmp_path / "sandbox")

    env_runs = [
        run_cli("show", path, "--emit", "env", *node, cwd=tmp_path) for node in ((), ("--node-rank", "0"))
    ]
    table_run = run_cli("show", path, cwd=tmp_path)
    for i, env_run in enumerate(env_runs):
        sandbox.bash(f"set -a; . {shlex.quote(str(_write(tmp_path, env_run.stdout, f'env{i}.sh')))}")
    for line in launch_lines(table_run.stdout):
        sandbox.bash(line)

    assert not marker.exists(), f"{case}: a command injected into the plan ran"
    for env_run in env_runs:
        assert_user_error(env_run, 2, "error: ")
    assert_user_error(table_run, 2, "error: ")
    with pytest.raises(ConfigError):
        load_rank_plan(path, rank=0, env={})


def test_control_characters_in_any_string_are_refused(planned, tmp_path) -> None:
    """An ANSI escape in a warning or a newline in a GPU name would forge lines of the table."""
    for edit in (
        lambda p: p["warnings"].append("\x1b[2J\x1b[Hall good"),
        lambda p: p["ranks"][0].__setitem__("gpu", "T4\nrank 9 fake"),
        lambda p: p["excluded"].append({"node": "n", "device_index": None, "gpu": None, "reason": "\r"}),
    ):
        plan = copy.deepcopy(planned)
        edit(plan)
        line = assert_user_error(
            run_cli("show", _write(tmp_path, plan), cwd=tmp_path), 2, "control character"
        )
        assert "\x1b" not in line


# --- quoting: awkward but legitimate values survive the shell intact ------------------------------------


def test_launch_lines_and_env_keep_paths_with_spaces_as_one_word(planned, tmp_path) -> None:
    path = _write(tmp_path, planned)
    sandbox = Sandbox(tmp_path / "sandbox")
    table = run_cli("show", path, cwd=tmp_path)
    assert_ok(table)
    lines = launch_lines(table.stdout)
    assert len(lines) == len(planned["nodes"]) == 3
    for line in lines:
        assert_ok(sandbox.bash(line))
    calls = sandbox.calls()
    assert [c["argv"][-3:] for c in calls] == [[SCRIPT, "--plan", PLAN_PATH]] * 3
    assert [c["argv"][c["argv"].index("--node-rank") + 1] for c in calls] == ["0", "1", "2"]
    assert [c["env"]["CUDA_VISIBLE_DEVICES"] for c in calls] == [
        n["cuda_visible_devices"] for n in planned["nodes"]
    ]
    assert [n["torchrun"] for n in planned["nodes"]] == lines  # plan.json holds the very lines printed


def test_emit_env_for_one_node_exports_what_torchrun_needs(planned, tmp_path) -> None:
    path = _write(tmp_path, planned)
    sandbox = Sandbox(tmp_path / "sandbox")
    for selector in (("--node", "node-v100"), ("--node-rank", "1")):
        result = run_cli("show", path, "--emit", "env", *selector, cwd=tmp_path)
        assert_ok(result)
        env_file = _write(tmp_path, result.stdout, "env.sh")
        # plain `.` (no set -a): the lines export themselves; then a launcher started from that shell sees them
        ran = sandbox.bash(
            f'. {shlex.quote(str(env_file))} && torchrun --nnodes "$NNODES" {shlex.quote(SCRIPT)}'
        )
        assert_ok(ran)
    calls = sandbox.calls()
    node = planned["nodes"][1]
    expected = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": node["cuda_visible_devices"],
        "NNODES": "3",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": str(node["nproc_per_node"]),
        "MASTER_ADDR": planned["launch"]["master_addr"],
        "MASTER_PORT": "29500",
    }
    assert [c["env"] for c in calls] == [expected, expected]
    assert calls[0]["argv"] == ["--nnodes", "3", SCRIPT]
    assert node["env"] == expected  # plan.json holds each node's environment too


def test_emit_env_on_a_multi_node_plan_asks_which_node(planned, tmp_path) -> None:
    path = _write(tmp_path, planned)
    line = assert_user_error(run_cli("show", path, "--emit", "env", cwd=tmp_path), 2, "--node", "--node-rank")
    for name in ("node-a100", "node-v100", "node-t4"):
        assert name in line
    assert_user_error(
        run_cli("show", path, "--emit", "env", "--node", "nope", cwd=tmp_path), 2, "nope", "node-t4"
    )
    assert_user_error(run_cli("show", path, "--emit", "env", "--node-rank", "3", cwd=tmp_path), 2, "0..2")


# --- numbers and identities: show refuses what the runtime refuses --------------------------------------


def _set(path: tuple, value) -> Callable[[dict], None]:
    def edit(plan: dict) -> None:
        target = plan
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _stale_weights(plan: dict) -> None:
    plan["ranks"][0]["batch"] += 8
    plan["step_batch"] += 8
    plan["global_batch"] = plan["step_batch"] * plan["accumulate"]


def _accumulate(value: int) -> Callable[[dict], None]:
    def edit(plan: dict) -> None:
        plan["accumulate"] = value
        plan["global_batch"] = plan["step_batch"] * value

    return edit


def _no_ranks(plan: dict) -> None:
    plan.update(world_size=0, ranks=[], nodes=[], step_batch=0, global_batch=0)


def _duplicate_local_rank(plan: dict) -> None:
    plan["ranks"][1]["local_rank"] = plan["ranks"][0]["local_rank"]


def _more_procs(plan: dict) -> None:
    plan["nodes"][0]["nproc_per_node"] += 1


NUMERIC_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "NaN loss weight": (_set(("ranks", 0, "loss_weight"), float("nan")), "NaN"),
    "Infinity step time": (_set(("predicted_step_time_s",), float("inf")), "Infinity"),
    "loss weight 2.5": (_set(("ranks", 0, "loss_weight"), 2.5), "loss_weight"),
    "stale loss weights": (_stale_weights, "loss_weight"),
    "accumulate 0": (_accumulate(0), "accumulate"),
    "accumulate -2": (_accumulate(-2), "accumulate"),
    "world size 0": (_no_ranks, "world_size"),
    "nproc_per_node contradicts the ranks": (_more_procs, "nproc_per_node"),
    "duplicate local_rank": (_duplicate_local_rank, "local_rank"),
    "NaN in a profile fit": (
        lambda p: next(iter(p["profiles"].values()))["memory_fit"].__setitem__(
            "bytes_per_sample", float("nan")
        ),
        "NaN",
    ),
    "negative bytes per sample": (
        lambda p: next(iter(p["profiles"].values()))["memory_fit"].__setitem__("bytes_per_sample", -1.0),
        "memory_fit",
    ),
}


@pytest.mark.parametrize("case", sorted(NUMERIC_CASES))
def test_show_and_the_runtime_refuse_the_same_broken_plans(planned, tmp_path, case) -> None:
    edit, word = NUMERIC_CASES[case]
    plan = copy.deepcopy(planned)
    edit(plan)
    path = _write(tmp_path, plan)  # json.dumps writes NaN and Infinity as the bare words a hand editor would
    shown = assert_user_error(run_cli("show", path, cwd=tmp_path), 2, word)
    assert_user_error(run_cli("show", path, "--emit", "env", "--node-rank", "0", cwd=tmp_path), 2, word)
    with pytest.raises(ConfigError) as refused:
        load_rank_plan(path, rank=0, env={})
    assert shown == f"error: {refused.value}"


def test_the_plan_as_saved_passes_all_three(planned, tmp_path) -> None:
    path = _write(tmp_path, planned)
    assert_ok(run_cli("show", path, cwd=tmp_path))
    assert_ok(run_cli("show", path, "--emit", "env", "--node", "node-a100", cwd=tmp_path))
    assert load_rank_plan(path, rank=5, env={}).rank == 5


# --- size and nesting: limits checked before parsing -----------------------------------------------------


def test_a_deeply_nested_plan_is_an_error_naming_the_limit(planned, tmp_path) -> None:
    text = json.dumps(planned).replace(
        '"job": {', '"job": {"deep": ' + "[" * 100_000 + "]" * 100_000 + ", ", 1
    )
    path = _write(tmp_path, text)
    assert_user_error(run_cli("show", path, cwd=tmp_path), 2, "nested", "limit")
    with pytest.raises(ConfigError, match="nested .* limit"):
        load_rank_plan(path, rank=0, env={})


def test_a_huge_plan_file_is_refused_before_it_is_read(tmp_path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:
        handle.truncate(200 << 20)  # sparse: 200 MiB that cost no disk, and must cost no memory either
    assert_user_error(run_cli("show", path, cwd=tmp_path), 2, "over the limit")
    with pytest.raises(ConfigError, match="over the limit"):
        load_rank_plan(path, rank=0, env={})


# --- plans that passed the validator and crashed a renderer (issue 25: no traceback, exit 2) --------------


def _job(field: str, value) -> Callable[[dict], None]:
    return _set(("job", field), value)


CRASH_CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "alternatives a string": (_set(("alternatives",), "fast"), "alternatives must be dict/null"),
    "alternatives an int": (_set(("alternatives",), 3), "alternatives must be dict/null"),
    "alternatives of strings": (
        _set(("alternatives",), {"balanced": "1000"}),
        "alternatives['balanced'] must be",
    ),
    "notes an int": (_set(("notes",), 7), "notes must be list"),
    "a note an int": (_set(("notes",), [7]), "notes[0] must be a string"),
    "job.input_shape an int": (_job("input_shape", 5), "job.input_shape must be a list"),
    "job.input_shape of strings": (_job("input_shape", ["3"]), "job.input_shape ('3',) is invalid"),
    "a lone surrogate in a warning": (lambda p: p["warnings"].append("ok \ud800"), "lone surrogate"),
    "a lone surrogate in a node name": (lambda p: _rename_node(p, "node-\udfff"), "lone surrogate"),
    "job.multiple_of -3": (_job("multiple_of", -3), "job.multiple_of -3 is invalid"),
    "job.fraction 7": (_job("fraction", 7), "job.fraction 7 is invalid"),
    "job.amp unknown": (_job("amp", "fp8"), "job.amp 'fp8' is invalid"),
    "speed_factor 0": (_set(("ranks", 0, "speed_factor"), 0), "speed_factor must be"),
    "idle_fraction a string": (_set(("ranks", 0, "idle_fraction"), "0.5"), "idle_fraction must be"),
    "node env of numbers": (_set(("nodes", 0, "env"), {"NODE_RANK": 0}), "env must map names to strings"),
    "excluded gpu an int": (
        lambda p: p["excluded"].append({"node": "n", "device_index": 0, "gpu": 4, "reason": "x"}),
        "excluded[0].gpu must be str/null",
    ),
    "a profile's notes an int": (
        lambda p: next(iter(p["profiles"].values())).__setitem__("notes", 3),
        "notes must be",
    ),
    "a point above its own range": (
        _set(("balance_efficiency_range",), [0.1, 0.2]),
        "outside its own expected range",
    ),
    "a rank time off its profile": (
        lambda p: p["ranks"][0].__setitem__(
            "predicted_step_time_s", p["ranks"][0]["predicted_step_time_s"] * 2
        ),
        "ranks[0].predicted_step_time_s",
    ),
}


@pytest.mark.parametrize("case", sorted(CRASH_CASES))
def test_plans_that_crashed_show_and_emit_env_are_one_line_errors(planned, tmp_path, case) -> None:
    """Every field is typed before a renderer sees it; job fields are named as the plan names them, never as
    the CLI flag that would set them (``--multiple-of``)."""
    edit, words = CRASH_CASES[case]
    plan = copy.deepcopy(planned)
    edit(plan)
    path = _write(tmp_path, plan)
    shown = assert_user_error(run_cli("show", path, cwd=tmp_path), 2, words)
    assert_user_error(run_cli("show", path, "--emit", "env", "--node-rank", "0", cwd=tmp_path), 2, words)
    assert_user_error(run_cli("show", path, "--json", cwd=tmp_path), 2, words)
    assert "--multiple-of" not in shown and "--fraction" not in shown
    with pytest.raises(ConfigError) as refused:
        load_rank_plan(path, rank=0, env={})
    assert shown == f"error: {refused.value}"


def test_a_plan_written_with_its_index_and_then_tampered_is_refused_by_every_rank_as_by_show(
    planned, tmp_path
):
    """The index beside a plan (``plan.json.index``) lets a rank read only its part; a plan edited after it was
    written no longer matches it, and every rank reports what ``show`` reports."""
    from planner.plan.io import write_plan

    path = write_plan(planned, tmp_path / "plan.json")
    assert (tmp_path / "plan.json.index").is_file()
    assert load_rank_plan(path, rank=5, env={}).rank == 5
    text = path.read_text()
    path.write_text(text.replace('"loss_weight": ', '"loss_weight": 1', 1))  # rank 0's weight, in place
    shown = assert_user_error(run_cli("show", path, cwd=tmp_path), 2, "loss_weight")
    for rank in (0, 5):
        with pytest.raises(ConfigError) as refused:
            load_rank_plan(path, rank=rank, env={})
        assert shown == f"error: {refused.value}"


@pytest.mark.slow  # a subprocess reads a 128 MiB plan
def test_a_small_plan_padded_to_the_size_limit_costs_memory_of_a_few_times_its_size(
    planned, tmp_path
) -> None:
    """127 MiB of spaces inside a valid plan cost 2.4 GiB to read (a regular expression and an int64 per byte
    for the nesting count); now the nesting is counted on the quotes and brackets alone."""
    import subprocess
    import sys

    from planner.plan.validate import MAX_PLAN_BYTES

    text = json.dumps(planned)
    path = tmp_path / "padded.json"
    path.write_text(text[:-1] + " " * (MAX_PLAN_BYTES - len(text) - 16) + "}")
    # the child's own peak (VmHWM, KiB): ru_maxrss would include the RSS its parent had when it forked, and a
    # test process that has run other tests may be past the bound by itself
    code = (
        "import sys; from planner.plan.io import load_plan; load_plan(sys.argv[1]); "
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    peak_mib = int(done.stdout.strip()) / 1024
    assert peak_mib < 6 * MAX_PLAN_BYTES / 2**20, (
        f"{peak_mib:.0f} MiB to read a {MAX_PLAN_BYTES >> 20} MiB plan"
    )
