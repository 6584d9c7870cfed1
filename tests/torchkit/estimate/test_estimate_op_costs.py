"""FLOPs and bytes per operator (torchkit/estimate/op_costs.py)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import sdpa_flop_count

from torchkit.estimate.op_costs import KernelCost, aggregate, kernel_cost

aten = torch.ops.aten


def test_matmul_is_priced_by_torchs_formula_and_its_bytes() -> None:
    with FakeTensorMode():
        a, b = torch.empty(8, 16), torch.empty(16, 32)
        out = aten.mm.default(a, b)
        cost = kernel_cost(aten.mm.default, (a, b), {}, out)
    assert cost is not None
    assert (cost.flops, cost.bytes_moved, cost.kind, cost.compute) == (
        2 * 8 * 16 * 32,
        4 * (8 * 16 + 16 * 32 + 8 * 32),
        "matmul",
        "fp32",
    )


def test_views_and_bare_allocations_are_not_kernels() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 4)
        assert kernel_cost(aten.view.default, (x, [16]), {}, aten.view.default(x, [16])) is None
        assert kernel_cost(aten.t.default, (x,), {}, aten.t.default(x)) is None
        assert kernel_cost(aten.empty.memory_format, ([4],), {}, torch.empty(4)) is None


def test_broadcast_inputs_are_read_once() -> None:
    with FakeTensorMode():
        x = torch.empty(1024, 1024, dtype=torch.float16)
        bias = torch.empty(1024, dtype=torch.float16).expand(1024, 1024)
        out = aten.add.Tensor(x, bias)
        cost = kernel_cost(aten.add.Tensor, (x, bias), {}, out)
    assert cost.bytes_moved == 2 * (1024 * 1024 + 1024 + 1024 * 1024)
    assert cost.flops == 0 and cost.kind == "other" and cost.compute == "fp16"


def test_causal_cpu_flash_attention_counts_half_the_full_flops() -> None:
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    with FakeTensorMode():
        q = torch.empty(2, 4, 64, 16)
        full = kernel_cost(op, (q, q, q, 0.0, False), {}, op(q, q, q, 0.0, False))
        causal = kernel_cost(op, (q, q, q, 0.0, True), {}, op(q, q, q, 0.0, True))
    assert full.flops == sdpa_flop_count(q.shape, q.shape, q.shape)
    assert causal.flops == full.flops // 2
    assert full.kind == "attention"


def test_aggregate_sums_per_operator_largest_flops_first() -> None:
    kernels = [
        KernelCost(name="relu.default", flops=0, bytes_moved=10, compute="fp32", kind="other"),
        KernelCost(name="mm.default", flops=100, bytes_moved=5, compute="fp32", kind="matmul"),
        KernelCost(name="mm.default", flops=50, bytes_moved=5, compute="fp32", kind="matmul"),
    ]
    rows = aggregate(kernels)
    assert [(r.name, r.count, r.flops, r.bytes_moved) for r in rows] == [
        ("mm.default", 2, 150, 10),
        ("relu.default", 1, 0, 10),
    ]


def _conv_costs(groups: int, *, transposed: bool = False) -> tuple[KernelCost, KernelCost]:
    """(forward, backward) cost of a 3x3 convolution of 64 channels in ``groups`` groups, on fake tensors."""
    with FakeTensorMode():
        x = torch.empty(4, 64, 14, 14)
        w = torch.empty(64, 64 // groups, 3, 3)
        conv_args = (x, w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups)
        y = aten.convolution.default(*conv_args)
        fwd = kernel_cost(aten.convolution.default, conv_args, {}, y)
        bwd_args = (y, x, w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], groups, [True, True, False])
        bwd = kernel_cost(
            aten.convolution_backward.default, bwd_args, {}, aten.convolution_backward.default(*bwd_args)
        )
    return fwd, bwd


def test_a_convolutions_backward_costs_twice_its_forward_whatever_its_groups() -> None:
    # input and weight gradients each cost the forward's 2·N·H·W·C_out·(C_in/groups)·9
    for groups in (1, 4, 32, 64):
        fwd, bwd = _conv_costs(groups)
        assert fwd.flops == 2 * 4 * 14 * 14 * 64 * (64 // groups) * 9
        assert bwd.flops == 2 * fwd.flops, groups
        assert bwd.groups == groups and bwd.kind == "conv"
        fwd_t, bwd_t = _conv_costs(groups, transposed=True)
        assert bwd_t.flops == 2 * fwd_t.flops == 2 * fwd.flops, groups


def test_the_dense_convolution_backward_agrees_with_torchs_formula() -> None:
    from torch.utils.flop_counter import flop_registry

    _, ours = _conv_costs(1)
    with FakeTensorMode():
        x, w = torch.empty(4, 64, 14, 14), torch.empty(64, 64, 3, 3)
        y = torch.empty(4, 64, 14, 14)
        args = (y, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
        out = aten.convolution_backward.default(*args)
        theirs = flop_registry[aten.convolution_backward](*args, out_val=out)
    assert ours.flops == theirs
