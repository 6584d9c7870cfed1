"""README's first output block is what its first command prints (``tests/readme_first_run.py``): the set-up
line's command, run as a newcomer runs it (with Ray, a fresh profile cache), compared with the block whole.
When the output changes on purpose, ``python tests/readme_first_run.py --write`` rewrites the block from a
real run."""

from __future__ import annotations

import pytest

from tests.readme_first_run import difference, documented_block, first_command, run_first_command

REGENERATE = "python tests/readme_first_run.py --write"


def test_the_output_block_shows_the_set_up_lines_command() -> None:
    assert (
        first_command()
        == "batchplan plan --cluster cluster_configs/demo-mixed.yaml --model resnet50 --global-batch 768"
    )
    _, lines = documented_block()
    assert lines and lines[0].startswith("plan for resnet50 ")


@pytest.mark.slow
@pytest.mark.ray
def test_readmes_first_command_prints_readmes_first_block(tmp_path) -> None:
    result = run_first_command(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    printed = result.stdout.rstrip("\n").split("\n")
    _, documented = documented_block()
    assert printed == documented, (
        f"README.md's first output block differs from what its first command prints (if the change is meant, "
        f"regenerate the block with `{REGENERATE}` and review the diff):\n{difference(documented, printed)}"
    )


@pytest.mark.slow  # a whole plan without Ray, three GPU types estimated: 2.1 s of CPU in one run
def test_the_shipped_demo_config_draws_no_warning_about_itself(tmp_path) -> None:
    """The first plan a newcomer sees must not tell them to fix the file we ship: the network between its
    nodes is stated (it warned "the network between nodes is not stated ... state it in the cluster config")."""
    from planner.cluster import load_cluster
    from planner.driver import DriverOptions, plan_without_ray
    from planner.job import JobSpec
    from planner.profiles.cache import ProfileCache
    from tests.planner.cli_helpers import DEMO_MIXED

    job = JobSpec(model="tests.planner.tiny_models:convnet", input_shape=(3, 32, 32), global_batch=96)
    plan = plan_without_ray(
        job, load_cluster(DEMO_MIXED), options=DriverOptions(cache=ProfileCache(tmp_path))
    ).plan
    about_the_config = [w for w in plan.warnings if "cluster config" in w or "not stated" in w]
    assert about_the_config == []
    assert not any("assumed network" in n for n in plan.notes)
