"""attnkit.nn.functional.scaled_dot_product_attention against torch's SDPA (float64, 1e-12):
examples, and a Hypothesis property over masks (bool/float, broadcast), is_causal, scale,
enable_gqa, dropout_p=0 and shapes together."""

from __future__ import annotations

import inspect
from math import inf

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.nn.functional import _unmasked
from attnkit.nn.functional import scaled_dot_product_attention as sdpa

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-12}


def qkv(q_shape, k_shape, v_width=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    v_shape = (*k_shape[:-1], v_width or k_shape[-1])
    return (torch.randn(s, dtype=F64, generator=g) for s in (q_shape, k_shape, v_shape))


def test_signature_is_torchs():
    """torch's SDPA is a builtin without an inspectable signature: its docstring states it."""
    head = F.scaled_dot_product_attention.__doc__.split(")")[0]  # "name(query, ..., gqa=False"
    theirs = [p.strip() for p in head.split("(", 1)[1].replace("\n", " ").split(",")]
    ours = [
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(sdpa).parameters.values()
    ]
    assert ours == theirs


SHAPES = [
    ((2, 3, 5, 8), (2, 3, 7, 8)),  # (B, H, L, E), (B, H, S, E)
    ((2, 5, 8), (2, 7, 8)),  # (B, L, E)
    ((5, 8), (7, 8)),  # (L, E)
    ((2, 2, 3, 5, 8), (2, 2, 3, 7, 8)),  # two batch dimensions
    ((2, 3, 5, 8), (2, 1, 7, 8)),  # one key/value head broadcasts
    ((2, 3, 7, 8), (2, 3, 7, 8)),  # L == S
    ((2, 3, 9, 8), (2, 3, 4, 8)),  # L > S
]


@pytest.mark.parametrize(("q_shape", "k_shape"), SHAPES, ids=str)
def test_equals_torch_for_every_mask_form(q_shape, k_shape):
    q, k, v = qkv(q_shape, k_shape, v_width=6)
    n, s = q_shape[-2], k_shape[-2]
    g = torch.Generator().manual_seed(1)
    allowed = torch.rand(n, s, generator=g) > 0.3
    allowed[:, 0] = True
    batch = q_shape[:-2]
    allowed_full = torch.rand(*batch, n, s, generator=g) > 0.3
    allowed_full[..., 0] = True
    bias = torch.randn(n, s, dtype=F64, generator=g).masked_fill(~allowed, float("-inf"))
    cases = [
        {},
        {"is_causal": True},
        {"attn_mask": allowed},
        {"attn_mask": allowed_full},
        {"attn_mask": bias},
        {"scale": 0.3},
        {"attn_mask": bias, "scale": 1.7},
    ]
    for kw in cases:
        want = F.scaled_dot_product_attention(q, k, v, **kw)
        torch.testing.assert_close(
            sdpa(q, k, v, **kw), want, **TOL, msg=lambda m, kw=kw: f"{kw}: {m}"
        )


@pytest.mark.parametrize(("n", "s"), [(5, 5), (3, 7), (7, 3)])
def test_is_causal_is_aligned_top_left_as_torch_does(n, s):
    q, k, v = qkv((1, 2, n, 4), (1, 2, s, 4))
    top_left = torch.ones(n, s, dtype=torch.bool).tril()  # query i sees keys j <= i
    got = sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=top_left))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TOL)


def test_grouped_query_attention_equals_torch():
    q, k, v = qkv((2, 6, 5, 8), (2, 2, 7, 8))
    for kw in ({}, {"is_causal": True}):
        want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
        torch.testing.assert_close(sdpa(q, k, v, enable_gqa=True, **kw), want, **TOL)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)


def test_gradients_equal_torch():
    q, k, v = qkv((2, 3, 5, 8), (2, 3, 7, 8))
    allowed = torch.rand(5, 7) > 0.3
    allowed[:, 0] = True
    grads = []
    for fn in (F.scaled_dot_product_attention, sdpa):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, attn_mask=allowed).square().sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_a_row_that_sees_no_key_gives_zero_and_zero_gradient():
    q, k, v = qkv((1, 2, 4, 8), (1, 2, 6, 8))
    allowed = torch.ones(4, 6, dtype=torch.bool)
    allowed[2] = False
    q.requires_grad_()
    out = sdpa(q, k, v, attn_mask=allowed)
    out.sum().backward()
    assert (out[..., 2, :] == 0).all() and (q.grad[..., 2, :] == 0).all()
    assert not out.isnan().any()


def test_dropout_acts_whenever_dropout_p_is_positive():
    q, k, v = qkv((1, 2, 16, 8), (1, 2, 16, 8))
    torch.manual_seed(0)
    a = sdpa(q, k, v, dropout_p=0.5)
    assert not torch.allclose(a, sdpa(q, k, v))  # no training flag: SDPA always drops
    torch.manual_seed(0)
    torch.testing.assert_close(sdpa(q, k, v, dropout_p=0.5), a)  # seeded: repeatable


def test_bad_calls_raise_value_error():
    q, k, v = qkv((1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(ValueError, match="boolean or floating"):
        sdpa(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="rank"):
        sdpa(torch.randn(8), k, v)
    with pytest.raises(ValueError, match="batch dimensions"):
        two = torch.randn(2, 2, 4, 8, dtype=F64)  # batch 2 against the query's 3
        sdpa(torch.randn(3, 2, 4, 8, dtype=F64), two, two)


@st.composite
def sdpa_calls(draw):
    """Shapes and options of one SDPA call: 0 to 2 batch dimensions before the heads (or a
    rank-2 call), key/value heads equal, 1 or a divisor (enable_gqa), L != S, Ev != E, a
    mask broadcast from any sub-shape, bool or float, or is_causal, a scale or not."""
    rank2 = draw(st.booleans())
    heads = 1 if rank2 else draw(st.sampled_from([1, 2, 4, 6]))
    kv_heads = (
        heads if rank2 else draw(st.sampled_from([h for h in (1, 2, heads) if heads % h == 0]))
    )
    batch = [] if rank2 else draw(st.lists(st.integers(1, 3), max_size=2))
    n, s = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    e, ev = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    lead = [] if rank2 else [*batch, heads]
    kind = draw(st.sampled_from(["none", "bool", "float", "causal"]))
    mask_shape = [d if draw(st.booleans()) else 1 for d in (*lead, n, s)]
    mask_shape = mask_shape[draw(st.integers(0, len(lead))) :]  # fewer leading dimensions
    return {
        "q": (*lead, n, e),
        "k": (*batch, kv_heads, s, e) if not rank2 else (s, e),
        "v": (*batch, kv_heads, s, ev) if not rank2 else (s, ev),
        "kind": kind,
        "mask_shape": tuple(mask_shape),
        "scale": draw(st.sampled_from([None, 0.3, 1.7])),
        # torch 2.13 raises IndexError for enable_gqa on rank-2 inputs (it reads dimension -3)
        "enable_gqa": kv_heads not in (1, heads) or (not rank2 and draw(st.booleans())),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=300, deadline=None, derandomize=True)
@given(sdpa_calls())
def test_property_every_combination_equals_torch(call):
    """attn_mask (bool/float, broadcast) or is_causal × scale × enable_gqa × dropout_p=0 ×
    shapes: torch's SDPA numbers in float64 to 1e-12. Key 0 stays visible in every mask (a
    row that sees nothing is where attnkit's rule may differ)."""
    g = torch.Generator().manual_seed(call["seed"])
    q, k, v = (torch.randn(call[x], dtype=F64, generator=g) for x in "qkv")
    kw = {"scale": call["scale"], "enable_gqa": call["enable_gqa"], "dropout_p": 0.0}
    if call["kind"] == "causal":
        kw["is_causal"] = True
    elif call["kind"] != "none":
        allowed = torch.rand(call["mask_shape"], generator=g) > 0.4
        allowed[..., 0] = True
        bias = torch.randn(allowed.shape, dtype=F64, generator=g)
        kw["attn_mask"] = allowed if call["kind"] == "bool" else bias.masked_fill(~allowed, -inf)
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(sdpa(q, k, v, **kw), want, **TOL, msg=lambda m: f"{call}: {m}")


@pytest.mark.parametrize(
    ("h", "hkv", "n", "s", "is_causal", "gqa"),
    [(4, 4, 16, 16, True, False), (4, 4, 1, 9, False, False), (4, 2, 3, 5, False, True),
     (4, 1, 2, 6, False, False)],
)  # fmt: skip
def test_unmasked_calls_take_attentions_short_path_with_torchs_result(h, hkv, n, s, is_causal,
                                                                       gqa):  # fmt: skip
    """No mask or dropout, (B, H, L, E): attention's short path (`_unmasked`). The same SDPA call
    as torch's where torch runs it the same way (equal heads, or enable_gqa): the same bits."""
    q, k, v = (t.float() for t in qkv((2, h, n, 16), (2, hkv, s, 16)))
    assert _unmasked(q, k, v, None, 0.0, is_causal, None, gqa) is not None
    got = sdpa(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    if hkv == h or gqa:
        assert torch.equal(got, want)
    else:  # one key/value head, broadcast by torch's math path: the same up to rounding
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize(
    ("why", "call"),
    [
        ("a mask", dict(attn_mask=torch.ones(3, 5, dtype=torch.bool))),
        ("dropout", dict(dropout_p=0.1)),
        ("is_causal with L != S: top-left", dict(is_causal=True)),
        ("heads torch refuses", dict(kv_heads=2)),
        ("rank 3", dict(rank=3)),
    ],
)
def test_other_calls_take_the_full_route(why, call):
    kv_heads, rank = call.pop("kv_heads", 4), call.pop("rank", 4)
    q, k, v = (t.float() for t in qkv((2, 4, 3, 8)[-rank:], (2, kv_heads, 5, 8)[-rank:]))
    args = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False} | call
    assert _unmasked(q, k, v, *args.values(), None, False) is None, why
