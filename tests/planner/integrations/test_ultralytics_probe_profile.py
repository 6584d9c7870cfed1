"""planner.integrations.ultralytics_autobatch.profile_from_probes: Ultralytics' AutoBatch probe rows become a
device profile whose cap at Ultralytics' budget is Ultralytics' own choice (ultralytics#4679's T4 figures:
35, shared/reference/ultralytics-behaviour.md §1.4), and a failed probe above a success is the ceiling."""

from __future__ import annotations

import pytest

from planner.errors import InfeasiblePlanError
from tests.planner.integrations.ultralytics_helpers import require_ultralytics
from torchkit.units import GIB

pytestmark = pytest.mark.ultralytics

PROBES = [1, 2, 4, 8, 16]
T4_ISSUE_4679 = [0.654, 0.757, 1.223, 2.208, 4.154]  # GiB per probe, ultralytics#4679
T4_TOTAL = int(14.75 * GIB)
T4_AVAILABLE = int(14.5 * GIB)  # reserved + driver-free, as in the reference's row


def _rows(memory_gib: list[float]) -> list:
    """profile_ops rows: [params, GFLOPs, memory GiB, forward ms, backward ms, input, output]."""
    return [[0, 0.0, m, 10.0 + b, 20.0 + 2 * b, None, None] for b, m in zip(PROBES, memory_gib, strict=True)]


def _profile(rows: list):
    require_ultralytics()
    from planner.integrations.ultralytics_autobatch import AutoBatchRequest, profile_from_probes

    request = AutoBatchRequest(imgsz=640, amp="fp16", batch=-1, max_num_obj=4, dataset_size=0)
    return profile_from_probes(
        "T4", PROBES, rows, total_bytes=T4_TOTAL, request=request, chosen=35, where="cuda:0"
    )


def test_the_cap_at_ultralytics_budget_is_ultralytics_choice():
    profile = _profile(_rows(T4_ISSUE_4679))
    assert profile.method == "measure" and profile.amp == "fp16"
    assert profile.max_batch(int(0.6 * T4_AVAILABLE)) == 35
    assert any("Ultralytics' AutoBatch alone picks batch 35" in note for note in profile.notes)
    # the first probe's time (it pays the warm-up) is left out of the time fit
    assert [b for b, _ in profile.time_points] == PROBES[1:]


def test_a_failed_probe_above_a_success_is_the_ceiling():
    rows = _rows(T4_ISSUE_4679)
    rows[3] = None  # batch 8 ran out of memory
    profile = _profile(rows)
    assert profile.oom_batch == 8
    assert [b for b, _ in profile.memory_points] == [1, 2, 4]  # batch 16 above the failure is not trusted
    assert profile.max_batch(int(0.6 * T4_AVAILABLE)) < 8


def test_no_usable_probe_is_one_error_with_the_fix():
    with pytest.raises(
        InfeasiblePlanError,
        match=r"T4 \(cuda:0\): none of Ultralytics' AutoBatch probes .* fit "
        r"\(free GPU memory, reduce imgsz, or set batch explicitly\)",
    ):
        _profile([None] * 5)
