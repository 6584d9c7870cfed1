"""The ranks agree on the plan at their first iteration (``planner/runtime/plan_agreement.py``; issue #34, item
5): a stale plan on one node trained silently on overlapping slices (rc 0); now every rank stops with one line
naming the node and ranks whose plan differs. Pure checks first, then three gloo ranks on 127.0.0.1 that
iterate a ``PlannedBatchSampler`` as a training script does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.runtime.plan_agreement import SplitTerms, mismatch
from tests.gloo import run_ranks

PLAN = SplitTerms(batches=(8, 8, 4), accumulate=1, dataset_size=200, shuffle=True, seed=0, drop_last=True)
STALE = SplitTerms(batches=(6, 6, 8), accumulate=1, dataset_size=200, shuffle=True, seed=0, drop_last=True)


def _gathered(
    *terms: SplitTerms, nodes: tuple[str, ...] = ("a", "a", "b")
) -> list[tuple[str, str, SplitTerms]]:
    return [(t.digest(), node, t) for t, node in zip(terms, nodes, strict=True)]


def test_ranks_holding_the_same_terms_agree() -> None:
    assert mismatch(_gathered(PLAN, PLAN, PLAN), 3, what="the plan") is None


def test_the_ranks_holding_other_terms_are_named_with_their_node_and_both_terms() -> None:
    line = mismatch(_gathered(PLAN, PLAN, STALE), 3, what="the plan")
    assert line is not None and "\n" not in line
    assert line.startswith("the ranks do not agree on the plan: node(s) b (rank(s) 2) hold batches [6, 6, 8]")
    assert "the other 2 rank(s) batches [8, 8, 4] (3 ranks)" in line and "copy the same plan.json" in line
    # a tie: rank 0's terms are the plan's
    assert "node(s) b (rank(s) 1)" in mismatch(_gathered(PLAN, STALE, nodes=("a", "b")), 2, what="the plan")


@pytest.mark.parametrize("field", ["accumulate", "dataset_size", "seed", "shuffle", "drop_last"])
def test_every_term_that_moves_a_slice_is_compared(field: str) -> None:
    changed = {"accumulate": 2, "dataset_size": 300, "seed": 1, "shuffle": False, "drop_last": False}[field]
    other = SplitTerms(**{**PLAN.__dict__, field: changed})
    assert mismatch(_gathered(PLAN, PLAN, other), 3, what="the plan") is not None


def test_one_plan_for_another_number_of_ranks_is_said() -> None:
    line = mismatch(_gathered(PLAN, PLAN, nodes=("a", "b")), 2, what="the plan")
    assert line is not None and line.startswith("the plan is for 3 ranks but the job has 2")


def _worker(rank: int, out_dir: str, stale_rank: int | None) -> None:
    import torch.distributed as dist

    from planner.runtime.plan_agreement import PlanMismatchError
    from planner.runtime.sampler import PlannedBatchSampler

    dist.init_process_group("gloo", rank=rank, world_size=3)
    terms = STALE if rank == stale_rank else PLAN
    sampler = PlannedBatchSampler(terms.dataset_size, terms.batches, rank, seed=terms.seed)
    result: dict = {"error": None, "steps": 0}
    try:
        for _ in sampler:
            result["steps"] += 1
        dist.barrier()
    except PlanMismatchError as exc:
        result["error"] = str(exc)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("stale_rank", [None, 2])
def test_a_stale_plan_on_one_rank_ends_every_rank_with_one_line(
    tmp_path: Path, stale_rank: int | None
) -> None:
    # three gloo ranks (tests/gloo.py: every rank must exit 0, its output shown otherwise); the deadline only tells
    # a finished job from a hung one (load 10 on 2 cores)
    run_ranks(_worker, str(tmp_path), stale_rank, world_size=3, deadline_s=240, log_dir=tmp_path / "logs")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    if stale_rank is None:
        assert all(r["error"] is None and r["steps"] == 200 // 20 for r in results), results
        return
    errors = {r["error"] for r in results}
    assert len(errors) == 1 and all(r["steps"] == 0 for r in results), results  # every rank, before any batch
    [error] = errors
    assert (
        error.startswith("the ranks do not agree on the plan: node(s) ")
        and "(rank(s) 2) hold batches [6, 6, 8]" in error
    ), error
