"""MultiHeadAttention: parity with torch.nn.MultiheadAttention and its own contracts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import MultiHeadAttention, masks
from attnkit.convert import from_torch, to_torch
from attnkit.modules import RotaryEmbedding
from tests.naive import naive_attention


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def torch_mha(e, h, kdim=None, bias=True, seed=0):
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(e, h, kdim=kdim, vdim=kdim, bias=bias, batch_first=True).eval()
    with torch.no_grad():  # torch zero-initialises biases: make them count
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("e", "h", "n"), [(32, 4, 7), (24, 3, 1), (40, 5, 33)])
def test_self_attention_matches_torch_with_masks(e, h, n, bias):
    theirs = torch_mha(e, h, bias=bias)
    ours = from_torch(theirs).eval()
    x = rand(3, n, e)
    kpm = rand(3, n, seed=1) > 0.7
    kpm[:, 0] = False  # no fully padded rows here: torch gives NaN there
    causal_t = nn.Transformer.generate_square_subsequent_mask(n).isinf()  # True = blocked
    want, _ = theirs(x, x, x, key_padding_mask=kpm, attn_mask=causal_t, need_weights=False)
    mask = masks.combine(
        masks.from_torch_key_padding_mask(kpm), masks.from_torch_attn_mask(causal_t)
    )
    with torch.no_grad():
        got = ours(x, mask=mask)
        got_causal = ours(x, mask=masks.from_torch_key_padding_mask(kpm), causal=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_causal, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kdim", [None, 20])
def test_cross_attention_matches_torch(kdim):
    theirs = torch_mha(32, 4, kdim=kdim, seed=3)
    ours = from_torch(theirs).eval()
    x, ctx = rand(2, 5, 32), rand(2, 9, kdim or 32, seed=4)
    attn_mask = torch.randn(5, 9)  # float: additive in torch, bias in attnkit
    want, _ = theirs(x, ctx, ctx, attn_mask=attn_mask, need_weights=False)
    with torch.no_grad():
        got = ours(x, ctx, bias=masks.from_torch_attn_mask(attn_mask))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_fully_padded_rows_are_zero_where_torch_gives_nan():
    theirs = torch_mha(16, 2)
    ours = from_torch(theirs).eval()
    x = rand(2, 4, 16)
    kpm = torch.tensor([[False, False, True, True], [True, True, True, True]])
    want, _ = theirs(x, x, x, key_padding_mask=kpm)
    assert want[1].isnan().all()  # torch's long-standing behaviour
    got = ours(x, mask=masks.from_torch_key_padding_mask(kpm))
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-5)
    # attention output 0 there, so the module returns the output projection's bias
    torch.testing.assert_close(got[1], ours.proj.bias.expand(4, 16))
    got.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("kdim", [None, 12])
def test_to_torch_round_trip_is_exact(kdim):
    ours = MultiHeadAttention(24, 3, context_dim=kdim)
    theirs = to_torch(ours)
    back = from_torch(theirs)
    for (n1, p1), (n2, p2) in zip(
        ours.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)
    x, ctx = rand(2, 6, 24), rand(2, 4, kdim or 24, seed=2)
    want, _ = theirs.eval()(x, ctx, ctx, need_weights=False)
    torch.testing.assert_close(ours.eval()(x, ctx), want, atol=1e-6, rtol=1e-5)


def test_to_torch_refuses_what_torch_cannot_express():
    with pytest.raises(ValueError, match="GQA"):
        to_torch(MultiHeadAttention(16, 4, num_kv_heads=2))
    with pytest.raises(ValueError, match="out_dim"):
        to_torch(MultiHeadAttention(16, 4, out_dim=8))
    with pytest.raises(ValueError, match="v_head_dim=3 != head_dim=4"):
        to_torch(MultiHeadAttention(16, 4, v_head_dim=3))
    with pytest.raises(ValueError, match="no output projection"):
        to_torch(MultiHeadAttention(16, 4, out_proj=False))
    with pytest.raises(ValueError, match="rotary positions"):  # it would be dropped silently
        to_torch(MultiHeadAttention(16, 4, rotary=RotaryEmbedding(4)))


def _float64_mha(m, x, ctx=None, pos=None, ctx_pos=None, mask=None):
    """The module's math written out in float64 from its weights."""
    w = {k: t.double() for k, t in m.state_dict().items()}
    h, hkv, dh = m.num_heads, m.num_kv_heads, m.head_dim
    x = x.double()
    ctx = x if ctx is None else ctx.double()
    if ctx is x and pos is not None:
        ctx_pos = pos
    xq = x if pos is None else x + pos.double()
    xk = ctx if ctx_pos is None else ctx + ctx_pos.double()
    if "in_proj.qkv.weight" in w:
        wq, wk, wv = w["in_proj.qkv.weight"].split([h * dh, hkv * dh, hkv * dh])
        bq, bk, bv = w["in_proj.qkv.bias"].split([h * dh, hkv * dh, hkv * dh])
    else:
        wq, bq = w["in_proj.q.weight"], w["in_proj.q.bias"]
        wk, wv = w["in_proj.kv.weight"].chunk(2)
        bk, bv = w["in_proj.kv.bias"].chunk(2)
    q = (xq @ wq.T + bq).unflatten(-1, (h, dh)).transpose(1, 2)
    k = (xk @ wk.T + bk).unflatten(-1, (hkv, dh)).transpose(1, 2)
    v = (ctx @ wv.T + bv).unflatten(-1, (hkv, dh)).transpose(1, 2)
    o, _ = naive_attention(q, k, v, mask=mask)
    return o.transpose(1, 2).flatten(2) @ w["proj.weight"].T + w["proj.bias"]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dim=24, num_heads=6, num_kv_heads=2),  # GQA
        dict(dim=24, num_heads=4, num_kv_heads=1),  # MQA
        dict(dim=49, num_heads=4, head_dim=16, out_dim=64),  # T2T widths
        dict(dim=20, num_heads=2, context_dim=11),  # cross, other width
        dict(dim=30, num_heads=5, head_dim=7),
    ],
)
def test_variants_match_float64_math(kwargs):
    m = MultiHeadAttention(**kwargs).eval()
    x = rand(2, 9, kwargs["dim"])
    ctx = rand(2, 5, kwargs["context_dim"], seed=1) if "context_dim" in kwargs else None
    mask = rand(2, 1, 9, 5 if ctx is not None else 9, seed=2) > -0.5
    got = m(x, ctx, mask=mask)
    torch.testing.assert_close(got.double(), _float64_mha(m, x, ctx, mask=mask), atol=1e-5, rtol=0)


def test_detr_positions_go_to_queries_and_keys_only():
    m = MultiHeadAttention(16, 2).eval()
    x, pos = rand(2, 6, 16), rand(2, 6, 16, seed=1)
    ctx, ctx_pos = rand(2, 4, 16, seed=2), rand(1, 4, 16, seed=3)
    self_got = m(x, pos=pos)
    torch.testing.assert_close(self_got.double(), _float64_mha(m, x, pos=pos), atol=1e-5, rtol=0)
    cross = m(x, ctx, pos=pos, context_pos=ctx_pos)
    want = _float64_mha(m, x, ctx, pos=pos, ctx_pos=ctx_pos)
    torch.testing.assert_close(cross.double(), want, atol=1e-5, rtol=0)
    # positions change who attends, not what is carried: with uniform attention
    # (zero q/k weights) the output ignores pos entirely
    with torch.no_grad():
        m.in_proj.qkv.weight[:32].zero_()
    torch.testing.assert_close(m(x, pos=pos), m(x), atol=1e-6, rtol=0)


def test_lazy_dim_is_inferred_on_first_call():
    m = MultiHeadAttention(None, 4, out_dim=32)
    assert m(rand(2, 3, 17)).shape == (2, 3, 32)
    assert m.in_proj.qkv.weight.shape == (96, 17)


def test_fused_and_reference_paths_agree_on_the_module():
    m = MultiHeadAttention(32, 4).eval()
    x = rand(2, 11, 32)
    fused = m(x, causal=True)
    m.attend.backend = "reference"
    torch.testing.assert_close(m(x, causal=True), fused, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dim=30, num_heads=4), "dim=30 is not divisible by num_heads=4"),
        (dict(dim=32, num_heads=4, num_kv_heads=3), "num_kv_heads must be a positive divisor"),
        (dict(dim=None, num_heads=4), "needs head_dim or out_dim"),
        (dict(dim=8, num_heads=0), "num_heads must be a positive"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_bad_forward_input():
    m = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=r"query must have shape \(B, N, 16\), got \(2, 3, 8\)"):
        m(rand(2, 3, 8))
    with pytest.raises(ValueError, match=r"query must have shape \(B, N, C\)"):
        m(rand(3, 16))
    with pytest.raises(ValueError, match=r"key must have shape \(B=2, S, 16\)"):
        m(rand(2, 3, 16), rand(2, 4, 5))
    with pytest.raises(ValueError, match=r"key must have shape \(B=2, S, 16\)"):
        m(rand(2, 3, 16), context=rand(2, 4, 5))
    with pytest.raises(ValueError, match=r"pass key \(or context\)"):
        MultiHeadAttention(16, 2, context_dim=8)(rand(2, 3, 16))
    with pytest.raises(ValueError, match="does not broadcast"):
        m(rand(2, 3, 16), mask=torch.ones(5, 5, dtype=torch.bool))


def test_detr_positions_equal_torch_with_distinct_query_key_value():
    """DETR calls torch's module as mha(src + pos, src + pos, src): ours takes pos directly."""
    theirs = torch_mha(32, 4, seed=5)
    ours = from_torch(theirs).eval()
    src, pos = rand(2, 9, 32, seed=6), rand(2, 9, 32, seed=7)
    memory, memory_pos = rand(2, 5, 32, seed=8), rand(2, 5, 32, seed=9)
    want, _ = theirs(src + pos, src + pos, src, need_weights=False)
    torch.testing.assert_close(ours(src, pos=pos), want, atol=1e-6, rtol=1e-5)
    want, _ = theirs(src + pos, memory + memory_pos, memory, need_weights=False)
    got = ours(src, memory, pos=pos, context_pos=memory_pos)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
