"""mha_cost with keys and values apart (C_k != C_v, d_k != d_v) and without W_O, term by term
against torch's FLOP counter, and against attnkit's and torch's modules."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attnkit
from attnkit.analysis import mha_cost

from .counting import MIRROR_TERMS, MirrorMHA, count_flops, flops_by_module, n_params

pytestmark = pytest.mark.threads(1)


@st.composite
def configs(draw):
    """Odd sizes; GQA/MQA; distinct key and value widths; d_v != d_k; with or without W_O."""
    heads = draw(st.sampled_from([1, 2, 3, 6]))
    out_proj = draw(st.booleans())
    cross = draw(st.booleans())
    return {
        "n": draw(st.integers(1, 11)),
        "dim": draw(st.integers(1, 13)),
        "heads": heads,
        "kv_heads": draw(st.sampled_from([g for g in (1, 2, 3, 6) if heads % g == 0])),
        "head_dim": draw(st.sampled_from([1, 3, 4])),
        "v_head_dim": draw(st.sampled_from([None, 1, 5])),
        "context_len": draw(st.integers(1, 9)) if cross else None,
        "key_dim": draw(st.integers(1, 9)) if cross else None,
        "value_dim": draw(st.integers(1, 9)) if cross else None,
        "out_proj": out_proj,
        "out_dim": draw(st.sampled_from([None, 5])) if out_proj else None,
        "qkv_bias": draw(st.booleans()),
        "out_bias": draw(st.booleans()),
        "causal": draw(st.booleans()),
        "window": draw(st.sampled_from([None, 2])),
        "batch": draw(st.integers(1, 2)),
    }


def _mirror(cfg):
    torch.manual_seed(0)
    return MirrorMHA(
        cfg["dim"], cfg["heads"], out_dim=cfg["out_dim"], key_dim=cfg["key_dim"],
        value_dim=cfg["value_dim"], num_kv_heads=cfg["kv_heads"], head_dim=cfg["head_dim"],
        v_head_dim=cfg["v_head_dim"], qkv_bias=cfg["qkv_bias"], out_bias=cfg["out_bias"],
        out_proj=cfg["out_proj"],
    )  # fmt: skip


def _inputs(cfg):
    b, s = cfg["batch"], cfg["context_len"]
    x = torch.randn(b, cfg["n"], cfg["dim"])
    if s is None:
        return x, None, None
    return x, torch.randn(b, s, cfg["key_dim"]), torch.randn(b, s, cfg["value_dim"])


@settings(max_examples=40, deadline=None)
@given(cfg=configs())
def test_every_term_equals_the_counter(cfg):
    m = _mirror(cfg)
    x, key, value = _inputs(cfg)
    cost = mha_cost(**cfg)
    measured = flops_by_module(m, x, key, value, causal=cfg["causal"], window=cfg["window"])
    expected_terms = set(MIRROR_TERMS) - (set() if cfg["out_proj"] else {"out_proj"})
    assert set(cost.terms) == expected_terms
    for term, module in MIRROR_TERMS.items():
        assert measured.get(f"MirrorMHA.{module}", 0) == 2 * cost.terms.get(term, 0), term
    assert measured["Global"] == cost.flops
    assert cost.params == n_params(m)


@settings(max_examples=15, deadline=None)
@given(cfg=configs())
def test_sdpa_path_and_backward_agree_with_the_formula(cfg):
    m = _mirror(cfg)
    x, key, value = (t if t is None else t.requires_grad_() for t in _inputs(cfg))
    cost = mha_cost(**cfg)
    kw = {"causal": cfg["causal"], "window": cfg["window"]}
    assert count_flops(m, x, key, value, sdpa=True, **kw) == cost.flops
    out = m(x, key, value, **kw)
    assert count_flops(lambda: out.sum().backward()) == 2 * cost.backward_macs


@pytest.mark.parametrize("n,c", [(1, 1), (7, 12), (197, 768), (1025, 96)])
def test_closed_form_without_output_projection(n, c):
    for h in (1, 2, 3, 4, 6, 12):
        if c % h == 0:
            cost = mha_cost(n, c, h, out_proj=False)
            assert cost.macs == 3 * n * c * c + 2 * n * n * c  # the single head's, for any H
            assert cost.params == 3 * c * c + 3 * c and "out_proj" not in cost.terms


def test_general_closed_form_with_keys_and_values_apart():
    n, s, c, ck, cv, h, g, dk, dv, co = 7, 11, 12, 5, 9, 6, 2, 3, 4, 10
    cost = mha_cost(
        n, c, h, context_len=s, key_dim=ck, value_dim=cv, kv_heads=g, head_dim=dk,
        v_head_dim=dv, out_dim=co,
    )  # fmt: skip
    assert cost.macs == n * c * h * dk + s * ck * g * dk + s * cv * g * dv + h * n * s * (
        dk + dv
    ) + (n * h * dv * co)
    no_wo = mha_cost(n, c, h, context_len=s, key_dim=ck, value_dim=cv, kv_heads=g,
                     head_dim=dk, v_head_dim=dv, out_proj=False)  # fmt: skip
    assert no_wo.macs == cost.macs - n * h * dv * co
    causal = mha_cost(n, c, h, head_dim=dk, v_head_dim=dv, causal=True)
    assert causal.masked_macs == n * (n - 1) // 2 * h * (dk + dv)


CASES = [
    dict(n=5, dim=12, heads=3, v_head_dim=5),
    dict(n=6, dim=12, heads=4, context_len=9, context_dim=7, head_dim=2, v_head_dim=6),
    dict(n=4, dim=10, heads=6, kv_heads=2, context_len=3, key_dim=3, value_dim=8, head_dim=2),
    dict(n=7, dim=8, heads=2, context_len=5, key_dim=6, value_dim=3, out_proj=False),
    dict(n=3, dim=9, heads=3, out_proj=False, qkv_bias=False, causal=True, batch=2),
]


# (the chunked backend runs a C++ kernel on the CPU, which torch's counter cannot see)
@pytest.mark.parametrize("backend", ["reference", "fused"])
@pytest.mark.parametrize("cfg", CASES, ids=range(len(CASES)))
def test_attnkit_module_term_by_term(cfg, backend):
    torch.manual_seed(0)
    cost = mha_cost(**cfg)
    m = attnkit.MultiHeadAttention(
        cfg["dim"], cfg["heads"], context_dim=cfg.get("context_dim"), key_dim=cfg.get("key_dim"),
        value_dim=cfg.get("value_dim"), num_kv_heads=cfg.get("kv_heads"),
        head_dim=cfg.get("head_dim"), v_head_dim=cfg.get("v_head_dim"),
        out_proj=cfg.get("out_proj", True), qkv_bias=cfg.get("qkv_bias", True), backend=backend,
    )  # fmt: skip
    assert n_params(m) == cost.params
    b, s = cfg.get("batch", 1), cfg.get("context_len")
    x = torch.randn(b, cfg["n"], cfg["dim"])
    kv = () if s is None else (torch.randn(b, s, m.key_dim), torch.randn(b, s, m.value_dim))
    measured = flops_by_module(m, x, *kv, causal=cfg.get("causal", False))
    assert measured["Global"] == cost.flops
    core = measured["MultiHeadAttention.attend"]
    assert core == 2 * (cost.terms["scores (QKᵀ)"] + cost.terms["weights·V"])
    projections = ("q_proj", "k_proj", "v_proj")
    if isinstance(m.in_proj, attnkit.modules.projection.SeparateQKV):
        for term, part in zip(projections, "qkv", strict=True):
            assert measured[f"MultiHeadAttention.in_proj.{part}"] == 2 * cost.terms[term]
    else:
        assert measured["MultiHeadAttention.in_proj"] == 2 * sum(cost.terms[t] for t in projections)
    assert measured.get("MultiHeadAttention.proj", 0) == 2 * cost.terms.get("out_proj", 0)


@pytest.mark.parametrize(("kdim", "vdim"), [(10, 6), (5, 16)])
def test_torch_multihead_attention_with_kdim_ne_vdim(kdim, vdim):
    n, s, c, h = 7, 5, 12, 3
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(c, h, kdim=kdim, vdim=vdim, batch_first=True)
    cost = mha_cost(n, c, h, context_len=s, key_dim=kdim, value_dim=vdim, batch=2)
    assert cost.params == n_params(mha)
    x, key, value = torch.randn(2, n, c), torch.randn(2, s, kdim), torch.randn(2, s, vdim)
    for need_weights in (True, False):  # bmm path, SDPA path
        assert count_flops(mha, x, key, value, need_weights=need_weights) == cost.flops


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"out_proj": False, "out_dim": 7}, "out_dim=7 must equal heads·v_head_dim=12"),
        ({"context_dim": 5, "key_dim": 6}, "context_dim=5 sets key_dim and value_dim"),
        ({"v_head_dim": 0}, "v_head_dim must be a positive integer"),
        ({"key_dim": -2}, "key_dim must be a positive integer"),
        ({"value_dim": True}, "value_dim must be a positive integer"),
    ],
)
def test_bad_widths_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mha_cost(4, 12, 4, **kwargs)
