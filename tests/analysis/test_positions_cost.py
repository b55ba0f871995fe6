"""Position costs: the formulas equal the floating-point ops that attnkit's code runs, and
the memory they name is what attnkit allocates (`PeakTensors`): a score function never an
(N, S) bias."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import attnkit
from attnkit import AlibiBias, RelativePositionBias, score_mods
from attnkit.analysis import (
    Cost,
    alibi_cost,
    mha_cost,
    relative_bias_cost,
    rotary_cost,
    softcap_cost,
)
from attnkit.analysis.peak_tensors import PeakTensors
from attnkit.functional.relative import alibi_bias, relative_position_bucket
from attnkit.modules import RotaryEmbedding

aten = torch.ops.aten
_ARITHMETIC = {
    aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.neg.default,
    aten.abs.default, aten.log.default, aten.rsub.Scalar, aten.mul.Scalar, aten.add.Scalar,
    aten.sub.Scalar, aten.div.Scalar, aten.tanh.default,
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
    tables = rope.cos.numel() + rope.sin.numel()
    assert cost.memory == {"rotary tables": tables} == {"rotary tables": 64 * r}
    assert rotary_cost(n, heads, d, kv_heads=kv_heads, rotary_dim=r, batch=b, layers=5) == Cost(
        terms={}, elementwise={"rotary": 5 * ops.flops}, memory={"rotary tables": tables}
    )


def test_rotary_cost_memory_follows_the_cached_tables():
    for n in (1, 64, 65, 200):
        rope = RotaryEmbedding(8)
        rope(torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8))
        assert rotary_cost(n, 2, 8).memory_elements == rope.cos.numel() + rope.sin.numel()


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_dense_cost_counts_the_ops_of_alibi_bias(symmetric):
    h, n, s = 4, 9, 13  # the slopes (H of them) are below min_numel = N·S and not counted
    with FloatOps(min_numel=n * s) as ops:
        bias = alibi_bias(h, n, s, symmetric=symmetric)
    cost = alibi_cost(n, h, context_len=s, batch=2, layers=3, symmetric=symmetric, dense=True)
    assert cost.elementwise["alibi table"] == ops.flops
    assert cost.elementwise["position bias"] == 3 * 2 * h * n * s  # one add per score per layer
    assert cost.memory == {"alibi bias": bias.numel()}  # shared by the 3 layers and the batch


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_score_function_cost_is_per_score_work_and_the_slopes(symmetric):
    h, n, s = 4, 9, 13
    cost = alibi_cost(n, h, context_len=s, batch=2, layers=3, symmetric=symmetric)
    per_score = 3 if symmetric else 2  # slope multiply, add (and |j - i| in the kernel)
    assert cost.elementwise == {"position bias": per_score * 3 * 2 * h * n * s}
    assert cost.memory == {"alibi slopes": h} and cost.params == 0 and cost.macs == 0
    # the PyTorch kernel's ops on one (1, H, N, S) block: a multiply and an add per score
    fn = AlibiBias(h).score_mod(n, s)
    score = torch.randn(1, h, n, s)
    with FloatOps() as ops:
        fn(score, *score_mods.indices(1, h, 0, n, 0, s, score.device))
    assert ops.flops == alibi_cost(n, h, context_len=s).elementwise_flops


def test_t5_dense_cost_counts_the_float_ops_of_the_buckets():
    n, s = 6, 10
    rel = torch.arange(s)[None] - torch.arange(n)[:, None]
    with FloatOps() as ops:
        relative_position_bucket(rel)
    cost = relative_bias_cost(n, 8, context_len=s, num_buckets=32, batch=2, layers=4, dense=True)
    assert cost.elementwise == {"t5 buckets": ops.flops, "position bias": 4 * 2 * 8 * n * s}
    assert cost.params == 32 * 8 and cost.macs == 0
    assert cost.memory == {"t5 bias": 8 * n * s, "t5 index": n * s}


@pytest.mark.parametrize("backend", ["auto", "chunked"])
def test_t5_score_function_buckets_only_the_distances_of_the_call(backend):
    b, h, n, s, d = 2, 4, 7, 97, 8
    q, k, v = torch.randn(b, h, n, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    fn = RelativePositionBias(h).score_mod(n, s)  # outside the count: it checks its sizes
    with FloatOps() as ops:  # the compiled kernel's own work is not dispatched
        attnkit.attention(q, k, v, score_mod=fn, backend=backend)
    cost = relative_bias_cost(n, h, context_len=s, batch=b, layers=3)
    assert cost.elementwise == {"t5 buckets": 3 * ops.flops, "position bias": 3 * b * h * n * s}
    assert ops.flops == 4 * (n + s - 1)
    assert cost.memory == {"t5 values": h * (n + s - 1), "t5 index": n + s - 1}


def test_softcap_cost_counts_the_ops_of_the_score_function():
    h, n, s = 3, 7, 11
    score = torch.randn(2, h, n, s)
    with FloatOps() as ops:
        score_mods.softcap(30.0)(score, *score_mods.indices(2, h, 0, n, 0, s, score.device))
    cost = softcap_cost(n, h, context_len=s, batch=2, layers=5)
    assert cost.elementwise == {"softcap": 5 * ops.flops} and ops.flops == 3 * 2 * h * n * s
    assert cost.memory == {} and cost.params == 0


# Bytes per element of what `Cost.memory` names, as attnkit allocates them (float32 values
# and slopes, int64 indices), and the 0-d scalars a call allocates besides (a few bytes).
_ITEMSIZE = {"alibi slopes": 4, "t5 values": 4, "t5 index": 8, "alibi bias": 4, "t5 bias": 4}
_SCALARS = 16


def _peak(fn) -> int:
    fn()  # warm: caches and compiled kernels outside the count
    with PeakTensors() as p:
        fn()
    return p.peak


def _bytes(cost: Cost) -> int:
    return sum(_ITEMSIZE[name] * count for name, count in cost.memory.items())


@pytest.mark.parametrize("backend", ["auto", "chunked"])
def test_score_functions_allocate_what_the_cost_says_and_no_bias(backend):
    b, h, n, d = 2, 4, 300, 8  # an (N, S) float32 bias: 360,000 bytes per head
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    alibi, t5 = AlibiBias(h), RelativePositionBias(h)
    plain = _peak(lambda: attnkit.attention(q, k, v, causal=True, backend=backend))
    for fn, cost in (
        (alibi.score_mod(n), alibi_cost(n, h, batch=b)),
        (t5.score_mod(n), relative_bias_cost(n, h, batch=b)),
    ):
        extra = _peak(lambda fn=fn: attnkit.attention(q, k, v, causal=True, score_mod=fn,
                                                      backend=backend)) - plain  # fmt: skip
        assert extra <= _bytes(cost) + _SCALARS < n * n * 4, (fn, extra)
    for bias_of, cost, name in (
        (alibi, alibi_cost(n, h, batch=b, dense=True), "alibi bias"),
        (t5, relative_bias_cost(n, h, batch=b, dense=True), "t5 bias"),
    ):
        extra = _peak(lambda m=bias_of: attnkit.attention(q, k, v, causal=True, bias=m(n),
                                                          backend=backend)) - plain  # fmt: skip
        assert extra >= cost.memory[name] * 4 == h * n * n * 4  # the (1, H, N, S) bias


def test_position_costs_add_to_a_layer_and_refuse_bad_sizes():
    layer = mha_cost(16, 64, 4) + rotary_cost(16, 4, 16) + alibi_cost(16, 4)
    assert layer.macs == mha_cost(16, 64, 4).macs
    assert layer.elementwise["rotary"] == 3 * 16 * 8 * 16
    assert layer.memory == {"rotary tables": 64 * 16, "alibi slopes": 4}
    assert layer.to_dict()["memory_elements"] == 64 * 16 + 4
    with pytest.raises(ValueError, match="rotary_dim=5"):
        rotary_cost(4, 2, 8, rotary_dim=5)
    with pytest.raises(ValueError, match="heads must be a positive integer"):
        alibi_cost(4, 0)
    with pytest.raises(ValueError, match="num_buckets"):
        relative_bias_cost(4, 2, num_buckets=0)
    with pytest.raises(ValueError, match="context_len must be a positive integer"):
        softcap_cost(4, 2, context_len=0)
