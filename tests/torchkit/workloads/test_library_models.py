"""Models from the libraries people train with (timm, torchvision, Hugging Face, Ultralytics) and stock
torch modules on token ids: built outside fake mode, estimated on fake copies, and held against the
peak of the same training step really run on CPU (torch.profiler allocation records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.library_models import CASE_PARAMS, CASES, ModelCase, require_library, write_tiny_gpt2_config
from torchkit.errors import WorkloadError
from torchkit.estimate import cpu_peak_bytes, cuda_device_bytes, estimate_step
from torchkit.estimate.cpu_truth import measure_cpu_peak
from torchkit.workloads import Workload, get_workload, model_template, workload_fingerprint
from torchkit.workloads.construct import build_outside_fake_mode


@pytest.mark.slow
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_cpu_estimate_is_within_5_percent_of_the_real_step_at_two_batches(
    case: ModelCase, tmp_path: Path
) -> None:
    require_library(case)
    workload = get_workload(case.name_with(write_tiny_gpt2_config(tmp_path)), **case.options)
    for batch in case.batches:
        estimate = estimate_step(workload, batch, target="cpu")
        truth = measure_cpu_peak(workload, batch)
        assert cpu_peak_bytes(estimate) == pytest.approx(truth.peak_bytes, rel=0.05), (case.model, batch)


def test_a_constructor_that_reads_values_is_built_on_the_cpu_and_estimated() -> None:
    class ReadsValues(nn.Module):  # timm-style: drop-path rates from linspace(...).tolist()
        def __init__(self) -> None:
            super().__init__()
            rates = torch.linspace(0, 0.1, 3).tolist()
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in rates)
            self.register_buffer("scale", torch.ones(8) * float(torch.tensor(2.0).item()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x) * self.scale
            return x

    model, built_on = build_outside_fake_mode(ReadsValues)
    assert built_on == "cpu" and model.scale.device.type == "cpu"
    workload = Workload(
        name="reads-values",
        sample_shape=(8,),
        build_model=ReadsValues,
        make_batch=lambda b: (torch.randn(b, 8), None),
        loss_fn=lambda out, _: out.pow(2).mean(),
    )
    estimate = estimate_step(workload, 4)
    params = 3 * (8 * 8 + 8) * 4
    assert estimate.breakdown_bytes["parameters"] == params
    assert estimate.breakdown_bytes["buffers"] == 8 * 4


def test_a_shape_only_constructor_is_built_on_the_meta_device() -> None:
    model, built_on = build_outside_fake_mode(lambda: nn.Linear(4096, 4096))
    assert built_on == "meta" and model.weight.device.type == "meta"


def test_tied_weights_stay_one_parameter_in_the_estimate() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(100, 16)
            self.head = nn.Linear(16, 100, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(tokens))

    workload = Workload(
        name="tied",
        sample_shape=(8,),
        build_model=Tied,
        make_batch=lambda b: (torch.randint(0, 100, (b, 8)), None),
        loss_fn=lambda out, _: out.pow(2).mean(),
    )
    assert estimate_step(workload, 2).breakdown_bytes["parameters"] == 100 * 16 * 4


def test_stock_transformer_encoder_no_longer_mixes_fake_modes() -> None:
    workload = get_workload("tests.planner.tiny_models:transformer_encoder", seq_len=16, vocab_size=1000)
    estimate = estimate_step(workload, 2)
    assert estimate.num_params == sum(p.numel() for p in model_template(workload).parameters())


def test_token_inputs_are_integer_ids_in_the_vocabulary() -> None:
    workload = get_workload("tests.planner.tiny_models:lstm_classifier", seq_len=12, vocab_size=1000)
    tokens, targets = workload.make_batch(3)
    assert tokens.dtype == torch.int64 and tuple(tokens.shape) == (3, 12) and targets is None
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 1000
    assert workload.sample_shape == (12,)
    other = get_workload("tests.planner.tiny_models:lstm_classifier", seq_len=12, vocab_size=500)
    assert workload_fingerprint(workload) != workload_fingerprint(other), "the vocabulary is part of the key"


def test_float_inputs_to_a_token_model_say_it_is_the_dtype() -> None:
    with pytest.raises(
        WorkloadError,
        match=r"cannot take input dtype float32.*integer token ids: give --seq-len N --vocab-size V",
    ):
        get_workload("tests.planner.tiny_models:lstm_classifier", input_shape=(32,))


def test_seq_len_without_a_vocabulary_asks_for_it() -> None:
    with pytest.raises(
        WorkloadError, match=r"--seq-len 32 means integer token ids; give their range with --vocab-size"
    ):
        get_workload("tests.planner.tiny_models:lstm_classifier", seq_len=32)


def test_input_dtype_is_checked_and_used() -> None:
    workload = get_workload("tests.planner.tiny_models:mlp", input_shape=(64,), input_dtype="float32")
    assert workload.make_batch(2)[0].dtype == torch.float32
    assert (
        get_workload("tests.planner.tiny_models:mlp", input_shape=(64,), input_dtype="bfloat16")
        .make_batch(2)[0]
        .dtype
        == torch.bfloat16
    )
    with pytest.raises(WorkloadError, match=r"input dtype 'int8' is unknown"):
        get_workload("tests.planner.tiny_models:mlp", input_shape=(64,), input_dtype="int8")
    with pytest.raises(WorkloadError, match=r"integer inputs \(int64\) need their range: give --vocab-size"):
        get_workload("tests.planner.tiny_models:mlp", input_shape=(64,), input_dtype="int64")


def test_options_a_source_does_not_take_are_refused() -> None:
    with pytest.raises(WorkloadError, match=r"--vocab-size describes the input of a package.module:factory"):
        get_workload("resnet18", vocab_size=10)
    with pytest.raises(WorkloadError, match=r"--seq-len is for token models"):
        get_workload("ultralytics:yolov8n.yaml", seq_len=10)


def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import sys

    from torchkit.workloads.extras import extra_hint

    monkeypatch.setitem(sys.modules, "timm", None)  # what Python does for a module that is not installed
    with pytest.raises(
        WorkloadError, match=rf"needs timm, which is not installed \({re.escape(extra_hint())}\)"
    ) as e:
        get_workload("timm:resnet18")
    assert "\n" not in str(e.value)


class _Installed:
    """A ``batchplan`` distribution as pip leaves it: ``direct_url.json`` (PEP 610) or none."""

    def __init__(self, direct_url: dict | None) -> None:
        self._text = None if direct_url is None else __import__("json").dumps(direct_url)

    def read_text(self, name: str) -> str | None:
        return self._text if name == "direct_url.json" else None


@pytest.mark.parametrize(
    "direct_url, hint",
    [
        (None, "pip install 'batchplan[models]'"),  # from an index
        (
            {"url": "file:///wheels/batchplan-0.1-py3-none-any.whl", "archive_info": {}},
            "pip install 'batchplan[models]'",
        ),
        (
            {"url": "file:///home/me/batch%20plan", "dir_info": {"editable": True}},
            "pip install -e '/home/me/batch plan[models]'",
        ),
        (
            {"url": "file:///home/me/batchplan", "dir_info": {}},
            "pip install 'batchplan[models]'",
        ),  # a non-editable checkout
    ],
)
def test_the_extra_hint_is_the_command_for_how_batchplan_was_installed(monkeypatch, direct_url, hint) -> None:
    import importlib.metadata

    from torchkit.workloads import extras

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _Installed(direct_url))
    extras.extra_hint.cache_clear()
    try:
        assert extras.extra_hint() == hint
    finally:
        extras.extra_hint.cache_clear()


def test_the_extra_named_by_the_hint_is_declared_with_the_libraries() -> None:
    import tomllib

    from tests.planner.cli_helpers import REPO_ROOT
    from torchkit.workloads import extras

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == extras.DISTRIBUTION
    declared = {r.split(">")[0].split("=")[0] for r in project["optional-dependencies"][extras.EXTRA]}
    assert declared == {"timm", "transformers", "ultralytics"}


@pytest.mark.transformers
def test_hf_model_takes_dict_inputs_and_its_own_loss(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.model.startswith("hf:"))
    require_library(case)
    workload = get_workload(case.name_with(write_tiny_gpt2_config(tmp_path)), seq_len=16)
    inputs, targets = workload.make_batch(2)
    assert sorted(inputs) == ["attention_mask", "input_ids", "labels"] and targets is None
    assert tuple(inputs["input_ids"].shape) == (2, 16) and int(inputs["input_ids"].max()) < 1000
    assert workload.sample_shape == (16,)
    with pytest.raises(WorkloadError, match=r"sequence length 129 is outside 1\.\.128"):
        get_workload(case.name_with(tmp_path / "tiny-gpt2.json"), seq_len=129)


@pytest.mark.transformers
def test_hf_config_that_is_not_there_is_a_workload_error(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.model.startswith("hf:"))
    require_library(case)
    with pytest.raises(WorkloadError, match=r"does not exist"):
        get_workload(f"hf:{tmp_path / 'missing.json'}")
    (tmp_path / "bad.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(WorkloadError, match=r"is not a Hugging Face config"):
        get_workload(f"hf:{tmp_path / 'bad.json'}")


@pytest.mark.ultralytics
def test_yolo_loss_stand_in_and_its_margin_are_stated() -> None:
    case = next(c for c in CASES if c.model.startswith("ultralytics:"))
    require_library(case)
    workload = get_workload(case.model, imgsz=320)
    template = model_template(workload)
    weight_bytes = sum(t.numel() * t.element_size() for t in (*template.parameters(), *template.buffers()))
    assert workload.margin_bytes == weight_bytes > 12 * 2**20, "yolov8n: 3.2 M parameters, fp32 EMA copy"
    assert any("stand-in for Ultralytics' v8DetectionLoss" in n for n in workload.notes)
    assert any("ModelEMA" in n for n in workload.notes)
    from torchkit.hardware.catalog import load_catalog

    t4 = load_catalog().get("T4")
    estimate = estimate_step(workload, 1)
    without = estimate.__class__(**{**estimate.__dict__, "margin_bytes": 0})
    assert cuda_device_bytes(estimate, t4) - cuda_device_bytes(without, t4) >= workload.margin_bytes
    with pytest.raises(WorkloadError, match=r"divisible by 32"):
        get_workload(case.model, imgsz=300)
    with pytest.raises(WorkloadError, match=r"no model YAML 'yolov99z.yaml'"):
        get_workload("ultralytics:yolov99z.yaml")


@pytest.mark.transformers
def test_hf_class_name_as_config_json_lists_it_builds_that_class() -> None:
    case = next(c for c in CASES if c.model.startswith("hf:"))
    require_library(case)
    workload = get_workload("hf:GPT2LMHeadModel", seq_len=16)
    assert workload.description.startswith("Hugging Face GPT2LMHeadModel (gpt2), sequence length 16")
    with pytest.raises(WorkloadError, match=r"a model class such as GPT2LMHeadModel"):
        get_workload("hf:NoSuchLMHeadModel", seq_len=16)
