"""bench/bench_mlperf.py prices MLPerf's systems through the plan's ring: their links as the configs state them,
and the measured figures its summary line compares against (no BERT fake pass here: that is the bench's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mlperf():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import bench_mlperf
    finally:
        sys.path.remove(str(REPO / "bench"))
    return bench_mlperf


def _system(mlperf, bench: str, name: str):
    return next(s for s in mlperf.SYSTEMS if s.benchmark == bench and s.name == name)


def test_the_three_h100_pcie_systems_ring_over_the_links_their_submissions_state(mlperf) -> None:
    rings = {name: mlperf.ring_for(_system(mlperf, "bert", name)) for name in mlperf.SPREAD_SYSTEMS}
    bridged, x16, x8 = (rings[n][1] for n in mlperf.SPREAD_SYSTEMS)
    assert (bridged.name, x16.name, x8.name) == ("nvlink-bridge+pcie5", "pcie5", "pcie5x8")
    assert x8.bus_bytes_per_s == pytest.approx(x16.bus_bytes_per_s / 2)
    assert [rings[n][0].num_ranks for n in mlperf.SPREAD_SYSTEMS] == [4, 8, 8]
    grads = 335_000_000 * mlperf.GRAD_BYTES_PER_PARAM
    times = [rings[n][0].allreduce_s(grads) for n in mlperf.SPREAD_SYSTEMS]
    assert times[2] > times[1] > times[0]  # x8 slowest; four bridged cards move 1.5/1.75 of eight's bytes


def test_the_measured_spreads_are_the_reference_files(mlperf) -> None:
    for bench, spread in (("bert", 2.27), ("resnet", 1.13)):
        measured = [_system(mlperf, bench, n).measured for n in mlperf.SPREAD_SYSTEMS]
        assert measured == sorted(measured, reverse=True)
        assert max(measured) / min(measured) == pytest.approx(spread, abs=0.005)


def test_every_system_names_its_result_log_and_a_catalog_gpu(mlperf) -> None:
    from torchkit.hardware.catalog import load_catalog

    catalog = load_catalog()
    for s in mlperf.SYSTEMS:
        assert s.gpu in catalog and "training_results" in s.source and s.measured > 0, s.name
        assert (s.kernels in ("te-fp8", "fp16")) == (s.benchmark == "bert"), s.name
    assert all(a.benchmark == "bert" for a in mlperf.BERT_ANCHORS.values())


def test_the_amd_host_systems_ring_over_their_slots_lanes_like_the_intel_ones(mlperf) -> None:
    """The x16 AMD EPYC systems price as the Intel x16 one (the model has no host term), the Lenovo at x8; none
    of them is a calibration row, and only the Lenovo is one of the spread's three."""
    x16_intel = mlperf.ring_for(_system(mlperf, "bert", "ASUSTeK ESC8000-E11"))[1]
    links = [mlperf.ring_for(_system(mlperf, "bert", n))[1] for n in mlperf.AMD_HOST_SYSTEMS]
    assert [link.name for link in links] == ["pcie5", "pcie5", "pcie5x8"]
    assert links[0].bus_bytes_per_s == links[1].bus_bytes_per_s == x16_intel.bus_bytes_per_s
    assert set(mlperf.AMD_HOST_SYSTEMS) & set(mlperf.SPREAD_SYSTEMS) == {"Lenovo SR675 V3"}
    for name in mlperf.AMD_HOST_SYSTEMS:
        system = _system(mlperf, "bert", name)
        assert "AMD EPYC" in system.source and not system.calibrated and system.gpus == 8, name


def test_the_bert_anchors_are_the_nvswitch_h100s_and_xfusions_l40s(mlperf) -> None:
    anchors = {k: (a.name, a.gpu, a.gpus) for k, a in mlperf.BERT_ANCHORS.items()}
    assert anchors == {
        "te-fp8": ("NVIDIA eos (DGX H100)", "H100-SXM5-80GB", 8),
        "fp16": ("xFusion G5500 V7", "L40S", 8),
    }
