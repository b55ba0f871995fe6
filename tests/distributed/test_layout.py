"""Layouts, argument errors and the one-process ring (no process group): no spawning needed."""

import pytest
import torch

from attnkit.distributed import (
    RingMultiHeadAttention,
    positions,
    ring_attention,
    shard,
    ulysses_attention,
    unshard,
)
from attnkit.functional.chunked import chunked_attention
from attnkit.modules.attention import MultiHeadAttention
from attnkit.modules.positions import RotaryEmbedding


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_unshard_round_trip_and_positions(layout, world):
    x = torch.randn(2, 3, 24, 5)
    parts = [shard(x, r, world, layout=layout) for r in range(world)]
    assert torch.equal(unshard(parts, layout=layout), x)
    for r, p in enumerate(parts):
        assert torch.equal(p, x[:, :, positions(24, r, world, layout)])
        assert bool((positions(24, r, world, layout).diff() > 0).all())  # increasing in a shard


def test_zigzag_convention_rank_r_holds_chunks_r_and_2p_minus_1_minus_r():
    assert positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize(("length", "world", "layout"), [(10, 4, "contiguous"), (12, 4, "zigzag")])
def test_lengths_that_do_not_divide_are_a_value_error(length, world, layout):
    with pytest.raises(ValueError, match=f"length={length} must be divisible"):
        shard(torch.zeros(1, 1, length, 2), 0, world, layout=layout)


def test_bad_arguments_name_themselves():
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_attention(q, q, q, layout="spiral")
    with pytest.raises(ValueError, match="mask must be a boolean key-padding mask"):
        ring_attention(q, q, q, mask=torch.ones(1, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="k must have shape"):
        ring_attention(q, q[:, :, :5], q)
    with pytest.raises(ValueError, match="even local length"):
        ring_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5], layout="zigzag")
    with pytest.raises(ValueError, match="strategy must be one of"):
        RingMultiHeadAttention(8, 2, strategy="tree")
    with pytest.raises(ValueError, match="context must be None"):
        RingMultiHeadAttention(8, 2)(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))


@pytest.mark.parametrize("fn", [ring_attention, ulysses_attention])
def test_without_a_process_group_it_is_single_process_attention(fn):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # GQA
    mask = torch.rand(2, 1, 1, 10, generator=g) > 0.3
    mask[1] = False  # batch 1: every row fully masked
    ref, ref_lse = chunked_attention(
        q, k, v, mask=mask, bias=None, causal=True, scale=8**-0.5, dropout_p=0.0,
        training=False, kernel="torch",
    )  # fmt: skip
    res = fn(q, k, v, mask=mask, causal=True)
    torch.testing.assert_close(res.out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.lse, ref_lse, rtol=0, atol=1e-12)
    assert not res.out.isnan().any() and bool((res.out[1] == 0).all())


@pytest.mark.parametrize("fn", [ring_attention, ulysses_attention])
def test_bias_and_dropout_errors_name_the_argument(fn):
    q = torch.randn(1, 2, 6, 4)
    name = fn.__name__
    with pytest.raises(ValueError, match=f"{name}: dropout_p must be 0, got 0.1"):
        fn(q, q, q, dropout_p=0.1)
    with pytest.raises(
        ValueError, match=r"bias must be a float tensor of shape \(B\|1, H\|1, N/P=6"
    ):
        fn(q, q, q, bias=torch.zeros(1, 2, 6, 5))
    with pytest.raises(ValueError, match="pass bias or bias_fn, not both"):
        fn(q, q, q, bias=torch.zeros(1, 2, 6, 6), bias_fn=lambda i, j: torch.zeros(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"bias_fn\(q_pos \(nq,\), k_pos \(nk,\)\) must return"):
        fn(q, q, q, bias_fn=lambda i, j: torch.zeros(i.numel(), j.numel()))
    slope = torch.ones((), requires_grad=True)  # a learned slope cannot go through bias_fn
    with torch.no_grad(), pytest.raises(ValueError, match="bias_fn's result requires grad"):
        fn(q, q, q, bias_fn=lambda i, j: slope * (j - i[:, None]).float()[None, None])


@pytest.mark.parametrize("fn", [ring_attention, ulysses_attention])
def test_bias_without_a_process_group_is_single_process_attention_with_that_bias(fn):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 10, 8, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 4, 10, 10, generator=g, dtype=torch.float64)
    bias[0, 2, 4] = float("-inf")  # a row masked by its bias alone
    ins = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    ref = chunked_attention(
        *ins[:3], mask=None, bias=ins[3], causal=True, scale=8**-0.5, dropout_p=0.0,
        training=False, kernel="torch",
    )[0]  # fmt: skip
    want = torch.autograd.grad(ref.square().sum(), ins)
    got_t = fn(*ins[:3], bias=ins[3], causal=True).out
    got = torch.autograd.grad(got_t.square().sum(), ins)
    torch.testing.assert_close(got_t, ref, rtol=0, atol=1e-12)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert bool((got_t[0, 2, 4] == 0).all()) and bool((got[3][0, 2, 4] == 0).all())


def test_ring_module_refuses_dropout_in_training_and_is_exact_in_eval():
    torch.manual_seed(0)
    mod = RingMultiHeadAttention(8, 2, dropout=0.1)
    x = torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"dropout must be 0 in training, got 0\.1"):
        mod(x, causal=True)
    full = MultiHeadAttention(8, 2, dropout=0.1)
    full.load_state_dict(mod.state_dict())
    mod.eval(), full.eval()
    torch.testing.assert_close(mod(x, causal=True), full(x, causal=True))


def test_ring_module_takes_only_attnkit_rotary():
    with pytest.raises(ValueError, match=r"rotary must be an attnkit\.modules\.RotaryEmbedding"):
        RingMultiHeadAttention(8, 2, rotary=torch.nn.Identity())
    mod = RingMultiHeadAttention(8, 2, rotary=RotaryEmbedding(4), layout="zigzag").double()
    full = MultiHeadAttention(8, 2, rotary=RotaryEmbedding(4)).double()
    full.load_state_dict(mod.state_dict())
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(mod(x, causal=True), full(x, causal=True), rtol=0, atol=1e-12)
