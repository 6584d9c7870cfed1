"""Attention priced as the target runs it (torchkit/estimate/attention.py): on a CUDA target SDPA is CUDA's
flash / memory-efficient kernel whatever path CPU would take; on a CPU target it is CPU's own path, held
against the peak of the same step really run on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from torchkit.errors import ConfigError
from torchkit.estimate import cpu_peak_bytes, cuda_device_bytes, estimate_step, step_time_s
from torchkit.estimate.attention import RNG_STATE_BYTES, cuda_attention, cuda_sdpa_backend
from torchkit.estimate.cpu_truth import measure_cpu_peak
from torchkit.hardware.catalog import load_catalog
from torchkit.workloads import Workload

SEQ, WIDTH, HEADS, LAYERS = 128, 64, 4, 2
CUDA_BLOCK = 512


def _encoder(attention_dropout: float, *, seq: int = SEQ) -> Workload:
    """``nn.TransformerEncoder`` with the layer's defaults (dropout 0.1 everywhere), attention dropout set."""

    def build() -> nn.Module:
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, batch_first=True)
        layer.self_attn.dropout = attention_dropout
        return nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

    return Workload(
        name=f"encoder-attn-dropout-{attention_dropout}",
        sample_shape=(seq, WIDTH),
        build_model=build,
        make_batch=lambda b: (torch.randn(b, seq, WIDTH), None),
        loss_fn=lambda out, _: out.float().pow(2).mean(),
    )


def _backend(**overrides) -> str:
    args = {
        "dtype_bits": 16,
        "head_dim_qk": 64,
        "head_dim_v": 64,
        "ndim": 4,
        "has_mask": False,
        "mask_needs_grad": False,
        "gqa": False,
    }
    return cuda_sdpa_backend(**{**args, **overrides})


def test_the_backend_follows_cudas_dispatch_rules() -> None:
    assert _backend() == "flash"
    assert _backend(has_mask=True) == "efficient"  # flash takes no attn_mask
    assert _backend(dtype_bits=32) == "efficient"  # flash is 16-bit only
    assert _backend(head_dim_qk=288, head_dim_v=288) == "efficient"  # over flash's 256, still 8-aligned
    assert _backend(head_dim_qk=260, head_dim_v=260) == "math"  # neither kernel's alignment
    assert _backend(dtype_bits=32, head_dim_qk=6, head_dim_v=6) == "math"
    assert _backend(gqa=True) == "math"
    assert _backend(ndim=3) == "math"
    assert _backend(has_mask=True, mask_needs_grad=True) == "math"


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_attention_dropout_costs_only_the_rng_state_on_a_cuda_target(amp: str) -> None:
    with_dropout = estimate_step(_encoder(0.1), 8, amp=amp)
    without = estimate_step(_encoder(0.0), 8, amp=amp)
    assert with_dropout.cuda_attention_calls == without.cuda_attention_calls == LAYERS
    assert with_dropout.peak_allocated_bytes - without.peak_allocated_bytes == LAYERS * RNG_STATE_BYTES
    assert 0 <= with_dropout.cuda_rounded_peak_bytes - without.cuda_rounded_peak_bytes <= LAYERS * CUDA_BLOCK
    gpu = load_catalog().get("T4")
    assert cuda_device_bytes(with_dropout, gpu) - cuda_device_bytes(without, gpu) <= 2 * LAYERS * CUDA_BLOCK
    assert with_dropout.flops == without.flops and with_dropout.bytes_moved == without.bytes_moved
    assert step_time_s(with_dropout, gpu) == pytest.approx(step_time_s(without, gpu))


def test_a_cpu_target_keeps_cpus_math_path_with_its_probabilities_and_masks() -> None:
    cpu = estimate_step(_encoder(0.1), 8, target="cpu")
    cuda = estimate_step(_encoder(0.1), 8)
    assert cpu.cuda_attention_calls == 0
    # per layer CPU's math path keeps the s×s softmax, its dropped copy (fp32) and the bool mask alive
    probabilities = 8 * HEADS * SEQ * SEQ
    assert cpu.peak_allocated_bytes - cuda.peak_allocated_bytes >= LAYERS * probabilities * (4 + 4 + 1) * 0.9
    assert cpu.bytes_moved > cuda.bytes_moved


@pytest.mark.slow
def test_the_cpu_target_estimate_is_what_a_real_cpu_step_peaks_at() -> None:
    workload = _encoder(0.1)
    truth = measure_cpu_peak(workload, 4)
    assert cpu_peak_bytes(estimate_step(workload, 4, target="cpu")) == pytest.approx(
        truth.peak_bytes, rel=0.01
    )


def test_a_cpu_peak_of_a_cuda_target_estimate_is_refused() -> None:
    with pytest.raises(ValueError, match="target='cpu'"):
        cpu_peak_bytes(estimate_step(_encoder(0.1), 2))


def test_an_unknown_target_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="target"):
        estimate_step(_encoder(0.1), 2, target="tpu")  # type: ignore[arg-type]


def test_the_replacement_is_undone_after_the_pass_even_on_failure() -> None:
    original = F.scaled_dot_product_attention
    with pytest.raises(RuntimeError, match="boom"), cuda_attention() as ledger:
        assert F.scaled_dot_product_attention is not original
        raise RuntimeError("boom")
    assert F.scaled_dot_product_attention is original and ledger.total == 0


def test_the_fused_kernel_gives_the_same_values_and_gradients_as_sdpa() -> None:
    # the stand-in runs CPU's flash kernel with dropout 0: real tensors give SDPA's own result
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, 16, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(16, 16) > 0.2
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    with cuda_attention() as ledger:
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    grads = torch.autograd.grad(got.sum(), (q, k, v))
    assert ledger.calls == {"efficient": 1}
    torch.testing.assert_close(got, expected)
    for g, e in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, e)


def test_causal_attention_is_charged_half_the_flops() -> None:
    def gpt_like(causal: bool) -> Workload:
        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = nn.Linear(WIDTH, 3 * WIDTH)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, HEADS, -1).permute(2, 0, 3, 1, 4)
                return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=causal)

        return Workload(
            name=f"causal-{causal}",
            sample_shape=(SEQ, WIDTH),
            build_model=Block,
            make_batch=lambda b: (torch.randn(b, SEQ, WIDTH), None),
            loss_fn=lambda out, _: out.float().mean(),
        )

    def attention_flops(estimate) -> int:
        return sum(k.flops for k in estimate.kernels if k.kind == "attention")

    full, causal = estimate_step(gpt_like(False), 4), estimate_step(gpt_like(True), 4)
    forward = 4 * 4 * HEADS * SEQ * SEQ * (WIDTH // HEADS)
    assert attention_flops(full) == forward + forward * 5 // 2
    assert attention_flops(causal) == attention_flops(full) // 2


def _hf_workload(kind: str, attention_dropout: float) -> Workload:
    """A tiny HF GPT-2 or BERT (the libraries' configs shrunk; every other dropout at its default 0.1) with
    SDPA attention, attention dropout as given."""
    transformers = pytest.importorskip("transformers")
    from torchkit.errors import WorkloadError
    from torchkit.workloads.extras import import_library

    try:  # transformers imports torchvision where it is installed: a torchvision built for another torch fails
        import_library("transformers.modeling_utils", model=f"hf:{kind}")
    except WorkloadError as e:
        pytest.skip(str(e))
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_layer=LAYERS,
            n_embd=WIDTH,
            n_head=HEADS,
            n_positions=SEQ,
            vocab_size=512,
            attn_pdrop=attention_dropout,
        )
        model_class = transformers.GPT2LMHeadModel
    else:
        config = transformers.BertConfig(
            num_hidden_layers=LAYERS,
            hidden_size=WIDTH,
            num_attention_heads=HEADS,
            intermediate_size=4 * WIDTH,
            max_position_embeddings=SEQ,
            vocab_size=512,
            attention_probs_dropout_prob=attention_dropout,
        )
        model_class = transformers.BertForMaskedLM
    config._attn_implementation = "sdpa"
    return Workload(
        name=f"hf-{kind}-attn-dropout-{attention_dropout}",
        sample_shape=(SEQ,),
        build_model=lambda: model_class(config),
        make_batch=lambda b: (torch.randint(0, 512, (b, SEQ)), None),
        loss_fn=lambda out, _: out.logits.float().pow(2).mean(),
    )


@pytest.mark.transformers
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_hf_attention_dropout_costs_only_the_rng_state_on_a_cuda_target(kind: str) -> None:
    with_dropout = estimate_step(_hf_workload(kind, 0.1), 4, amp="fp16")
    without = estimate_step(_hf_workload(kind, 0.0), 4, amp="fp16")
    assert with_dropout.cuda_attention_calls == LAYERS
    assert with_dropout.peak_allocated_bytes - without.peak_allocated_bytes == LAYERS * RNG_STATE_BYTES
    assert with_dropout.flops == without.flops and with_dropout.bytes_moved == without.bytes_moved
    # as CPU runs it, the same dropout costs the s×s tensors
    cpu = estimate_step(_hf_workload(kind, 0.1), 4, amp="fp16", target="cpu")
    assert cpu.peak_allocated_bytes > with_dropout.peak_allocated_bytes + LAYERS * 4 * HEADS * SEQ * SEQ
