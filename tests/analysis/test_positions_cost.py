"""Position costs: the formulas equal the floating-point ops that attnkit's code runs."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit.analysis import Cost, alibi_cost, mha_cost, relative_bias_cost, rotary_cost
from attnkit.functional.relative import alibi_bias, relative_position_bucket
from attnkit.modules import RotaryEmbedding

aten = torch.ops.aten
_ARITHMETIC = {
    aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.neg.default,
    aten.abs.default, aten.log.default, aten.rsub.Scalar, aten.mul.Scalar, aten.add.Scalar,
    aten.sub.Scalar, aten.div.Scalar,
}  # fmt: skip


class FloatOps(TorchDispatchMode):
    """Counts one FLOP per output element of each floating-point arithmetic op."""

    def __init__(self, min_numel: int = 0):
        super().__init__()
        self.flops, self.min_numel = 0, min_numel

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ARITHMETIC and out.dtype.is_floating_point and out.numel() >= self.min_numel:
            self.flops += out.numel()
        return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads", "d", "r"), [(4, 4, 16, 16), (6, 2, 12, 4)])
def test_rotary_cost_counts_the_ops_of_the_module(interleaved, heads, kv_heads, d, r):
    b, n = 3, 7
    rope = RotaryEmbedding(r, interleaved=interleaved)
    q, k = torch.randn(b, heads, n, d), torch.randn(b, kv_heads, n, d)
    rope(q, k)  # build the tables outside the count (they are cached)
    with FloatOps() as ops:
        rope(q, k)
    cost = rotary_cost(n, heads, d, kv_heads=kv_heads, rotary_dim=r, batch=b)
    assert cost.elementwise == {"rotary": ops.flops} and cost.macs == 0 and cost.params == 0
    assert ops.flops == 3 * b * n * (heads + kv_heads) * r
    assert rotary_cost(n, heads, d, kv_heads=kv_heads, rotary_dim=r, batch=b, layers=5) == Cost(
        terms={}, elementwise={"rotary": 5 * ops.flops}
    )


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_table_cost_counts_the_ops_of_alibi_bias(symmetric):
    h, n, s = 4, 9, 13  # the slopes (H of them) are below min_numel = N·S and not counted
    with FloatOps(min_numel=n * s) as ops:
        alibi_bias(h, n, s, symmetric=symmetric)
    cost = alibi_cost(n, h, context_len=s, batch=2, layers=3, symmetric=symmetric)
    assert cost.elementwise["alibi table"] == ops.flops
    assert cost.elementwise["position bias"] == 3 * 2 * h * n * s  # one add per score per layer


def test_t5_bucket_cost_counts_the_float_ops_of_the_buckets():
    n, s = 6, 10
    rel = torch.arange(s)[None] - torch.arange(n)[:, None]
    with FloatOps() as ops:
        relative_position_bucket(rel)
    cost = relative_bias_cost(n, 8, context_len=s, num_buckets=32, batch=2, layers=4)
    assert cost.elementwise == {"t5 buckets": ops.flops, "position bias": 4 * 2 * 8 * n * s}
    assert cost.params == 32 * 8 and cost.macs == 0


def test_position_costs_add_to_a_layer_and_refuse_bad_sizes():
    layer = mha_cost(16, 64, 4) + rotary_cost(16, 4, 16)
    assert layer.macs == mha_cost(16, 64, 4).macs
    assert layer.elementwise["rotary"] == 3 * 16 * 8 * 16
    with pytest.raises(ValueError, match="rotary_dim=5"):
        rotary_cost(4, 2, 8, rotary_dim=5)
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        alibi_cost(4, 0)
    with pytest.raises(ValueError, match="num_buckets"):
        relative_bias_cost(4, 2, num_buckets=0)
