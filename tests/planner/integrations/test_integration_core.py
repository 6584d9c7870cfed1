"""The framework-neutral pieces of planner.integrations, without any trainer library: where the rank's plan
comes from, the accumulation rule, the loss factor, the summary, and the one-line error of a missing library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import ConfigError
from planner.integrations.optional import MissingLibraryError, missing_library
from planner.integrations.plan_source import RankLaunch, resolve_plan
from planner.integrations.planned_run import PlannedRun, Rebalance, rebalance_options
from planner.runtime.weights import LossReduction, LossRule
from tests.plans import make_plan

REPO = Path(__file__).resolve().parents[3]
PLAN = make_plan((2, 5, 9), accumulate=2)


def _run(rank: int = 1, world_size: int = 3, plan=None) -> PlannedRun:
    launch = RankLaunch(rank=rank, world_size=world_size, local_rank=rank, node_rank=0)
    return PlannedRun(resolve_plan(plan if plan is not None else PLAN, launch), framework="test")


def test_a_plan_file_gives_the_rank_its_entry_and_names_where_it_came_from(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    resolved = resolve_plan(path, RankLaunch(rank=2, world_size=3, local_rank=2, node_rank=0))
    assert (resolved.rank_plan.batch, resolved.rank_plan.accumulate, resolved.rank_plan.batches) == (
        9,
        2,
        (2, 5, 9),
    )
    assert resolved.origin == str(path) and resolved.plan == path


def test_a_launch_of_another_size_or_numbering_than_the_plan_is_refused():
    with pytest.raises(ConfigError, match="is for 3 ranks but WORLD_SIZE=2"):
        resolve_plan(PLAN, RankLaunch(rank=0, world_size=2, local_rank=0))
    with pytest.raises(ConfigError, match="LOCAL_RANK=0"):
        resolve_plan(PLAN, RankLaunch(rank=1, world_size=3, local_rank=0, node_rank=0))


def test_autobatch_options_belong_to_a_job_not_to_a_plan_file():
    with pytest.raises(ConfigError, match=r"autobatch options are for a JobSpec"):
        resolve_plan(PLAN, RankLaunch(rank=0, world_size=3, local_rank=0), autobatch={"gpu": "T4"})


@pytest.mark.parametrize(("configured", "expected"), [(1, 2), (2, 2)])
def test_accumulation_left_at_one_or_equal_takes_the_plan_s(configured, expected):
    assert _run().accumulation(configured, "accumulate_grad_batches") == expected


def test_another_accumulation_is_one_line_naming_the_setting():
    with pytest.raises(ConfigError) as info:
        _run().accumulation(4, "gradient_accumulation_steps")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("gradient_accumulation_steps=4 contradicts the plan's accumulate 2")
    assert "leave gradient_accumulation_steps at 1 or set it to 2" in message


def test_the_factor_is_the_weight_under_the_mean_rule_and_one_otherwise():
    run = _run(rank=1)
    with pytest.raises(ConfigError, match="loss rule is not decided"):
        run.loss_factor()
    run.set_rule(LossRule(reduction=LossReduction.MEAN, why="test"))
    assert run.loss_factor() == pytest.approx(5 * 3 / 16)
    run.set_rule(LossRule(reduction=LossReduction.GLOBAL_MEAN, why="test"))
    assert run.loss_factor() == 1.0


def test_one_sampler_per_run_for_one_dataset():
    run = _run(rank=2)
    sampler = run.make_sampler(128, seed=3)
    assert run.make_sampler(128) is sampler and (sampler.rank_batch, sampler.accumulate, sampler.seed) == (
        9,
        2,
        3,
    )
    with pytest.raises(ConfigError, match="one planned run trains one dataset"):
        run.make_sampler(64)


def test_the_summary_names_the_split_the_rule_and_the_plan():
    run = _run(rank=0)
    run.set_rule(LossRule(reduction=LossReduction.MEAN, why="because"))
    summary = run.summary()
    assert summary["batchplan_batches"] == [2, 5, 9] and summary["batchplan_loss_rule"] == "mean"
    assert summary["batchplan_loss_factor"] == pytest.approx(2 * 3 / 16)
    assert summary["batchplan_global_batch"] == 32 and summary["batchplan_accumulate"] == 2
    line = run.summary_line()
    assert line.startswith(
        "batchplan: test, rank 0/3: batches [2, 5, 9] accumulate 2 global batch 32; loss rule mean"
    )


def test_rebalance_is_one_argument():
    assert rebalance_options(False) is None and rebalance_options(None) is None
    assert rebalance_options(True) == Rebalance()
    options = Rebalance(collective_timeout_s=5.0)
    assert rebalance_options(options) is options
    with pytest.raises(ConfigError, match="rebalance must be True, False or"):
        rebalance_options("yes")


def test_a_missing_library_is_one_line_naming_the_pip_command():
    error = missing_library(
        ModuleNotFoundError("No module named 'lightning'", name="lightning"),
        "lightning",
        integration="planner.integrations.lightning",
        pip="'lightning>=2.0'",
    )
    assert isinstance(error, MissingLibraryError) and isinstance(error, ImportError)
    assert (
        str(error)
        == "planner.integrations.lightning needs lightning, which is not installed (pip install 'lightning>=2.0')"
    )
    broken = missing_library(
        RuntimeError("operator torchvision::nms does not exist\nmore"),
        "transformers",
        integration="planner.integrations.huggingface",
        pip="x",
    )
    assert str(broken) == (
        "planner.integrations.huggingface needs transformers, which is installed but fails to "
        "import: RuntimeError: operator torchvision::nms does not exist (fix or reinstall the "
        "package it names)"
    )


def test_a_library_broken_underneath_is_named_by_the_error_at_the_root_of_the_chain():
    # transformers' lazy names wrap a failing dependency in their own ModuleNotFoundError
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as inner:
            raise ModuleNotFoundError("Could not import module 'Trainer'.") from inner
    except ModuleNotFoundError as outer:
        error = missing_library(outer, "transformers", integration="x", pip="y")
    assert "fails to import: RuntimeError: operator torchvision::nms does not exist" in str(error)


@pytest.mark.parametrize(
    ("module", "library", "pip"),
    [
        (
            "planner.integrations.huggingface",
            "transformers",
            "pip install 'transformers>=4.45' 'accelerate>=0.26'",
        ),
        ("planner.integrations.accelerate", "accelerate", "pip install 'accelerate>=0.26'"),
        ("planner.integrations.lightning", "lightning", "pip install 'lightning>=2.0'"),
    ],
)
def test_importing_an_integration_without_its_library_says_what_to_install(module, library, pip):
    # the library hidden (None in sys.modules is how Python marks a module that cannot be imported)
    code = (
        f"import sys; sys.modules[{library!r}] = None\n"
        "from planner.integrations.optional import MissingLibraryError\n"
        f"try:\n    import {module}\nexcept MissingLibraryError as e:\n    print(e)\nelse:\n    print('imported')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{module} needs {library}, which is not installed ({pip})"
