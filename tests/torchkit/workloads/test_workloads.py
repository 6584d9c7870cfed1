"""Reference workloads and user factories (torchkit/workloads)."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchkit.errors import WorkloadError
from torchkit.workloads import WORKLOAD_NAMES, Workload, get_workload, workload_fingerprint
from torchkit.workloads.yolo import ultralytics_loss_envelope_bytes

SMALL = {
    "resnet18": {"imgsz": 64},
    "resnet50": {"imgsz": 64},
    "yolo-n": {"imgsz": 64},
    "yolo-s": {"imgsz": 64},
    "vit-b16": {"imgsz": 32},
    "resnext101-32x4d": {"imgsz": 32},
    "se-resnext101-32x4d": {"imgsz": 32},
    "gpt2-small": {"seq_len": 16},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_builtin_workload_runs_a_real_training_step_on_cpu(name: str) -> None:
    torch.manual_seed(0)
    workload = get_workload(name, **SMALL[name])
    model = workload.build_model()
    inputs, targets = workload.make_batch(2)
    loss = workload.loss_fn(model(inputs), targets)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is not None for p in trainable)
    assert any(p.grad.abs().sum() > 0 for p in trainable)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("resnet18", 11_689_512),  # torchvision resnet18
        ("resnet50", 25_557_032),  # torchvision resnet50
        ("resnext101-32x4d", 44_177_704),  # torchvision resnext101_32x4d
        ("se-resnext101-32x4d", 48_955_416),  # timm seresnext101_32x4d (48.96 M)
        ("vit-b16", 86_567_656),  # torchvision vit_b_16
        ("gpt2-small", 124_439_808),  # Hugging Face gpt2 (tied LM head)
        ("yolo-n", 3_157_184),  # Ultralytics yolov8n: 3,157,200 minus its 16 frozen DFL weights
        ("yolo-s", 11_166_544),  # yolov8s: 11,166,560 minus 16
    ],
)
def test_parameter_count_matches_the_reference_model(name: str, expected: int) -> None:
    with FakeTensorMode():
        model = get_workload(name).build_model()
        assert sum(p.numel() for p in model.parameters()) == expected


def test_default_sizes_are_the_reference_ones() -> None:
    assert get_workload("resnet50").sample_shape == (3, 224, 224)
    assert get_workload("yolo-s").sample_shape == (3, 640, 640)
    assert get_workload("vit-b16").sample_shape == (3, 224, 224)
    assert get_workload("gpt2-small").sample_shape == (1024,)
    assert get_workload("gpt2-small", seq_len=128).sample_shape == (128,)
    assert get_workload("resnet18", input_shape=(3, 96, 96)).sample_shape == (3, 96, 96)


def test_make_batch_works_under_fake_tensor_mode() -> None:
    with FakeTensorMode():
        images, (labels, boxes, valid) = get_workload("yolo-n").make_batch(4)
        tokens, targets = get_workload("gpt2-small", seq_len=64).make_batch(3)
    assert tuple(images.shape) == (4, 3, 640, 640)
    assert (
        tuple(boxes.shape) == (4, 100, 4)
        and tuple(labels.shape) == (4, 100, 1)
        and tuple(valid.shape) == (4, 100, 1)
    )
    assert tuple(tokens.shape) == (3, 64) and tokens.dtype == torch.int64 and tuple(targets.shape) == (3, 64)


def test_unknown_workload_names_the_known_ones() -> None:
    with pytest.raises(
        WorkloadError,
        match=r"unknown workload 'resnet51'.*resnet18, resnet50, resnext101-32x4d, se-resnext101-32x4d, yolo-n",
    ):
        get_workload("resnet51")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "yolo-n", "imgsz": 100}, r"divisible by 32, got 100 \(use e.g. --imgsz 640\)"),
        ({"name": "vit-b16", "imgsz": 200}, r"divisible by 16, got 200"),
        ({"name": "gpt2-small", "seq_len": 2048}, r"sequence length 2048 is outside 1..1024"),
        (
            {"name": "resnet50", "input_shape": (1, 224, 224)},
            r"input shape \(1, 224, 224\) does not fit.*--input-shape 3,224,224",
        ),
        (
            {"name": "gpt2-small", "input_shape": (3, 32, 32)},
            r"input shape \(3, 32, 32\) does not fit.*--seq-len",
        ),
        ({"name": "resnet50", "imgsz": 128, "input_shape": (3, 96, 96)}, r"disagree"),
    ],
)
def test_invalid_sizes_are_workload_errors_with_the_fix(kwargs: dict, message: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(WorkloadError, match=message):
        get_workload(name, **kwargs)


@pytest.fixture
def user_models(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``user_models_for_test`` with factories good and bad, importable for this test."""
    (tmp_path / "user_models_for_test.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from torchkit.workloads import Workload

            def mlp():
                return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 4))

            def conv():
                return nn.Conv2d(3, 8, 3)

            def broken():
                raise RuntimeError("weights file missing")

            def no_params():
                return nn.ReLU()

            def not_a_model():
                return 42

            def whole_workload():
                return Workload(
                    name="user_models_for_test:whole_workload",
                    sample_shape=(8,),
                    build_model=lambda: nn.Linear(8, 2),
                    make_batch=lambda b: (torch.randn(b, 8), torch.randint(0, 2, (b,))),
                    loss_fn=lambda out, y: nn.functional.cross_entropy(out, y),
                )
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_models_for_test"


def test_user_factory_module_becomes_a_workload_with_the_documented_loss(user_models: str) -> None:
    workload = get_workload(f"{user_models}:mlp", input_shape=(3, 8, 8))
    assert workload.name == f"{user_models}:mlp" and workload.sample_shape == (3, 8, 8)
    model = workload.build_model()
    inputs, targets = workload.make_batch(5)
    output = model(inputs)
    assert targets is None
    assert torch.equal(workload.loss_fn(output, targets), output.float().pow(2).mean())


def test_user_factory_may_return_a_whole_workload(user_models: str) -> None:
    workload = get_workload(f"{user_models}:whole_workload")
    assert workload.sample_shape == (8,)
    assert isinstance(workload, Workload)


def test_failing_factory_names_the_factory_and_its_error(user_models: str) -> None:
    with pytest.raises(
        WorkloadError, match=rf"factory '{user_models}:broken' failed: RuntimeError: weights file missing"
    ):
        get_workload(f"{user_models}:broken", input_shape=(3, 8, 8))


def test_model_without_parameters_is_refused(user_models: str) -> None:
    with pytest.raises(WorkloadError, match=r"has no trainable parameters"):
        get_workload(f"{user_models}:no_params", input_shape=(3, 8, 8))


def test_factory_returning_something_else_is_refused(user_models: str) -> None:
    with pytest.raises(WorkloadError, match=r"returned int, not an nn.Module or a Workload"):
        get_workload(f"{user_models}:not_a_model", input_shape=(3, 8, 8))


def test_input_shape_that_does_not_fit_names_the_shape_and_the_fix(user_models: str) -> None:
    with pytest.raises(WorkloadError, match=r"cannot take input shape \(1, 8, 8\) per sample.*--input-shape"):
        get_workload(f"{user_models}:conv", input_shape=(1, 8, 8))


def test_user_factory_refuses_builtin_size_options(user_models: str) -> None:
    with pytest.raises(WorkloadError, match=r"user factory: give its per-sample input with --input-shape"):
        get_workload(f"{user_models}:mlp", imgsz=64)


def test_user_factory_without_input_shape_asks_for_it(user_models: str) -> None:
    with pytest.raises(WorkloadError, match=r"needs its per-sample input shape \(use --input-shape"):
        get_workload(f"{user_models}:mlp")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:build", r"cannot import 'no_such_module_xyz'.*PYTHONPATH"),
        ("user_models_for_test:missing", r"has no callable 'missing'"),
        ("just_a_module:", r"is not package.module:factory"),
    ],
)
def test_unimportable_factories_are_workload_errors(user_models: str, spec: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        get_workload(spec, input_shape=(3, 8, 8))


def test_fingerprint_is_stable_and_tells_workloads_apart() -> None:
    key = workload_fingerprint(get_workload("resnet18"))
    assert key == workload_fingerprint(get_workload("resnet18"))
    assert len(key) == 16
    others = {
        workload_fingerprint(get_workload("resnet50")),
        workload_fingerprint(get_workload("resnet18", imgsz=128)),
        workload_fingerprint(get_workload("gpt2-small", seq_len=256)),
        workload_fingerprint(get_workload("gpt2-small")),
    }
    assert key not in others and len(others) == 4


def test_ultralytics_envelope_matches_its_documented_examples() -> None:
    # reference/ultralytics-behaviour.md: at 640 (A=8400), max_obj=4, nc=80 -> 31.5 MiB per image;
    # max_obj=360 -> 100 MiB per image, 1.56 GiB at B=16
    assert ultralytics_loss_envelope_bytes(1, 640, max_obj=4) == 8400 * 6 * 164 * 4
    assert ultralytics_loss_envelope_bytes(1, 640, max_obj=4) / 2**20 == pytest.approx(31.5, abs=0.05)
    assert ultralytics_loss_envelope_bytes(16, 640, max_obj=360) / 2**30 == pytest.approx(1.56, abs=0.01)
