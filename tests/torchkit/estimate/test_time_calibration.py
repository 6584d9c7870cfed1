"""Calibration of the step-time model: the measured data file, the fit, the generated constants."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from torchkit.errors import ConfigError
from torchkit.estimate.calibration.data import CALIBRATION_MODELS, DATA_PATH, held_out_ids, read_measured
from torchkit.estimate.calibration.fit import (
    TENSOR_CORE_CEILINGS,
    Observation,
    StackTerms,
    fit,
    fit_calibration,
    predict,
)
from torchkit.estimate.calibration.stacks import REFERENCE_STACK, STACKS
from torchkit.estimate.roofline import KernelClass, KernelTable, PlacedTable
from torchkit.estimate.time_model import (
    DEFAULT_TIME_MODEL_PATH,
    PRIOR_CONSTANTS,
    TIME_MODEL_ENV,
    architecture,
    load_time_model,
)

REPO = Path(__file__).resolve().parents[3]


# --- the data file ------------------------------------------------------------------------------------
def test_every_measured_row_has_a_source_a_catalog_gpu_and_positive_figures(catalog) -> None:
    rows = read_measured(catalog=catalog)
    assert len(rows) >= 20
    for r in rows:
        assert r.source.strip() and r.software.strip(), r.id
        assert r.gpu in catalog, r.id
        assert r.batch > 0 and r.samples_per_s > 0, r.id
        assert r.model in CALIBRATION_MODELS
    assert len({r.id for r in rows}) == len(rows)
    assert not any("lambdal" in r.source.lower() for r in rows)  # kept out: it evaluates the model
    for r in rows:
        assert r.stack in STACKS and r.gpus_in_run >= 1, r.id
        if r.gpus_in_run > 1:  # per GPU of a data-parallel run: an MLPerf result log, never eager throughput
            assert r.stack != REFERENCE_STACK and "training_results" in r.source and "result_" in r.source, (
                r.id
            )
            assert f"/ {r.gpus_in_run} GPUs" in r.source, r.id
            assert r.kind.startswith(f"per GPU of {r.gpus_in_run}")


def test_every_other_stack_is_anchored_by_an_architecture_with_eager_rows(catalog) -> None:
    """A stack's terms relate it to eager PyTorch only through GPU architectures it shares with eager rows."""
    rows = read_measured(catalog=catalog)
    eager_arches = {architecture(catalog.get(r.gpu)) for r in rows if r.stack == REFERENCE_STACK}
    for stack in {r.stack for r in rows} - {REFERENCE_STACK}:
        arches = {architecture(catalog.get(r.gpu)) for r in rows if r.stack == stack}
        assert arches & eager_arches, stack
        assert arches - eager_arches or stack, stack


def test_the_bench_mlperf_systems_are_kept_out_of_the_fit(catalog) -> None:
    """bench/bench_mlperf.py predicts the spread of these three systems from their links: not fitted to them."""
    sources = " ".join(r.source for r in read_measured(catalog=catalog))
    for system in ("ESC8000-E11-8xH100-PCIE-80GB", "D54U-3U", "SR675v3-8xH100_PCIe_80GB_350W"):
        assert system not in sources


def test_calibration_models_are_the_built_in_workloads() -> None:
    from torchkit.workloads import WORKLOAD_NAMES

    assert set(CALIBRATION_MODELS) == set(WORKLOAD_NAMES)


def _csv_with(tmp_path: Path, row: str) -> Path:
    header = "id,model,gpu,precision,layout,batch,samples_per_s,optimizer,source,software,oom_batch,gpus_in_run,stack\n"
    path = tmp_path / "m.csv"
    path.write_text("# comment\n" + header + row + "\n")
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,resnet50,V100-SXM2-16GB,fp16,nhwc,256,1200,sgd,,NGC", "empty source"),
        ("a,resnet50,GTX-9999,fp16,nhwc,256,1200,sgd,src,NGC", "not in the catalog"),
        ("a,resnet51,V100-SXM2-16GB,fp16,nhwc,256,1200,sgd,src,NGC", "not a built-in workload"),
        ("a,resnet50,V100-SXM2-16GB,tf32,nchw,256,1200,sgd,src,NGC", "tf32 on compute capability 7"),
        ("a,resnet50,A100-SXM4-80GB,fp32,nchw,256,1200,sgd,src,NGC", "fp32 on compute capability 8"),
        ("a,resnet50,V100-SXM2-16GB,fp16,nhwc,256,-3,sgd,src,NGC", "must be positive"),
        ("a,resnet50,V100-SXM2-16GB,fp16,nhwc,many,3,sgd,src,NGC", "not numbers"),
        (
            "a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm,256",
            "oom_batch '256'.*above the row's batch 256",
        ),
        ("a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm,lots", "oom_batch 'lots'"),
        ("a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm,,0,pytorch-eager", "gpus_in_run '0'"),
        (
            "a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm,,8,tensorflow",
            "stack 'tensorflow'.*stacks.py",
        ),
    ],
)
def test_a_bad_row_is_a_config_error_naming_its_line(tmp_path, catalog, row, message) -> None:
    with pytest.raises(ConfigError, match=rf"line 3: .*{message}"):
        read_measured(_csv_with(tmp_path, row), catalog=catalog)


def test_the_out_of_memory_batch_is_optional_and_read(tmp_path, catalog) -> None:
    path = _csv_with(
        tmp_path,
        "a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm,384\nb,resnet50,RTX-3090,fp16,nhwc,512,1200,sgd,src,timm,",
    )
    assert [r.oom_batch for r in read_measured(path, catalog=catalog)] == [384, None]
    old_header = tmp_path / "old.csv"  # a file written before the column existed still reads
    old_header.write_text(
        "id,model,gpu,precision,layout,batch,samples_per_s,optimizer,source,software\n"
        "a,resnet50,RTX-3090,fp16,nhwc,256,1200,sgd,src,timm\n"
    )
    assert read_measured(old_header, catalog=catalog)[0].oom_batch is None
    old = read_measured(old_header, catalog=catalog)[0]
    assert (old.gpus_in_run, old.stack, old.kind) == (1, REFERENCE_STACK, "single GPU, pytorch-eager")


def test_the_shipped_out_of_memory_batches_are_timms_next_step_up(catalog) -> None:
    """timm's benchmark retries one step of decay_batch_step down after an out-of-memory error."""
    decay_from = {384: 512, 256: 384, 192: 256, 128: 192}
    rows = [r for r in read_measured(catalog=catalog) if r.oom_batch]
    assert rows
    for r in rows:
        assert "pytorch-image-models" in r.source and r.oom_batch == decay_from[r.batch], r.id


def test_the_held_out_split_is_stratified_and_deterministic(catalog) -> None:
    rows = read_measured(catalog=catalog)
    held = held_out_ids(rows, catalog)
    assert held == held_out_ids(tuple(reversed(rows)), catalog)
    assert 0.2 < len(held) / len(rows) < 0.45
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((architecture(catalog.get(r.gpu)), r.precision), []).append(r.id)
    for ids in groups.values():
        assert any(i not in held for i in ids)  # the fit sees every (architecture, precision)


# --- the fit ------------------------------------------------------------------------------------------
def _table(rows: list[tuple[KernelClass, bool, bool, float, float, int]]) -> KernelTable:
    return KernelTable(
        kernel_class=np.array([r[0] for r in rows], dtype=np.int8),
        is_conv=np.array([r[1] for r in rows], dtype=bool),
        grouped=np.array([r[2] for r in rows], dtype=bool),
        flops=np.array([r[3] for r in rows], dtype=np.float64),
        bytes_moved=np.array([r[4] for r in rows], dtype=np.float64),
        count=np.array([r[5] for r in rows], dtype=np.float64),
    )


def _synthetic_tables() -> list[KernelTable]:
    """Mixes of compute-bound 16-bit/fp32 convolutions, fp32 matmuls, grouped convolutions and
    bandwidth-bound kernels in different proportions, so every constant shows in some step."""
    out = []
    for k, (conv, mem, grouped, matmul) in enumerate(
        [(4, 1, 0, 0), (1, 4, 0, 1), (2, 2, 3, 0), (1, 1, 1, 3)]
    ):
        for amp16 in (True, False):
            cls = KernelClass.FP16 if amp16 else KernelClass.CONV32
            rows = [
                (cls, True, False, 2e12 * conv, 2e8 * conv, 10 + k),
                (cls, True, True, 2e11 * grouped, 1e7 * grouped, 5) if grouped else None,
                (KernelClass.MATMUL32, False, False, 2e11 * matmul, 1e7, 3) if matmul else None,
                (KernelClass.MEMORY, False, False, 0.0, 4e9 * mem, 20),
            ]
            out.append(_table([r for r in rows if r is not None]))
    return out


def test_the_fit_recovers_known_constants_from_synthetic_data(catalog) -> None:
    truth_global = replace(
        PRIOR_CONSTANTS,
        tf32_efficiency=0.45,
        fp32_efficiency=0.85,
        layout_conversion_factor=1.3,
        grouped_conv_efficiency=0.4,
    )
    truth_arch = {
        "volta": replace(
            truth_global, tensor_core_efficiency=0.55, bandwidth_efficiency=0.7, grouped_conv_efficiency=0.3
        ),
        "ampere-ga100": replace(truth_global, tensor_core_efficiency=0.65, bandwidth_efficiency=0.6),
        "ampere-ga10x": replace(
            truth_global, tensor_core_efficiency=0.8, bandwidth_efficiency=0.8, grouped_conv_efficiency=0.6
        ),
    }
    observations = []
    for gpu_name in ("V100-SXM2-16GB", "A100-SXM4-80GB", "RTX-3090"):
        gpu = catalog.get(gpu_name)
        for i, table in enumerate(_synthetic_tables()):
            for channels_last in (False, True):
                o = Observation(
                    id=f"{gpu_name}-{i}-{channels_last}",
                    table=table,
                    gpu=gpu,
                    arch=architecture(gpu),
                    batch=256,
                    channels_last=channels_last,
                    samples_per_s=1.0,
                )
                observations.append(replace(o, samples_per_s=predict(o, truth_global, truth_arch)))
    result = fit(observations, PRIOR_CONSTANTS, global_prior_log_sigma=10.0, arch_prior_log_sigma=10.0)
    for arch, truth in truth_arch.items():
        got = result.arch_constants[arch]
        for name in (
            "tensor_core_efficiency",
            "bandwidth_efficiency",
            "tf32_efficiency",
            "fp32_efficiency",
            "layout_conversion_factor",
            "grouped_conv_efficiency",
        ):
            assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.02), (arch, name)
    assert max(abs(v) for v in result.log_residuals.values()) < 1e-3


def test_the_prior_keeps_constants_the_data_cannot_see(catalog) -> None:
    gpu = catalog.get("V100-SXM2-16GB")
    table = _table([(KernelClass.MEMORY, False, False, 0.0, 1e10, 10)])  # bandwidth only
    o = Observation(
        id="m", table=table, gpu=gpu, arch="volta", batch=64, channels_last=False, samples_per_s=1.0
    )
    o = replace(o, samples_per_s=0.5 * predict(o, PRIOR_CONSTANTS, {}))
    result = fit([o], PRIOR_CONSTANTS)
    assert result.global_constants.tensor_core_efficiency == pytest.approx(
        PRIOR_CONSTANTS.tensor_core_efficiency
    )
    assert result.arch_constants["volta"].bandwidth_efficiency == pytest.approx(
        PRIOR_CONSTANTS.bandwidth_efficiency / 2, rel=0.02
    )


def test_a_stack_runs_fused_kernels_and_cuda_graphs_as_the_roofline_says(catalog) -> None:
    gpu = catalog.get("A100-SXM4-80GB")
    table = _table(
        [(KernelClass.FP16, True, False, 1e12, 1e8, 4), (KernelClass.MEMORY, False, False, 0.0, 4e9, 20)]
    )
    placed = PlacedTable.of(table, gpu, channels_last=True)
    eager = placed.time_s(PRIOR_CONSTANTS)
    fused = placed.time_s(PRIOR_CONSTANTS, memory_traffic=0.25)
    memory_s = 20 * 4e9 / (PRIOR_CONSTANTS.bandwidth_efficiency * gpu.memory_bandwidth_bytes_per_s)
    assert eager - fused == pytest.approx(0.75 * memory_s, rel=1e-9)  # only the memory kernels' bytes shrink
    tiny = PlacedTable.of(_table([(KernelClass.MEMORY, False, False, 0.0, 1.0, 1000)]), gpu)
    assert tiny.time_s(PRIOR_CONSTANTS) == pytest.approx(1000 * PRIOR_CONSTANTS.eager_dispatch_s)  # CPU-bound
    assert tiny.time_s(PRIOR_CONSTANTS, cuda_graphs=True) < 1000 * PRIOR_CONSTANTS.eager_dispatch_s / 2


def _stack_world(catalog, stack_terms: dict[str, StackTerms], hopper_sm_stream: float = math.inf):
    """Synthetic truth: Volta and Ampere seen eagerly and in one fused stack, Hopper only in that stack (its SMs
    streaming at most ``hopper_sm_stream`` bytes per FP32 FLOP)."""
    truth_global = replace(PRIOR_CONSTANTS, tf32_efficiency=0.5, fp32_efficiency=0.8)
    truth_arch = {
        "volta": replace(truth_global, tensor_core_efficiency=0.55, bandwidth_efficiency=0.7),
        "ampere-ga100": replace(truth_global, tensor_core_efficiency=0.65, bandwidth_efficiency=0.6),
        "hopper": replace(
            truth_global,
            tensor_core_efficiency=0.40,
            bandwidth_efficiency=0.55,
            sm_stream_bytes_per_flop=hopper_sm_stream,
        ),
    }
    observations = []
    for gpu_name, stacks in (
        ("V100-SXM2-16GB", (REFERENCE_STACK, "mlperf-mxnet")),
        ("A100-SXM4-80GB", (REFERENCE_STACK, "mlperf-mxnet")),
        ("A30", ("mlperf-mxnet",)),
        ("H100-SXM5-80GB", ("mlperf-mxnet",)),
        ("H200-SXM-141GB", ("mlperf-mxnet",)),
        ("H100-PCIe-80GB", ("mlperf-mxnet",)),
    ):
        gpu = catalog.get(gpu_name)
        for stack in stacks:
            for i, table in enumerate(_synthetic_tables()):
                o = Observation(
                    id=f"{gpu_name}-{stack}-{i}",
                    table=table,
                    gpu=gpu,
                    arch=architecture(gpu),
                    batch=256,
                    channels_last=True,
                    samples_per_s=1.0,
                    stack=stack,
                )
                observations.append(
                    replace(o, samples_per_s=predict(o, truth_global, truth_arch, stack_terms))
                )
    return observations, truth_arch


def test_the_two_stage_fit_places_an_architecture_seen_only_in_another_stack(catalog) -> None:
    terms = {"mlperf-mxnet": StackTerms(throughput_factor=1.3, memory_traffic=0.4, cuda_graphs=True)}
    observations, truth_arch = _stack_world(catalog, terms)
    result = fit_calibration(
        observations, PRIOR_CONSTANTS, global_prior_log_sigma=10.0, arch_prior_log_sigma=10.0
    )
    got = result.stack_terms["mlperf-mxnet"]
    assert got.throughput_factor == pytest.approx(1.3, rel=0.03)
    assert got.memory_traffic == pytest.approx(0.4, rel=0.05)
    hopper = result.arch_constants["hopper"]
    assert hopper.tensor_core_efficiency == pytest.approx(0.40, rel=0.05)
    assert hopper.bandwidth_efficiency == pytest.approx(0.55, rel=0.05)
    # the eager architectures' constants are the eager rows' own fit: the other stack cannot move them
    eager_only = fit(
        [o for o in observations if o.stack == REFERENCE_STACK],
        PRIOR_CONSTANTS,
        global_prior_log_sigma=10.0,
        arch_prior_log_sigma=10.0,
    )
    for arch in ("volta", "ampere-ga100"):
        assert result.arch_constants[arch] == eager_only.arch_constants[arch]


def test_the_sm_side_of_streaming_is_fitted_where_the_cards_share_their_sms(catalog, monkeypatch) -> None:
    """The H200 is the H100 SXM's SMs with 1.43x its DRAM. In a world whose Hopper SMs stream at most 0.03 bytes
    per FP32 FLOP, the fit (Hopper is in ``SM_STREAM_PRIORS``) finds the limit and prices both cards; a fit
    with the DRAM side alone cannot, and no other architecture gets a limit."""
    from torchkit.estimate.calibration import fit as fit_module

    terms = {"mlperf-mxnet": StackTerms(throughput_factor=1.3, memory_traffic=0.4, cuda_graphs=True)}
    observations, _ = _stack_world(catalog, terms, hopper_sm_stream=0.03)
    wide = {"global_prior_log_sigma": 10.0, "arch_prior_log_sigma": 10.0}
    result = fit_calibration(observations, PRIOR_CONSTANTS, **wide)
    assert result.arch_constants["hopper"].sm_stream_bytes_per_flop == pytest.approx(0.03, rel=0.05)
    assert result.arch_constants["volta"].sm_stream_bytes_per_flop == math.inf
    assert max(abs(e) for e in result.log_residuals.values()) < 0.01
    monkeypatch.setattr(fit_module, "SM_STREAM_PRIORS", {})
    dram_only = fit_calibration(observations, PRIOR_CONSTANTS, **wide)
    assert max(abs(e) for i, e in dram_only.log_residuals.items() if "H200" in i or "H100" in i) > 0.03


def test_no_fit_prices_a_matmul_above_its_architectures_achievable_share(catalog) -> None:
    """The data may ask for more (here: a Hopper card twice as fast as any efficiency explains); the measured
    achievable-matmul share bounds the tensor-core efficiency anyway."""
    gpu = catalog.get("H100-SXM5-80GB")
    table = _table([(KernelClass.FP16, True, False, 4e12, 1e8, 10)])  # tensor-core bound only
    o = Observation(
        id="h", table=table, gpu=gpu, arch="hopper", batch=64, channels_last=True, samples_per_s=1.0
    )
    o = replace(o, samples_per_s=2.0 * predict(o, replace(PRIOR_CONSTANTS, tensor_core_efficiency=0.8), {}))
    result = fit([o], PRIOR_CONSTANTS, arch_prior_log_sigma=10.0, global_prior_log_sigma=10.0)
    ceiling = TENSOR_CORE_CEILINGS["hopper"][0]
    assert result.arch_constants["hopper"].tensor_core_efficiency <= ceiling
    assert result.arch_constants["hopper"].tensor_core_efficiency == pytest.approx(ceiling, rel=0.01)


# --- the generated constants --------------------------------------------------------------------------
@pytest.mark.slow
def test_the_shipped_constants_are_the_fit_of_the_shipped_data(catalog) -> None:
    """time_model.json must be regenerated (python bench/calibrate_time.py) whenever the data changes."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import calibrate_time
    finally:
        sys.path.remove(str(REPO / "bench"))
    doc = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())
    assert hashlib.sha256(DATA_PATH.read_bytes()).hexdigest()[:12] in doc["data"]
    from torchkit.estimate.calibration.crossval import observations_from_rows
    from torchkit.estimate.calibration.tables import load_tables

    rows = list(read_measured(catalog=catalog))
    held = held_out_ids(rows, catalog)
    fresh = calibrate_time.fit_constants(observations_from_rows(rows, load_tables(rows), catalog), held)
    for name, entry in doc["global"].items():
        assert entry["value"] == pytest.approx(getattr(fresh.global_constants, name), rel=1e-5), name
        assert entry["source"]
    assert set(doc["arch"]) == set(fresh.arch_constants)
    for arch, entry in doc["arch"].items():
        for name, c in entry["constants"].items():
            assert c["value"] == pytest.approx(getattr(fresh.arch_constants[arch], name), rel=1e-5), (
                arch,
                name,
            )
            assert "fit on" in c["source"]
        assert entry["log_sigma"] > 0 and entry["log_sigma_source"]
    assert set(doc["stacks"]) == set(fresh.stack_terms)
    for stack, entry in doc["stacks"].items():
        assert entry["throughput_factor"] == pytest.approx(
            fresh.stack_terms[stack].throughput_factor, rel=1e-5
        )
        assert entry["memory_traffic"] == pytest.approx(fresh.stack_terms[stack].memory_traffic, rel=1e-5)
        assert entry["anchors"], stack  # tied to eager PyTorch through an architecture with eager rows
    assert set(doc["held_out_rows"]).isdisjoint(doc["fit_rows"])
    assert sorted(doc["held_out_rows"]) == sorted(held)


def test_a_gpu_gets_its_architectures_constants_and_uncertainty(catalog) -> None:
    model = load_time_model()
    v100, a100_40, h100, rtx4090 = (
        catalog.get(n) for n in ("V100-SXM2-16GB", "A100-PCIe-40GB", "H100-SXM5-80GB", "RTX-4090")
    )
    assert model.constants_for(v100) == model.arch_constants["volta"]
    assert model.constants_for(h100) == model.arch_constants["hopper"]  # MLPerf rows, as ratios
    assert model.constants_for(rtx4090) == model.arch_constants["ada"]
    u = model.uncertainty_for(v100)
    assert u.calibrated_gpu and u.calibrated_arch and u.log_sigma > 0
    u = model.uncertainty_for(a100_40)
    assert not u.calibrated_gpu and u.calibrated_arch  # an A100 variant without its own rows
    assert u.log_sigma == pytest.approx(np.hypot(model.arch_log_sigma["ampere-ga100"], model.type_log_sigma))
    u = model.uncertainty_for(h100)
    assert u.calibrated_gpu and u.calibrated_arch and "per GPU of" in u.reason
    assert (
        u.log_sigma > model.uncertainty_for(v100).log_sigma
    )  # widened: its rows are per GPU of N, another stack
    assert u.relative == pytest.approx(np.exp(u.log_sigma) - 1)
    u = model.uncertainty_for(rtx4090)
    assert not u.calibrated_gpu and u.calibrated_arch and u.log_sigma > model.uncertainty_for(h100).log_sigma
    blackwell = replace(h100, name="B-TEST", compute_capability="10.0")  # an architecture the data lacks
    assert model.constants_for(blackwell) == model.global_constants
    u = model.uncertainty_for(blackwell)
    assert not u.calibrated_gpu and not u.calibrated_arch and u.log_sigma == model.unseen_log_sigma


def test_the_environment_variable_points_the_estimator_at_another_calibration(
    tmp_path, monkeypatch, catalog
) -> None:
    from torchkit.estimate.time_model import constants_for

    doc = json.loads(DEFAULT_TIME_MODEL_PATH.read_text())
    doc["arch"]["volta"]["constants"]["tensor_core_efficiency"]["value"] = 0.123
    other = tmp_path / "tm.json"
    other.write_text(json.dumps(doc))
    monkeypatch.setenv(TIME_MODEL_ENV, str(other))
    assert constants_for(catalog.get("V100-SXM2-16GB")).tensor_core_efficiency == 0.123
    monkeypatch.setenv(TIME_MODEL_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="is not a file"):
        constants_for(catalog.get("V100-SXM2-16GB"))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"global": {}}))
    monkeypatch.setenv(TIME_MODEL_ENV, str(broken))
    with pytest.raises(ConfigError, match="regenerate"):
        constants_for(catalog.get("V100-SXM2-16GB"))


@pytest.mark.slow
def test_the_cached_kernel_tables_are_what_the_estimator_records_today(catalog) -> None:
    """kernel_tables.json must be rebuilt (calibrate_time.py --refresh-tables) when the workloads or the cost
    model change: one configuration is recomputed here and compared, and every fingerprint is checked."""
    from torchkit.estimate.calibration.tables import TABLES_PATH, build_tables
    from torchkit.workloads import get_workload, workload_fingerprint

    doc = json.loads(TABLES_PATH.read_text())
    for model, fingerprint in doc["fingerprints"].items():
        assert workload_fingerprint(get_workload(model)) == fingerprint, model
    row = next(
        r for r in read_measured(catalog=catalog) if r.id == "timm-rx101-3090-nchw"
    )  # grouped convolutions too
    fresh = build_tables([row], progress=False)
    key = next(iter(fresh["tables"]))
    assert fresh["tables"][key] == doc["tables"][key]
    assert fresh["cuda_peak_bytes"][key] == doc["cuda_peak_bytes"][key]
