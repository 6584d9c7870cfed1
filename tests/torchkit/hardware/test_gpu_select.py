"""torchkit.hardware.gpu_select: the pure GPU selection (idle ranking, ``select_gpus`` specs and thresholds)."""

from __future__ import annotations

import pytest
from fake_pynvml import GIB
from hypothesis import given, settings
from hypothesis import strategies as st

from torchkit.errors import ConfigError
from torchkit.hardware.gpu_select import (
    GpuSelection,
    InsufficientGpusError,
    parse_select_spec,
    rank_idle_gpus,
    select_gpus,
    select_gpus_or_none,
)
from torchkit.hardware.nvml import GpuStats


def gpu(index: int, *, free_gib: float, util: float | None, total_gib: float = 16.0) -> GpuStats:
    total = int(total_gib * GIB)
    free = int(free_gib * GIB)
    return GpuStats(
        index=index,
        name="Tesla V100-SXM2-16GB",
        memory_total_bytes=total,
        memory_used_bytes=total - free,
        memory_free_bytes=free,
        utilization_fraction=util,
    )


NODE = [
    gpu(0, free_gib=1.2, util=0.85),
    gpu(1, free_gib=15.0, util=0.0),
    gpu(2, free_gib=12.0, util=0.3),
    gpu(3, free_gib=15.9, util=None),
]


def test_rank_idle_gpus_breaks_ties_with_the_tie_breaker():
    twins = [gpu(0, free_gib=8, util=0.1), gpu(1, free_gib=8, util=0.1)]
    later_first = iter([1.0, 0.0])
    assert rank_idle_gpus(twins, 2, tie_break=lambda: next(later_first)) == [1, 0]
    earlier_first = iter([0.0, 1.0])
    assert rank_idle_gpus(twins, 2, tie_break=lambda: next(earlier_first)) == [0, 1]


def test_select_all_keeps_gpus_meeting_the_thresholds_and_says_why_not_the_others():
    selection = select_gpus(NODE, "all", min_free_memory_fraction=0.2, max_utilization_fraction=0.5)
    assert selection == GpuSelection(
        selected=(1, 2),
        skipped=(
            (0, "busy: 85% utilisation > 50%; only 1.2 GiB of 16.0 GiB free (< 20%)"),
            (3, "utilisation unknown (limit 50%)"),
        ),
        busy=(0, 3),
    )


def test_busy_names_only_the_gpus_left_out_for_a_threshold():
    idle_but_not_picked = select_gpus(NODE, "-1", min_free_memory_fraction=0.2, max_utilization_fraction=0.5)
    assert idle_but_not_picked.busy == (0, 3)  # 1 or 2 was less idle than the one picked: not busy
    assert set(dict(idle_but_not_picked.skipped)) - set(idle_but_not_picked.busy) == {1, 2} - set(
        idle_but_not_picked.selected
    )
    assert select_gpus(NODE, "1", max_utilization_fraction=0.5).busy == ()  # the others were not requested
    short = select_gpus_or_none(NODE, "-1,-1,-1", max_utilization_fraction=0.5)
    assert short.selected == () and short.busy == (0, 3)


def test_select_all_without_thresholds_takes_every_gpu():
    assert select_gpus(NODE).selected == (0, 1, 2, 3)


def test_idle_picks_prefer_free_memory_and_rank_unknown_utilisation_last():
    assert select_gpus(NODE, "-1").selected == (1,)
    assert select_gpus(NODE, "-1,-1").selected == (1, 2)
    selection = select_gpus(NODE, "-1,-1,-1,-1")
    assert selection.selected == (1, 2, 0, 3)
    assert selection.skipped == ()


def test_idle_picks_report_the_gpus_left_out():
    selection = select_gpus(NODE, "-1", max_utilization_fraction=0.5)
    assert selection.skipped == (
        (0, "busy: 85% utilisation > 50%"),
        (2, "less idle than the GPUs picked"),
        (3, "utilisation unknown (limit 50%)"),
    )


def test_too_few_eligible_gpus_names_what_was_asked_and_why():
    with pytest.raises(InsufficientGpusError) as info:
        select_gpus(NODE, "-1,-1,-1", min_free_memory_fraction=0.2, max_utilization_fraction=0.5)
    message = str(info.value)
    assert message.startswith(
        "GPU selection '-1,-1,-1' asks for 3 idle GPUs, but only 2 of the node's 4 GPUs"
    )
    assert "can be picked (1, 2)" in message
    assert "GPU 0: busy: 85% utilisation > 50%; only 1.2 GiB of 16.0 GiB free (< 20%)" in message
    assert "GPU 3: utilisation unknown (limit 50%)" in message
    assert info.value.eligible == (1, 2)
    assert info.value.requested == 3
    assert isinstance(info.value, ConfigError)


def test_idle_request_on_a_node_without_gpus_is_an_error_but_all_is_empty():
    with pytest.raises(InsufficientGpusError, match="asks for 1 idle GPU, but this node has no GPUs"):
        select_gpus([], "-1")
    assert select_gpus([], "all") == GpuSelection(selected=(), skipped=())


def test_explicit_indices_are_used_as_given_and_breaches_are_warnings():
    selection = select_gpus(NODE, "2,0", max_utilization_fraction=0.5)
    assert selection.selected == (2, 0)
    assert selection.skipped == ((1, "not requested"), (3, "not requested"))
    assert selection.warnings == (
        "GPU 0 is used as requested although it does not meet the thresholds: busy: 85% utilisation > 50%",
    )


def test_mixed_spec_adds_idle_gpus_to_the_named_ones():
    assert select_gpus(NODE, "1,-1").selected == (1, 2)
    with pytest.raises(InsufficientGpusError, match="besides the named GPU\\(s\\) 1"):
        select_gpus(NODE, "1,-1,-1", max_utilization_fraction=0.5)


def test_an_index_the_node_lacks_is_a_config_error():
    with pytest.raises(ConfigError, match="names GPU 7, but this node's GPUs are: 0, 1, 2, 3"):
        select_gpus(NODE, "0,7")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "empty GPU selection"),
        ("0,x", "'x' is not a GPU index or -1"),
        ("-2", "'-2' is not a GPU index or -1"),
        ("0,,1", "'' is not a GPU index or -1"),
        ("1,1", "names GPU 1 twice"),
    ],
)
def test_malformed_specs_are_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        select_gpus(NODE, spec)


def test_spec_parsing_normalises_case_and_spaces():
    assert parse_select_spec(" ALL ").select_all
    spec = parse_select_spec("0, -1 ,-1")
    assert (spec.explicit_indices, spec.idle_count, spec.text) == ((0,), 2, "0,-1,-1")


@pytest.mark.parametrize(
    ("name", "value"), [("min_free_memory_fraction", 1.5), ("max_utilization_fraction", -0.1)]
)
def test_threshold_fractions_outside_0_1_are_rejected(name, value):
    with pytest.raises(ConfigError, match=f"{name} must be a fraction in \\[0, 1\\]"):
        select_gpus(NODE, "all", **{name: value})


def test_gpu_stats_validate_their_figures():
    with pytest.raises(ValueError, match="utilization_fraction 1.5 is not in \\[0, 1\\]"):
        gpu(0, free_gib=1, util=1.5)
    assert gpu(0, free_gib=4, util=0.5).utilization_fraction == 0.5


_gpu_lists = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=16 * GIB),
        st.one_of(st.none(), st.integers(min_value=0, max_value=100).map(lambda p: p / 100)),
    ),
    max_size=6,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    gpus=_gpu_lists,
    idle=st.integers(min_value=0, max_value=4),
    min_free=st.sampled_from([0.0, 0.2, 0.5]),
    max_util=st.sampled_from([0.3, 1.0]),
)
def test_every_gpu_is_either_selected_or_skipped_with_a_reason(gpus, idle, min_free, max_util):
    stats = [
        GpuStats(
            index=i,
            name="g",
            memory_total_bytes=16 * GIB,
            memory_used_bytes=16 * GIB - free,
            memory_free_bytes=free,
            utilization_fraction=util,
        )
        for i, (free, util) in enumerate(gpus)
    ]
    spec = ",".join(["-1"] * idle) or "all"
    try:
        selection = select_gpus(
            stats, spec, min_free_memory_fraction=min_free, max_utilization_fraction=max_util
        )
    except InsufficientGpusError as exc:
        assert len(exc.eligible) < idle
        return
    skipped = [i for i, _ in selection.skipped]
    assert sorted([*selection.selected, *skipped]) == list(range(len(stats)))
    assert all(reason for _, reason in selection.skipped)
    if idle:
        assert len(selection.selected) == idle
        picked = [stats[i] for i in selection.selected]
        eligible_left = [
            stats[i] for i, reason in selection.skipped if reason == "less idle than the GPUs picked"
        ]
        for (
            left
        ) in eligible_left:  # nothing left behind beats a pick: known utilisation first, then free memory
            assert all(
                (p.utilization_fraction is None) < (left.utilization_fraction is None)
                or (
                    (p.utilization_fraction is None) == (left.utilization_fraction is None)
                    and p.memory_free_bytes >= left.memory_free_bytes
                )
                for p in picked
            )
