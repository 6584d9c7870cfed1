"""bench/lambda_rows.py reads Lambda's benchmark by a fixed rule: single-GPU runs, one row per (GPU type,
PyTorch build, precision) at the median of its runs, the batch and build from each run's files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOG = (
    "DLL 2023-02-14 05:08:00 - PARAMETER data : /data/imagenet  data_backend : synthetic  arch : resnet50  "
    "batch_size : {batch}  optimizer : sgd  momentum : 0.9  amp : {amp}  memory_format : nchw  world_size : 1\n"
)


@pytest.fixture(scope="module")
def lambda_rows():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import lambda_rows
    finally:
        sys.path.remove(str(REPO / "bench"))
    return lambda_rows


def _run(root: Path, gpu: str, build: str, batches: tuple[int, int]) -> None:
    (root / "sys_pytorch.txt").parent.mkdir(parents=True)
    (root / "sys_pytorch.txt").write_text(f"GPU: {gpu.replace(' ', '_')}\nPyTorch Version: {build}\n")
    for suffix, batch, amp in (("AMP", batches[0], "True"), ("FP32", batches[1], "False")):
        run = root / f"PyTorch_resnet50_{suffix}"
        run.mkdir()
        (run / "benchmark.para").write_text(f"GLOBAL_BATCH {batch}\nGPU 1\n")
        (run / "01-01-2023_00-00-00.txt").write_text(LOG.format(batch=batch, amp=amp))


def _fake_benchmark(tmp_path: Path) -> Path:
    """Two single-GPU systems of one build, a 2-GPU system, two v2 single-GPU runs of one type (a median) and
    one on a GPU the catalog lacks."""
    repo = tmp_path / "deeplearning-benchmark"
    py = repo / "pytorch"
    (py / "scripts").mkdir(parents=True)
    (py / "scripts" / "compile_results_pytorch.py").write_text(
        'list_system_single = {"V100_v1": ([1, 1], "V100 16GB", 300, 1), "A100_v1": ([1, 1], "A100 80GB", 400, 1)}\n'
    )
    for precision, (v100, a100) in (("fp16", (833, 1582)), ("fp32", (369, 1066))):
        (py / f"pytorch-train-throughput-{precision}.csv").write_text(
            f"name_gpu,num_gpu,resnet50\nV100 16GB,1.0,{v100}\nA100 80GB,1.0,{a100}\n2x A100 80GB,2.0,{2 * a100}\n"
        )
        bs = (256, 1280) if precision == "fp16" else (128, 640)
        (py / f"pytorch-train-bs-{precision}.csv").write_text(
            f"name_gpu,num_gpu,resnet50\nV100 16GB,1,{bs[0]}\nA100 80GB,1,{bs[1]}\n"
        )
        (py / f"pytorch-train-throughput-v2-{precision}.csv").write_text(
            ",resnet50\nX_1xH100_a_v2,2780\nX_1xH100_b_v2,2800\nX_8xH100_a_v2,22000\nX_1xGH200_v2,2846\n"
            "X_1xH200_v2,3079\n"
            if precision == "fp16"
            else ",resnet50\nX_1xH100_a_v2,1890\nX_1xH100_b_v2,1896\nX_8xH100_a_v2,15000\nX_1xGH200_v2,2063\n"
            "X_1xH200_v2,2259\n"
        )
    old, new = "1.13.0a0+d0d6b1f", "2.3.0a0+40ec155e58.nv24.03"
    _run(py / "results" / "V100_v1", "Tesla V100-SXM2-16GB", old, (256, 128))
    _run(py / "results" / "A100_v1", "NVIDIA A100-SXM4-80GB", old, (1280, 640))
    for name in ("X_1xH100_a_v2", "X_1xH100_b_v2"):
        _run(py / "results_v2" / name, "NVIDIA H100 80GB HBM3", new, (1280, 640))
    _run(py / "results_v2" / "X_1xGH200_v2", "NVIDIA GH200 480GB", new, (1280, 640))
    _run(py / "results_v2" / "X_1xH200_v2", "NVIDIA H200", new, (2560, 1280))
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo


def test_rows_are_one_per_type_build_and_precision_at_the_median_of_single_gpu_runs(
    tmp_path, lambda_rows
) -> None:
    repo = _fake_benchmark(tmp_path)
    rev = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = {r[0]: r for r in lambda_rows.rows(repo, rev)}
    assert set(rows) == {
        f"lambda-r50-{g}-{p}-{b}"
        for g, p, b in (
            ("v100-sxm2-16gb", "fp16", "pt113"),
            ("v100-sxm2-16gb", "fp32", "pt113"),
            ("a100-sxm4-80gb", "fp16", "pt113"),
            ("a100-sxm4-80gb", "tf32", "pt113"),
            ("h100-sxm5-80gb", "fp16", "pt23"),
            ("h100-sxm5-80gb", "tf32", "pt23"),
            ("h200-sxm-141gb", "fp16", "pt23"),
            ("h200-sxm-141gb", "tf32", "pt23"),
        )
    }  # no GH200: not in the catalog
    a100 = rows["lambda-r50-a100-sxm4-80gb-fp16-pt113"]
    assert a100[1:8] == ["resnet50", "A100-SXM4-80GB", "fp16", "nchw", "1280", "1582", "sgd"]
    assert a100[11:] == ["1", "lambda-pt113"] and f"@{rev[:8]}" in a100[8] and "--amp" in a100[9]
    assert rows["lambda-r50-a100-sxm4-80gb-tf32-pt113"][5] == "640"  # the fp32 run's own batch
    h100 = rows["lambda-r50-h100-sxm5-80gb-fp16-pt23"]
    assert h100[6] == "2790" and "median of 2 single-GPU runs" in h100[8]  # the two 1x runs, not the 8x one
    assert "X_8xH100" not in h100[8] and h100[12] == "lambda-pt23"
    assert rows["lambda-r50-h200-sxm-141gb-fp16-pt23"][5] == "2560"


def test_a_build_with_one_gpu_type_has_nothing_to_be_placed_against(
    tmp_path, lambda_rows, monkeypatch
) -> None:
    repo = _fake_benchmark(tmp_path)
    full = lambda_rows.load_catalog()
    monkeypatch.setattr(lambda_rows, "load_catalog", lambda: _without(full, "H200-SXM-141GB"))
    rows = [r[0] for r in lambda_rows.rows(repo, "HEAD")]
    assert rows and not any(i.endswith("-pt23") for i in rows)


def _without(catalog, name: str):
    from torchkit.hardware.catalog import GpuCatalog

    return GpuCatalog(types={k: v for k, v in catalog.types.items() if k != name}, source=catalog.source)


@pytest.fixture(scope="module")
def eval_lambda():
    spec = importlib.util.spec_from_file_location("eval_lambda", REPO / "bench" / "eval_lambda.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["eval_lambda"] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["eval_lambda"]


def test_eval_lambda_prices_each_row_at_its_own_precision_from_cached_tables(
    tmp_path, eval_lambda, monkeypatch
) -> None:
    """The fake clone's V100 rows are Lambda's own (833 img/s AMP at batch 256, 369 fp32 at 128), batches the
    calibration's kernel cache holds: priced with no fake pass, each near its measurement (the V100 is a
    calibrated anchor); an AMP row priced as fp32 would be off by 2x."""
    from torchkit.estimate import estimator
    from torchkit.estimate.time_model import DEFAULT_TIME_MODEL_PATH, load_time_model

    repo = _fake_benchmark(tmp_path)
    rows = [r for r in eval_lambda.read_rows(repo, "HEAD") if r.gpu == "V100-SXM2-16GB"]
    assert sorted((r.precision, r.batch, r.measured) for r in rows) == [
        ("fp16", 256, 833.0),
        ("fp32", 128, 369.0),
    ]

    def no_fake_pass(*args, **kwargs):
        raise AssertionError("a fake pass for a cached table")

    monkeypatch.setattr(estimator, "estimate_step", no_fake_pass)
    priced = eval_lambda.price(
        rows, eval_lambda.kernel_tables(rows), load_time_model(DEFAULT_TIME_MODEL_PATH)
    )
    ratios = {x.row.precision: x.ratio for x in priced}
    assert 0.8 < ratios["fp16"] < 1.25 and 0.8 < ratios["fp32"] < 1.25
    assert all(x.log_sigma > 0 for x in priced)


def test_eval_lambda_mix_splits_by_predicted_speed_and_runs_at_measured(eval_lambda) -> None:
    """Two cards measured alike, one predicted 2x: it gets 2/3 of the batch and sets the step, 0.75 of the bound."""

    def priced(gpu: str, predicted: float, measured: float = 100.0):
        row = eval_lambda.Row(gpu=gpu, build="lambda-pt113", precision="fp16", batch=256, measured=measured)
        return eval_lambda.Priced(row=row, predicted=predicted, log_sigma=0.1)

    pair = [priced("A100-SXM4-80GB", 200.0), priced("V100-SXM2-16GB", 100.0)]
    assert eval_lambda.mix_efficiency(pair) == pytest.approx(0.75)
    s = eval_lambda.summary(pair)
    assert (s["rows"], s["types"], s["types_within_20pct"]) == (2, 2, 1)
    assert s["ratio_max"] == pytest.approx(2.0) and s["within_2sigma"] == pytest.approx(0.5)
    assert s["mix_min"] == pytest.approx(0.75)
    assert eval_lambda.summary(pair[1:])["mix_min"] == 1.0  # one type: nothing to split
