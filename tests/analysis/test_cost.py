"""Cost formulas against torch's FLOP counter, torch modules' parameter counts and closed forms."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnkit.analysis import Cost, allowed_pairs, mha_cost, single_head_cost, swin_window_cost

from .counting import MirrorMHA, allowed_mask, count_flops, n_params

pytestmark = pytest.mark.threads(1)


@st.composite
def configs(draw):
    """Odd sizes, heads that are not powers of two, GQA/MQA, cross-attention, out_dim."""
    heads = draw(st.sampled_from([1, 2, 3, 5, 6]))
    kv_heads = draw(st.sampled_from([g for g in (1, 2, 3, 5, 6) if heads % g == 0]))
    head_dim = draw(st.sampled_from([1, 3, 4, 7]))
    cross = draw(st.booleans())
    return {
        "n": draw(st.integers(1, 13)),
        "dim": heads * head_dim * draw(st.sampled_from([1, 2])),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "context_len": draw(st.integers(1, 11)) if cross else None,
        "context_dim": draw(st.integers(1, 9)) if cross else None,
        "out_dim": draw(st.sampled_from([None, 5, 11])),
        "qkv_bias": draw(st.booleans()),
        "out_bias": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "window": draw(st.sampled_from([None, 1, 3])),
        "batch": draw(st.integers(1, 3)),
    }


def _mirror_and_inputs(cfg):
    torch.manual_seed(0)
    m = MirrorMHA(
        cfg["dim"], cfg["heads"], out_dim=cfg["out_dim"], context_dim=cfg["context_dim"],
        num_kv_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], qkv_bias=cfg["qkv_bias"],
        out_bias=cfg["out_bias"],
    )  # fmt: skip
    x = torch.randn(cfg["batch"], cfg["n"], cfg["dim"])
    ctx = None
    if cfg["context_len"] is not None:
        ctx = torch.randn(cfg["batch"], cfg["context_len"], cfg["context_dim"])
    return m, x, ctx


@settings(max_examples=40, deadline=None)
@given(cfg=configs(), sdpa=st.booleans())
def test_mha_flops_equal_counter_and_params_equal_module(cfg, sdpa):
    m, x, ctx = _mirror_and_inputs(cfg)
    cost = mha_cost(**cfg)
    measured = count_flops(m, x, ctx, causal=cfg["causal"], window=cfg["window"], sdpa=sdpa)
    assert measured == cost.flops == 2 * cost.macs
    assert cost.params == n_params(m)


@settings(max_examples=15, deadline=None)
@given(cfg=configs())
def test_backward_macs_are_twice_forward_when_every_operand_needs_grad(cfg):
    m, x, ctx = _mirror_and_inputs(cfg)
    x.requires_grad_(True)
    if ctx is not None:
        ctx.requires_grad_(True)
    cost = mha_cost(**cfg)
    out = m(x, ctx, causal=cfg["causal"], window=cfg["window"])
    assert count_flops(lambda: out.sum().backward()) == 2 * cost.backward_macs


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 17), s=st.integers(1, 17), causal=st.booleans(),
    window=st.sampled_from([None, 1, 2, 5, 40]),
)  # fmt: skip
def test_allowed_pairs_match_brute_force_mask(n, s, causal, window):
    assert allowed_pairs(n, s, causal=causal, window=window) == int(
        allowed_mask(n, s, causal, window).sum()
    )


def test_causal_reports_dense_and_lower_triangle_counts():
    n, c, h = 10, 12, 3
    dense, causal = mha_cost(n, c, h), mha_cost(n, c, h, causal=True)
    assert causal.macs == dense.macs  # dense kernels compute every product
    # the upper triangle (N(N-1)/2 pairs) of both N·N·C score-sized products
    assert causal.masked_macs == n * (n - 1) // 2 * 2 * c
    assert causal.unmasked_macs == 4 * n * c * c + n * (n + 1) * c
    assert causal.elementwise["mask"] == h * n * n and "mask" not in dense.elementwise


def test_mha_matches_torch_multihead_attention():
    n, s, c, kdim, h = 7, 5, 12, 9, 3
    for kd, ctx_len in ((None, None), (kdim, s)):
        torch.manual_seed(0)
        mha = nn.MultiheadAttention(c, h, kdim=kd, vdim=kd, batch_first=True, dropout=0.0)
        cost = mha_cost(n, c, h, context_len=ctx_len, context_dim=kd)
        assert cost.params == n_params(mha)
        x = torch.randn(2, n, c)
        ctx = x if kd is None else torch.randn(2, s, kd)
        for need_weights in (True, False):  # bmm path, SDPA path
            flops = count_flops(mha, x, ctx, ctx, need_weights=need_weights)
            assert flops == mha_cost(n, c, h, context_len=ctx_len, context_dim=kd, batch=2).flops


@pytest.mark.parametrize("n,c", [(1, 1), (7, 12), (197, 768), (1025, 96)])
def test_closed_forms(n, c):
    for h in (1, 2, 3, 4, 6, 12):
        if c % h == 0:
            assert mha_cost(n, c, h).macs == 4 * n * c * c + 2 * n * n * c  # independent of H
    assert single_head_cost(n, c).macs == 3 * n * c * c + 2 * n * n * c
    assert mha_cost(n, c, 1).params == 4 * c * c + 4 * c
    assert mha_cost(n, c, 1, batch=3).macs == 3 * mha_cost(n, c, 1).macs
    assert mha_cost(n, c, 1, batch=3).params == mha_cost(n, c, 1).params


def test_single_head_matches_counter():
    m = MirrorMHA(11, 1, out_proj=False)
    x = torch.randn(2, 9, 11)
    cost = single_head_cost(9, 11, batch=2)
    assert count_flops(m, x) == cost.flops and cost.params == n_params(m)


class MirrorSwinWindowAttention(nn.Module):
    """Swin's WindowAttention after padding and window partition (Liu et al. 2021, code)."""

    def __init__(self, dim, heads, m):
        super().__init__()
        self.h, self.m = heads, m
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.rel_bias = nn.Parameter(torch.zeros((2 * m - 1) ** 2, heads))

    def forward(self, x):  # x (B, h, w, C)
        b, gh, gw, c = x.shape
        m = self.m
        x = nn.functional.pad(x, (0, 0, 0, -gw % m, 0, -gh % m))  # (B, h', w', C)
        hp, wp = x.shape[1], x.shape[2]
        x = x.view(b, hp // m, m, wp // m, m, c).transpose(2, 3).reshape(-1, m * m, c)
        qkv = self.qkv(x).view(x.shape[0], m * m, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv  # each (B·nW, H, M², d)
        attn = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # (B·nW, H, M², M²)
        return self.proj((attn @ v).transpose(1, 2).reshape(x.shape[0], m * m, c))


@pytest.mark.parametrize(
    "gh,gw,c,h,m", [(14, 14, 12, 3, 7), (9, 5, 6, 2, 4), (8, 12, 8, 1, 8), (3, 3, 4, 2, 2)]
)
def test_swin_window_cost_matches_counter_and_params(gh, gw, c, h, m):
    mod = MirrorSwinWindowAttention(c, h, m)
    cost = swin_window_cost(gh, gw, c, h, m, batch=2)
    assert count_flops(mod, torch.randn(2, gh, gw, c)) == cost.flops
    assert cost.params == n_params(mod)
    shifted = swin_window_cost(gh, gw, c, h, m, shifted=True, batch=2)
    assert shifted.macs == cost.macs  # SW-MSA costs what W-MSA costs in matmuls
    assert "mask" not in cost.elementwise
    # Swin does not shift when the grid fits in one window
    assert ("mask" in shifted.elementwise) == (min(gh, gw) > m)


def test_swin_closed_form_and_padding():
    gh, gw, c, m = 56, 56, 96, 7
    assert swin_window_cost(gh, gw, c, 3, m).macs == 4 * gh * gw * c * c + 2 * m * m * gh * gw * c
    padded = swin_window_cost(10, 10, c, 3, m)  # padded to 14×14
    assert padded.macs == swin_window_cost(14, 14, c, 3, m).macs
    # a grid no larger than M: window min(h, w) = 5, width 6 padded to 10, two 5×5 windows
    assert swin_window_cost(5, 6, c, 3, m).macs == 2 * mha_cost(25, c, 3).macs
    assert swin_window_cost(5, 6, c, 3, m).params == mha_cost(1, c, 3).params + 9 * 9 * 3


def test_cost_arithmetic_and_json():
    a, b = mha_cost(5, 6, 2, causal=True), mha_cost(3, 6, 3)
    total = a + b
    assert total.macs == a.macs + b.macs and total.params == a.params + b.params
    assert total.masked_macs == a.masked_macs
    assert total.terms["q_proj"] == a.terms["q_proj"] + b.terms["q_proj"]
    assert (3 * a).macs == (a * 3).macs == 3 * a.macs and (3 * a).params == 3 * a.params
    assert sum([a, a], Cost({})) == 2 * a
    d = json.loads(json.dumps(total.to_dict()))
    assert d["flops"] == 2 * d["macs"] == total.flops
    assert all(type(v) is int for v in (*d["terms"].values(), d["params"], d["macs"]))
    with pytest.raises(TypeError):
        _ = a * 1.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 4, "dim": 10, "heads": 3},  # heads do not divide dim
        {"n": 4, "dim": 12, "heads": 4, "kv_heads": 3},  # kv_heads do not divide heads
        {"n": 0, "dim": 12, "heads": 4},
        {"n": 4, "dim": 12, "heads": 4, "window": 0},
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs):
    with pytest.raises(ValueError, match=r"heads|n|window"):
        mha_cost(**kwargs)
