"""Small real models of every model source, shared by the estimator tests and the CLI tests: the model
name, the options that size them (as ``get_workload`` keywords and as CLI flags), and a skip with the
reason when the source's library cannot be imported here.

PyPI's x86_64 torchvision is a CUDA build: beside the CPU torch of the test environment it cannot import,
and then timm (which imports it) and ``torchvision:`` models cannot be built here, transformers fails when
torchvision is installed at all, and Ultralytics needs it installed (it reads its version). Those cases
skip with the library's own error; they run on a machine whose torchvision matches its torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: a 2-layer GPT-2 (the architecture of ``gpt2``, shrunk so a real CPU step takes a fraction of a second)
TINY_GPT2_CONFIG = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 64,
    "n_positions": 128,
    "vocab_size": 1000,
}


@dataclass(frozen=True)
class ModelCase:
    """One small model of one source."""

    model: str
    """the --model value (``{config}`` stands for the path of a config file the test writes)"""
    options: dict = field(default_factory=dict)
    """get_workload keywords that size it"""
    library: str | None = None
    """the module its source imports, or None for plain torch"""
    batches: tuple[int, int] = (2, 4)
    """two batch sizes for the CPU ground-truth comparison"""

    def flags(self) -> list[str]:
        """The CLI flags of ``options``."""
        out: list[str] = []
        for key, value in self.options.items():
            out += [f"--{key.replace('_', '-')}", str(value)]
        return out

    def name_with(self, config_path: Path | None) -> str:
        return self.model.replace("{config}", str(config_path)) if config_path else self.model

    def id(self) -> str:
        return self.model.replace("{config}", "tiny-gpt2.json")

    def marks(self) -> list[pytest.MarkDecorator]:
        """The library's cost marker (pyproject.toml: ``timm``, ``torchvision``, ``transformers``,
        ``ultralytics``), which also picks the CI stage that runs the case (.ci/run)."""
        if self.library is None:
            return []
        return [getattr(pytest.mark, LIBRARY_MARKERS[self.library.split(".", 1)[0]])]


#: the top-level module a case imports -> its marker
LIBRARY_MARKERS = {
    "timm": "timm",
    "torchvision": "torchvision",
    "transformers": "transformers",
    "ultralytics": "ultralytics",
}

CASES = (
    ModelCase("timm:resnet18", {"imgsz": 64}, "timm"),
    ModelCase("timm:vit_tiny_patch16_224", {"imgsz": 64}, "timm"),
    ModelCase("torchvision:mobilenet_v3_small", {"imgsz": 64}, "torchvision.models"),
    ModelCase("hf:{config}", {"seq_len": 32}, "transformers.modeling_utils"),
    ModelCase("ultralytics:yolov8n.yaml", {"imgsz": 320}, "ultralytics.nn.tasks", batches=(1, 2)),
    ModelCase(
        "tests.planner.tiny_models:lstm_classifier", {"seq_len": 32, "vocab_size": 1000}, batches=(8, 32)
    ),
    ModelCase(
        "tests.planner.tiny_models:transformer_encoder", {"seq_len": 32, "vocab_size": 1000}, batches=(8, 32)
    ),
)


#: CASES as pytest parameters: each with its id and its library's marker
CASE_PARAMS = [pytest.param(case, id=case.id(), marks=case.marks()) for case in CASES]


def require_library(case: ModelCase) -> None:
    """Skip the test, with the library's own error, when the case's library cannot be imported here."""
    if case.library is None:
        return
    from torchkit.errors import WorkloadError
    from torchkit.workloads.extras import import_library

    try:
        import_library(case.library, model=case.model)
    except WorkloadError as e:
        pytest.skip(str(e))


def write_tiny_gpt2_config(directory: Path) -> Path:
    path = directory / "tiny-gpt2.json"
    path.write_text(json.dumps(TINY_GPT2_CONFIG))
    return path
