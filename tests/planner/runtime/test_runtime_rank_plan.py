"""planner.runtime.rank_plan: this process's entry of plan.json, checked against torchrun's environment."""

from __future__ import annotations

import json

import pytest

from planner.errors import ConfigError
from planner.runtime.rank_plan import RankPlan, load_rank_plan
from tests.plans import make_plan


def test_rank_argument_picks_that_ranks_entry_from_a_plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(make_plan(accumulate=2)))
    plan = load_rank_plan(path, rank=2, env={})
    assert plan == RankPlan(
        rank=2,
        world_size=3,
        local_rank=2,
        node_rank=0,
        batch=8,
        loss_weight=1.5,
        step_batch=16,
        global_batch=32,
        accumulate=2,
        device_index=2,
        gpu="T4",
        batches=(5, 3, 8),
    )
    assert plan.offset == 8


def test_string_path_and_mapping_give_the_same_rank_plan(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(make_plan()))
    assert load_rank_plan(str(path), rank=1, env={}) == load_rank_plan(make_plan(), rank=1, env={})


def test_a_typed_plan_and_an_indexed_file_give_the_same_rank_plan(tmp_path):
    from planner.plan.io import validate_plan, write_plan

    document = make_plan(batches=(4, 4, 4, 6, 2), nodes=(("a", 3), ("b", 2)))
    path = write_plan(document, tmp_path / "plan.json")  # with its index: only rank 4's part is read
    assert (
        load_rank_plan(validate_plan(document), rank=4, env={})
        == load_rank_plan(path, rank=4, env={})
        == load_rank_plan(document, rank=4, env={})
    )


def test_rank_comes_from_torchrun_environment_when_not_given():
    env = {"RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "1", "GROUP_RANK": "1"}
    plan = load_rank_plan(make_plan(batches=(4, 4, 4, 6, 2), nodes=(("a", 3), ("b", 2))), env=env)
    assert (plan.rank, plan.node_rank, plan.local_rank, plan.batch) == (4, 1, 1, 2)
    assert plan.loss_weight == pytest.approx(2 * 5 / 20)
    assert plan.offset == 18


def test_world_size_mismatch_says_how_many_ranks_the_plan_wants_and_how_to_launch():
    plan = make_plan(batches=(4, 4, 4, 6, 2, 4), nodes=(("a", 3), ("b", 3)))
    with pytest.raises(
        ConfigError,
        match=r"plan is for 6 ranks but WORLD_SIZE=4: re-plan .*a: --node-rank 0 "
        r"--nproc-per-node 3; b: --node-rank 1 --nproc-per-node 3",
    ):
        load_rank_plan(plan, env={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})


def test_world_size_is_checked_even_when_the_rank_is_given():
    with pytest.raises(ConfigError, match="is for 3 ranks but WORLD_SIZE=2"):
        load_rank_plan(make_plan(), rank=0, env={"WORLD_SIZE": "2"})


def test_missing_rank_outside_torchrun_is_a_clear_error():
    with pytest.raises(
        ConfigError, match="no rank given and RANK is not set: start the script with torchrun"
    ):
        load_rank_plan(make_plan(), env={})


def test_one_rank_plan_without_launcher_is_rank_zero():
    plan = load_rank_plan(make_plan(batches=(16,), nodes=(("solo", 1),)), env={})
    assert (plan.rank, plan.batch, plan.loss_weight, plan.batches) == (0, 16, 1.0, (16,))


@pytest.mark.parametrize("rank", [3, -1])
def test_rank_not_in_the_plan_is_an_error(rank):
    with pytest.raises(ConfigError, match=rf"rank {rank} is not in plan \(it has ranks 0\.\.2\)"):
        load_rank_plan(make_plan(), rank=rank, env={})


def test_environment_rank_not_in_the_plan_is_an_error():
    with pytest.raises(ConfigError, match=r"rank 7 is not in plan"):
        load_rank_plan(make_plan(), env={"RANK": "7"})


def test_nodes_started_in_another_order_are_caught_by_group_rank():
    plan = make_plan(batches=(4, 4, 4, 6, 2), nodes=(("a", 3), ("b", 2)))
    env = {"RANK": "3", "WORLD_SIZE": "5", "LOCAL_RANK": "0", "GROUP_RANK": "0"}
    with pytest.raises(
        ConfigError,
        match=r"puts rank 3 on node 'b' as node_rank 1, but torchrun started it with "
        r"GROUP_RANK=0",
    ):
        load_rank_plan(plan, env=env)


def test_local_rank_that_disagrees_with_the_plan_is_an_error():
    plan = make_plan(batches=(4, 4, 4, 6, 2), nodes=(("a", 3), ("b", 2)))
    env = {"RANK": "3", "WORLD_SIZE": "5", "LOCAL_RANK": "2", "GROUP_RANK": "1"}
    with pytest.raises(ConfigError, match=r"as local_rank 0, but torchrun started it with LOCAL_RANK=2"):
        load_rank_plan(plan, env=env)


def test_launch_position_is_not_checked_for_another_ranks_entry():
    # rank 0 may read every rank's entry (to log the plan); the environment describes rank 0 only
    env = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "GROUP_RANK": "0"}
    assert [load_rank_plan(make_plan(), rank=r, env=env).batch for r in range(3)] == [5, 3, 8]


def test_non_integer_environment_variable_is_an_error():
    with pytest.raises(ConfigError, match=r"environment variable RANK='one' is not an integer"):
        load_rank_plan(make_plan(), env={"RANK": "one"})


def test_loss_weight_that_does_not_match_its_batch_is_an_error():
    plan = make_plan()
    plan["ranks"][1]["batch"] = 4  # edited by hand: batch changed, weight not
    plan["step_batch"] = plan["global_batch"] = 17
    with pytest.raises(
        ConfigError,
        match=r"ranks\[0\]\.loss_weight is 0\.9375 but its batch 5 needs batch × "
        r"world_size / step_batch = 5 × 3 / 17",
    ):
        load_rank_plan(plan, rank=0, env={})


def test_wrong_schema_is_rejected():
    plan = make_plan()
    plan["schema"] = "batchplan/plan@0"
    with pytest.raises(ConfigError, match="schema 'batchplan/plan@0', expected 'batchplan/plan@1'"):
        load_rank_plan(plan, rank=0, env={})


def test_missing_plan_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_rank_plan(tmp_path / "nope.json", rank=0, env={})


def test_default_environment_is_os_environ(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert load_rank_plan(make_plan()).batch == 3


def _rank_plan(**changes) -> dict:
    fields = dict(
        rank=1,
        world_size=3,
        local_rank=1,
        node_rank=0,
        batch=3,
        loss_weight=9 / 16,
        step_batch=16,
        global_batch=16,
        accumulate=1,
        device_index=1,
        gpu="T4",
        batches=(5, 3, 8),
    )
    fields.update(changes)
    return fields


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rank": 3}, "rank 3 with 3 batches does not fit world_size 3"),
        ({"world_size": 4}, "does not fit world_size 4"),
        ({"batch": 4}, r"batch 4 / step_batch 16 disagree with batches \[5, 3, 8\]"),
        ({"step_batch": 17}, "disagree with batches"),
        ({"global_batch": 20}, "global_batch 20 != step_batch 16 × accumulate 1"),
        ({"loss_weight": 1.0}, r"loss_weight 1\.0 != batch × world_size / step_batch = 0\.5625"),
    ],
)
def test_rank_plan_that_contradicts_itself_is_rejected(changes, message):
    with pytest.raises(ConfigError, match=message):
        RankPlan(**_rank_plan(**changes))
