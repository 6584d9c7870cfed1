"""torchkit.workloads.fingerprint: a workload's key is the step it trains. Pairs of models that print alike and
have the same parameter shapes, but differ in a checkpoint wrapper, a dropout rate or a forward method, get
distinct keys; the same model built twice (in this process or another) gets the same key."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from torchkit.workloads import Workload, get_workload, workload_fingerprint
from torchkit.workloads.fingerprint import (
    FINGERPRINT_REVISION,
    code_digest,
    identity_parts,
    library_versions,
    model_identity,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
WIDTH = 16


class Block(nn.Module):
    """A residual MLP block that can checkpoint its inner layers (a flag, as timm's ``grad_checkpointing``)."""

    def __init__(self, use_checkpoint: bool = False) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH))
        self.use_checkpoint = use_checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_checkpoint:
            return x + checkpoint(self.inner, x, use_reentrant=False)
        return x + self.inner(x)


class CheckpointedBlock(Block):
    """The same block with checkpointing written into ``forward`` instead of a flag."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + checkpoint(self.inner, x, use_reentrant=False)


class OneLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)


def relu_forward(self, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(self.fc(x))


def tanh_forward(self, x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(self.fc(x))


def net_with(forward) -> nn.Module:
    """A ``Net`` (one name, one printout) whose class has ``forward``."""
    return type("Net", (OneLayer,), {"forward": forward})()


def key_of(model: nn.Module) -> str:
    return hashlib.sha256(json.dumps(model_identity(model), sort_keys=True).encode()).hexdigest()


def assert_same_printout_and_shapes(a: nn.Module, b: nn.Module) -> None:
    # what the old fingerprint hashed: equal here, so only the new parts can tell the pair apart
    assert str(a) == str(b)
    assert [(n, p.shape) for n, p in a.named_parameters()] == [(n, p.shape) for n, p in b.named_parameters()]


def test_a_checkpointing_flag_gives_another_key():
    plain, checkpointed = Block(), Block(use_checkpoint=True)
    assert_same_printout_and_shapes(plain, checkpointed)
    assert key_of(plain) != key_of(checkpointed)


def test_a_checkpoint_written_into_forward_gives_another_key():
    plain, checkpointed = nn.Sequential(Block()), nn.Sequential(CheckpointedBlock())
    assert key_of(plain) != key_of(checkpointed)
    assert model_identity(plain)["forward"] != model_identity(checkpointed)["forward"]


def test_an_attention_dropout_rate_gives_another_key():
    # nn.MultiheadAttention keeps its dropout as a float attribute, not a Dropout module: it does not print
    torch.manual_seed(0)
    with_dropout = nn.TransformerEncoderLayer(WIDTH, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    without = copy.deepcopy(with_dropout)
    without.self_attn.dropout = 0.0
    assert_same_printout_and_shapes(with_dropout, without)
    assert key_of(with_dropout) != key_of(without)


def test_another_forward_method_gives_another_key():
    relu, tanh = net_with(relu_forward), net_with(tanh_forward)
    assert_same_printout_and_shapes(relu, tanh)
    assert key_of(relu) != key_of(tanh)


def test_a_forward_hook_gives_another_key():
    hooked = Block()
    hooked.inner.register_forward_hook(lambda module, args, output: output * 2)
    assert key_of(Block()) != key_of(hooked)


def test_the_same_model_built_twice_has_the_same_key():
    assert key_of(Block(use_checkpoint=True)) == key_of(Block(use_checkpoint=True))
    assert key_of(nn.TransformerEncoderLayer(WIDTH, 2, 32)) == key_of(
        nn.TransformerEncoderLayer(WIDTH, 2, 32)
    )


def _block_workload(use_checkpoint: bool) -> Workload:
    return Workload(
        name="test:block",
        sample_shape=(WIDTH,),
        build_model=functools.partial(Block, use_checkpoint=use_checkpoint),
        make_batch=lambda b: (torch.randn(b, WIDTH), None),
        loss_fn=lambda out, _: out.pow(2).mean(),
    )


def test_workload_keys_tell_the_pair_apart_and_repeat_for_the_same_workload():
    plain, checkpointed = _block_workload(False), _block_workload(True)
    assert workload_fingerprint(plain) == workload_fingerprint(_block_workload(False))
    assert workload_fingerprint(plain) != workload_fingerprint(checkpointed)
    assert len(workload_fingerprint(plain)) == 16
    assert identity_parts(plain)["revision"] == FINGERPRINT_REVISION


@pytest.mark.slow
def test_a_built_in_key_is_the_same_in_another_process_with_another_hash_seed():
    code = (
        "from torchkit.workloads import get_workload, workload_fingerprint; "
        "print(workload_fingerprint(get_workload('gpt2-small', seq_len=16)))"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONHASHSEED": seed},
    ).stdout.strip()
    assert other == workload_fingerprint(get_workload("gpt2-small", seq_len=16))


def test_code_without_source_is_hashed_by_its_code_object():
    namespace: dict = {}
    exec("def double(x):\n    return 2 * x\ndef triple(x):\n    return 3 * x\n", namespace)  # no source file
    again: dict = {}
    exec("def double(x):\n    return 2 * x\n", again)
    assert code_digest(namespace["double"]) == code_digest(again["double"])
    assert code_digest(namespace["double"]) != code_digest(namespace["triple"])
    assert code_digest(len) == "builtin"


def test_library_versions_name_the_libraries_of_the_model_and_of_the_source():
    workload = _block_workload(False)
    model = Block()
    assert ["torch", torch.__version__] in library_versions(workload, model)
    hf = Workload(
        name="hf:tiny",
        sample_shape=(8,),
        build_model=Block,
        make_batch=workload.make_batch,
        loss_fn=workload.loss_fn,
    )
    assert "transformers" in dict(library_versions(hf, model))  # its version, or "not installed"


def test_settings_are_hashed_by_value_and_objects_by_type_never_by_address():
    import numpy as np

    from torchkit.workloads.fingerprint import value_identity

    assert value_identity(np.float32(0.5)) == 0.5 and value_identity(np.int64(3)) == 3
    assert value_identity(float("nan")) == "nan"
    assert value_identity({"b": 1, "a": (2.0, None)}) == [["a", [2.0, None]], ["b", 1]]
    assert value_identity({3, 1, 2}) == value_identity({2, 3, 1})
    assert value_identity(object()) == value_identity(object()) == ["object", "builtins.object"]
    assert value_identity(torch.zeros(2, 3)) == ["tensor", [2, 3], "torch.float32"]
