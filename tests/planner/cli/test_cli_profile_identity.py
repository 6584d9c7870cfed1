"""``batchplan profile`` never answers an edited model from the cache ([truth] item 1): a user factory whose
``forward`` gains ``torch.utils.checkpoint`` (same layers, same printout, same parameter shapes) is a new
profile, estimated again; the unchanged file is found in the cache. Runs the CLI in subprocesses (4-8 s each).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.planner.cli_helpers import assert_ok, check_profile, parse_json_stdout, run_cli

MODEL_FILE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(4))

        def forward(self, x):
            for block in self.blocks:
                x = x + {call}
            return x


    def build():
        return Net()
    """
)
PLAIN = "block(x)"
CHECKPOINTED = "checkpoint(block, x, use_reentrant=False)"


def _profile(tmp_path: Path) -> tuple[dict, str]:
    result = run_cli(
        "profile",
        "--cache-dir",
        tmp_path / "cache",
        "--gpu",
        "T4",
        "--model",
        "edited_model:build",
        "--input-shape",
        "256",
        "--amp",
        "off",
        "--json",
        cwd=tmp_path,
    )
    assert_ok(result)
    return check_profile(parse_json_stdout(result)), result.stderr


@pytest.mark.slow
def test_a_model_whose_forward_gains_checkpointing_is_not_answered_from_the_cache(tmp_path: Path) -> None:
    source = tmp_path / "edited_model.py"
    source.write_text(MODEL_FILE.format(call=PLAIN))
    plain, stderr = _profile(tmp_path)
    assert "from the cache" not in stderr
    _, stderr = _profile(tmp_path)
    assert "from the cache" in stderr, "the unchanged model is found again"

    source.write_text(MODEL_FILE.format(call=CHECKPOINTED))
    checkpointed, stderr = _profile(tmp_path)
    assert "from the cache" not in stderr, "an edited forward is another step"
    per_sample = [doc["profile"]["memory_fit"]["bytes_per_sample"] for doc in (plain, checkpointed)]
    assert per_sample[1] < per_sample[0], "checkpointing keeps fewer activations per sample"
