"""``batchplan profile --model SOURCE:NAME --gpu T4 --json`` for a small real model of every model source
(timm, torchvision, Hugging Face, Ultralytics, a factory on token ids, the stock TransformerEncoder), in a
subprocess as a user runs it; sources whose library cannot import here skip with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.library_models import CASE_PARAMS, ModelCase, require_library, write_tiny_gpt2_config
from tests.planner.cli_helpers import (
    assert_ok,
    assert_user_error,
    check_profile,
    parse_json_stdout,
    run_cli,
    run_cli_process,
)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_profile_json_of_a_library_model_on_a_t4(case: ModelCase, tmp_path: Path) -> None:
    require_library(case)
    model = case.name_with(write_tiny_gpt2_config(tmp_path))
    # importing a library's torch stack (a CUDA torch and torchvision in CI's timm stage) and estimating takes
    # minutes on a loaded 2-core machine: a wide limit, only against a hang
    result = run_cli_process(
        "profile", "--model", model, *case.flags(), "--gpu", "T4", "--json", cwd=tmp_path, timeout=900
    )
    assert_ok(result)
    doc = check_profile(parse_json_stdout(result))
    assert doc["job"]["model"] == model
    assert doc["chosen_batch"] > 0 and doc["profile"]["method"] == "estimate"
    if case.model.startswith("ultralytics:"):
        notes = " ".join(doc["profile"]["notes"])
        assert "stand-in for Ultralytics' v8DetectionLoss" in notes and "ModelEMA" in notes


@pytest.mark.slow
def test_token_ids_for_a_float_model_and_floats_for_a_token_model_name_the_dtype(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--model",
        "tests.planner.tiny_models:lstm_classifier",
        "--input-shape",
        "32",
        "--gpu",
        "T4",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "input dtype float32", "--seq-len N --vocab-size V")
    result = run_cli(
        "profile",
        "--model",
        "tests.planner.tiny_models:convnet",
        "--input-shape",
        "3,32,32",
        "--vocab-size",
        "100",
        "--gpu",
        "T4",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "input dtype int64", "--input-shape")


def test_seq_len_for_a_factory_needs_the_vocabulary(tmp_path: Path) -> None:
    result = run_cli(
        "profile",
        "--model",
        "tests.planner.tiny_models:lstm_classifier",
        "--seq-len",
        "32",
        "--gpu",
        "T4",
        cwd=tmp_path,
    )
    assert_user_error(result, 2, "--vocab-size")
