"""README.md says what is true (issue #23, papercuts): its training-script snippet runs as written under
torchrun, the Set-up section keeps exactly its two commands, Ray Train's extra is named, and the one-sigma figure
of an uncalibrated GPU type is the one the plan warning states."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.gloo import describe_torchrun, torchrun, torchrun_env
from tests.plans import make_plan

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_training_script_snippet_runs_as_written_with_accumulation(tmp_path: Path) -> None:
    snippet = _code_blocks(_section("Using the plan in a training script"), "python")[0]
    assert "set_epoch" in snippet and "plan.accumulate" in snippet and ".to(device)" in snippet
    (tmp_path / "train.py").write_text(snippet)
    (tmp_path / "plan.json").write_text(json.dumps(make_plan((5, 3), nodes=(("node-a", 2),), accumulate=2)))
    result = torchrun("train.py", nproc=2, cwd=tmp_path, env=torchrun_env(PYTHONPATH=str(REPO)))
    assert result.returncode == 0, describe_torchrun(result)
    # 1024 samples, 8 per global micro-step, 2 micro-steps per optimizer step: 64 optimizer steps an epoch
    assert "trained 2 epochs: 64 optimizer steps each" in result.stdout, result.stdout


def test_set_up_keeps_exactly_its_two_commands() -> None:
    assert len(_code_blocks(_section("Set up"), "bash")) == 2


def test_ray_train_needs_are_named() -> None:
    assert "pip install 'ray[train]'" in README


def test_the_one_sigma_figure_of_an_uncalibrated_gpu_type_is_the_time_model_s() -> None:
    model = json.loads((REPO / "torchkit/estimate/calibration/time_model.json").read_text())
    figure = f"±{math.exp(model['unseen_gpu_log_sigma']) - 1:.0%} one sigma"
    assert figure in _section("Limitations"), figure
    assert "±24%" not in README
