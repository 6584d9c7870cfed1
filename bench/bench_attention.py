"""Attention dropout on a CUDA target: the estimate of a model with attention dropout against the same model
with attention dropout 0 plus the dropout RNG state, and what CPU's path (the estimate before
torchkit/estimate/attention.py) said.

    python bench/bench_attention.py [--quick]

Models (none of them is in a test at these sizes): ``nn.TransformerEncoder`` with the layer's defaults
(d_model 512, 8 heads, feed-forward 2048, dropout 0.1, 6 layers) at sequence 512; HF GPT-2 small
(``GPT2Config()``: 12 layers, 768 wide, attn_pdrop 0.1) at sequence 1024; HF BERT-base (``BertConfig()``,
attention_probs_dropout_prob 0.1) at sequence 512. AMP fp16, batch 4 and 8, SGD. Every other dropout stays at
its default; only the attention dropout differs between the pair. Prints ``name=value`` lines:

* ``<model>_cuda_vs_dropout0_plus_rng`` — peak (fake, exact bytes) with attention dropout over the dropout-0
  peak plus ``RNG_STATE_BYTES`` per attention call, minus 1 (target: within ±10%);
* ``<model>_cpu_path_over_cuda`` — the same model estimated with CPU's path (``target="cpu"``) over the CUDA
  target: how far off the estimate was;
* ``<model>_t4_batch_cuda`` / ``_t4_batch_cpu_path`` — the largest batch whose predicted device memory fits a
  T4 (16 GB) at fraction 0.9, from the two probes (affine fit), CUDA target vs CPU's path;
* ``<model>_t4_step_ratio_cpu_path`` — predicted T4 step time at batch 8, CPU's path over the CUDA target.

HF models are skipped (with a line saying so) where transformers is not installed. Wall time ~2-4 minutes
on a 2-core machine (``--quick``: the encoder only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BATCHES = (4, 8)
FRACTION = 0.9


def _encoder(dropout: float):
    import torch
    from torch import nn

    from torchkit.workloads import Workload

    def build():
        layer = nn.TransformerEncoderLayer(512, 8, batch_first=True)
        layer.self_attn.dropout = dropout
        return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)

    return Workload(
        name=f"encoder-{dropout}",
        sample_shape=(512, 512),
        build_model=build,
        make_batch=lambda b: (torch.randn(b, 512, 512), None),
        loss_fn=lambda out, _: out.float().pow(2).mean(),
    )


def _hf(kind: str, dropout: float):
    import torch
    import transformers

    from torchkit.workloads import Workload

    if kind == "gpt2":
        config, cls, seq = transformers.GPT2Config(attn_pdrop=dropout), transformers.GPT2LMHeadModel, 1024
    else:
        config, cls, seq = (
            transformers.BertConfig(attention_probs_dropout_prob=dropout),
            transformers.BertForMaskedLM,
            512,
        )
    config._attn_implementation = "sdpa"
    vocab = config.vocab_size
    return Workload(
        name=f"{kind}-{dropout}",
        sample_shape=(seq,),
        build_model=lambda: cls(config),
        make_batch=lambda b: (torch.randint(0, vocab, (b, seq)), None),
        loss_fn=lambda out, _: out.logits.float().mean(),
    )


def _t4_batch(estimates, gpu) -> int:
    from torchkit.estimate import cuda_device_bytes
    from torchkit.step.fit import fit_memory, max_batch_within

    points = [(e.batch, cuda_device_bytes(e, gpu)) for e in estimates]
    return max_batch_within(fit_memory(points).fit, int(FRACTION * gpu.memory_bytes), upper=65536)


def figures(name: str, make) -> None:
    from torchkit.estimate import estimate_step, step_time_s
    from torchkit.estimate.attention import RNG_STATE_BYTES
    from torchkit.hardware.catalog import load_catalog

    gpu = load_catalog().get("T4")
    with_dropout = [estimate_step(make(0.1), b, amp="fp16") for b in BATCHES]
    without = [estimate_step(make(0.0), b, amp="fp16") for b in BATCHES]
    cpu_path = [estimate_step(make(0.1), b, amp="fp16", target="cpu") for b in BATCHES]
    worst = 0.0
    for d, z in zip(with_dropout, without, strict=True):
        expected = z.peak_allocated_bytes + d.cuda_attention_calls * RNG_STATE_BYTES
        worst = max(worst, abs(d.peak_allocated_bytes / expected - 1), key=abs)
    print(f"{name}_attention_calls={with_dropout[-1].cuda_attention_calls}")
    print(f"{name}_cuda_vs_dropout0_plus_rng={worst:+.6f}")
    print(
        f"{name}_cpu_path_over_cuda={cpu_path[-1].peak_allocated_bytes / with_dropout[-1].peak_allocated_bytes:.3f}"
    )
    print(f"{name}_t4_batch_cuda={_t4_batch(with_dropout, gpu)}")
    print(f"{name}_t4_batch_dropout0={_t4_batch(without, gpu)}")
    print(f"{name}_t4_batch_cpu_path={_t4_batch(cpu_path, gpu)}")
    print(
        f"{name}_t4_step_ratio_cpu_path={step_time_s(cpu_path[-1], gpu) / step_time_s(with_dropout[-1], gpu):.3f}"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true", help="the encoder only")
    args = parser.parse_args()
    figures("transformer_encoder", _encoder)
    if args.quick:
        return 0
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(
            "hf models skipped: transformers is not installed (pip install 'transformers>=4.45')",
            file=sys.stderr,
        )
        return 0
    figures("hf_gpt2_small", lambda d: _hf("gpt2", d))
    figures("hf_bert_base", lambda d: _hf("bert", d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
