"""torchkit.nvml: reading GPUs through (fake) NVML, the seed's GPUInfo, and the pure GPU selection."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from fake_pynvml import GIB, MISSING_PID, FakeNvml, mixed_load_gpus
from hypothesis import given, settings
from hypothesis import strategies as st

from torchkit.errors import ConfigError
from torchkit.nvml import (
    GPUInfo,
    GpuProcess,
    GpuSelection,
    GpuStats,
    InsufficientGpusError,
    NvmlUnavailableError,
    parse_select_spec,
    rank_idle_gpus,
    read_local_gpu_stats,
    read_local_inventory,
    select_gpus,
)

# ------------------------------------------------------------------------------------------------ import cost


def test_importing_torchkit_loads_neither_torch_nor_nvml():
    code = (
        "import sys, torchkit, torchkit.nvml, torchkit.device, planner, planner.cli.devices\n"
        "print(sorted(m for m in ('torch', 'pynvml', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------------------------ reading


def test_read_local_gpu_stats_reads_every_field(fake_nvml):
    stats = read_local_gpu_stats()
    assert [s.index for s in stats] == [0, 1, 2, 3]
    busy = stats[0]
    assert busy.name == "Tesla V100-SXM2-16GB"
    assert busy.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert busy.pci_bus_id == "00000000:1A:00.0"  # decoded from NVML's bytes
    # v2 memory info: "used" excludes the 0.5 GiB the driver reserves
    assert busy.memory_total_bytes == 16 * GIB
    assert busy.memory_used_bytes == 12 * GIB
    assert busy.memory_free_bytes == 16 * GIB - 12 * GIB - GIB // 2
    assert busy.utilization_fraction == pytest.approx(0.85)
    assert busy.temperature_c == 71
    assert busy.power_w == pytest.approx(250.0)
    assert busy.power_limit_w == pytest.approx(300.0)


def test_processes_are_named_through_psutil_where_visible(fake_nvml):
    import psutil

    stats = read_local_gpu_stats()
    assert stats[0].processes == (
        GpuProcess(pid=os.getpid(), name=psutil.Process().name(), used_memory_bytes=12 * GIB),
    )
    assert stats[1].processes == ()
    # a pid psutil cannot see (another container) keeps its pid; NVML gave no memory figure
    assert stats[2].processes == (GpuProcess(pid=MISSING_PID, name=None, used_memory_bytes=None),)


def test_unsupported_readings_are_unknown_not_negative(fake_nvml):
    gpu = read_local_gpu_stats()[3]
    assert gpu.utilization_fraction is None
    assert gpu.temperature_c is None
    assert gpu.power_w is None
    assert gpu.power_limit_w is None


def test_memory_falls_back_to_v1_on_drivers_without_v2(install_nvml):
    install_nvml(FakeNvml(mixed_load_gpus(), memory_v2=False))
    busy = read_local_gpu_stats()[0]
    assert busy.memory_used_bytes == 12 * GIB + GIB // 2  # v1 counts the reserved memory as used
    assert busy.memory_free_bytes == 16 * GIB - 12 * GIB - GIB // 2


def test_inventory_reports_driver_versions_and_releases_nvml(fake_nvml):
    inventory = read_local_inventory()
    assert inventory.driver_version == "550.54.15"
    assert inventory.nvml_version == "12.550.54.15"
    assert inventory.cuda_driver_version == "12.4"  # NVML's 12040
    assert len(inventory.gpus) == 4
    assert inventory.warnings == ()
    assert fake_nvml.init_calls == 1
    assert fake_nvml.shutdown_calls == 1


def test_an_unreadable_gpu_is_left_out_with_a_warning(fake_nvml_unreadable, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.nvml"):
        stats = read_local_gpu_stats()
    assert [s.index for s in stats] == [0, 1, 3]
    assert [r.getMessage() for r in caplog.records] == [
        "GPU 2 left out: NVML could not read its stats (NVMLError_GpuIsLost: GPU is lost)"
    ]
    assert read_local_inventory().warnings == (
        "GPU 2 left out: NVML could not read its stats (NVMLError_GpuIsLost: GPU is lost)",
    )


def test_no_driver_raises_a_clear_error(nvml_library_missing):
    with pytest.raises(NvmlUnavailableError, match="NVML Shared Library Not Found.*no NVIDIA driver") as info:
        read_local_inventory()
    assert isinstance(info.value, RuntimeError)


def test_missing_pynvml_says_what_to_install(pynvml_missing):
    with pytest.raises(NvmlUnavailableError, match="pip install nvidia-ml-py"):
        read_local_gpu_stats()


# ------------------------------------------------------------------------------------------------ GPUInfo


def test_gpuinfo_without_driver_warns_once_and_reports_nothing(nvml_library_missing, caplog):
    with caplog.at_level(logging.WARNING, logger="torchkit.nvml"):
        info = GPUInfo()
        assert info.nvml_available is False
        assert info.gpu_stats == []
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 1
        assert messages[0].startswith("Failed to initialize pynvml, GPU stats disabled: NVML could not start")
        caplog.clear()
        assert info.select_idle_gpu(1) == []
    assert [r.getMessage() for r in caplog.records] == ["NVML stats unavailable."]


def test_gpuinfo_gpu_stats_keep_the_seed_fields(fake_nvml):
    info = GPUInfo()
    first, unknown = info.gpu_stats[0], info.gpu_stats[3]
    assert {k: first[k] for k in ("index", "utilization", "memory_used", "memory_total", "memory_free")} == {
        "index": 0,
        "utilization": 85,
        "memory_used": 12 * 1024,
        "memory_total": 16 * 1024,
        "memory_free": 3584,
    }
    assert (first["temperature"], first["power_draw"], first["power_limit"]) == (71, 250, 300)
    assert (unknown["utilization"], unknown["temperature"], unknown["power_draw"]) == (-1, -1, -1)
    info.shutdown()
    info.shutdown()
    assert fake_nvml.shutdown_calls == 1


def test_gpuinfo_keeps_the_readable_gpus_when_one_fails(fake_nvml_unreadable):
    assert [s["index"] for s in GPUInfo().gpu_stats] == [0, 1, 3]


def test_print_status_logs_a_table_with_na_for_unknowns(fake_nvml, caplog):
    with caplog.at_level(logging.INFO, logger="torchkit.nvml"):
        GPUInfo().print_status()
    lines = caplog.records[-1].getMessage().splitlines()
    assert lines[1].split() == ["Idx", "Name", "Util", "Mem", "(MiB)", "Temp", "Pwr", "(W)"]
    assert lines[2].split() == ["0", "Tesla", "V100-SXM2-16GB", "85%", "12288/16384", "71C", "250/300"]
    assert lines[5].split()[:4] == ["3", "Tesla", "V100-SXM2-16GB", "N/A"]


def test_select_idle_gpu_orders_by_utilisation_then_free_memory(fake_nvml):
    info = GPUInfo()
    assert info.select_idle_gpu(1) == [1]
    assert info.select_idle_gpu(2) == [1, 2]
    # unknown utilisation (GPU 3) ranks last although it has the most free memory
    assert info.select_idle_gpu(4) == [1, 2, 0, 3]


def test_select_idle_gpu_applies_thresholds_and_indices(fake_nvml, caplog):
    info = GPUInfo()
    with caplog.at_level(logging.INFO, logger="torchkit.nvml"):
        # 20% free utilisation drops GPU 0 (85% busy) and GPU 3 (unknown)
        assert info.select_idle_gpu(4, min_util_fraction=0.2) == [1, 2]
    messages = [r.getMessage() for r in caplog.records]
    assert "Searching for 4 idle GPUs with free memory >= 0.0% and free utilization >= 20.0%..." in messages
    assert "Requested 4 GPUs but only 2 met the idle criteria." in messages
    assert "Selected idle CUDA devices [1, 2]" in messages
    assert info.select_idle_gpu(2, min_memory_fraction=0.5) == [1, 2]  # GPU 0 has 22% free
    assert info.select_idle_gpu(2, indices=[0, 3]) == [0, 3]
    assert info.select_idle_gpu(0) == []


def test_select_idle_gpu_rejects_fractions_outside_0_1(fake_nvml):
    with pytest.raises(ConfigError, match="min_memory_fraction must be a fraction in \\[0, 1\\], got 1.5"):
        GPUInfo().select_idle_gpu(1, min_memory_fraction=1.5)
    with pytest.raises(ConfigError, match="min_util_fraction"):
        GPUInfo().select_idle_gpu(1, min_util_fraction=-0.1)


# ------------------------------------------------------------------------------------------------ pure layer


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
    )


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
    assert gpu(0, free_gib=4, util=0.5).to_dict()["utilization"] == 0.5


_gpu_lists = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=16 * GIB),
        st.one_of(st.none(), st.integers(min_value=0, max_value=100).map(lambda p: p / 100)),
    ),
    max_size=6,
)


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
