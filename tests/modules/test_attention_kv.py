"""MultiHeadAttention with keys and values apart (widths Ck != Cv, heads Dk != Dv) and without W_O.

Each case is checked against the module's math written out in float64 from its own weights
(tests/naive.py for the attention core), on every backend, and against
torch.nn.MultiheadAttention(kdim, vdim) on shared weights.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnkit import MultiHeadAttention, record_attention
from attnkit.convert import from_torch, to_torch
from attnkit.modules.projection import FusedQKV, SeparateQKV, SplitQKV
from tests.naive import naive_attention

BACKENDS = ["reference", "fused", "chunked", "auto"]


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _weights(m: MultiHeadAttention) -> dict[str, torch.Tensor]:
    """q, k, v weights and biases in float64, whichever layout the module chose."""
    sd = {k: t.double() for k, t in m.state_dict().items()}
    q_w, k_w = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    v_w = m.num_kv_heads * m.v_head_dim
    out = {}
    for kind in ("weight", "bias"):
        if f"in_proj.qkv.{kind}" in sd:
            parts = sd[f"in_proj.qkv.{kind}"].split([q_w, k_w, v_w])
        elif f"in_proj.kv.{kind}" in sd:
            parts = (sd[f"in_proj.q.{kind}"], *sd[f"in_proj.kv.{kind}"].split([k_w, v_w]))
        else:
            parts = tuple(sd.get(f"in_proj.{p}.{kind}") for p in "qkv")
        out.update({f"{p}.{kind}": t for p, t in zip("qkv", parts, strict=True)})
    out["o.weight"], out["o.bias"] = sd.get("proj.weight"), sd.get("proj.bias")
    return out


def float64_mha(m, query, key=None, value=None, *, mask=None, causal=False, pos=None, kpos=None):
    """The module's forward in float64: (B, N, Co) and the probabilities (B, H, N, S)."""
    w = _weights(m)
    x = query.double()
    key = x if key is None else key.double()
    value = key if value is None else value.double()
    if key is x and pos is not None:
        kpos = pos
    xq = x if pos is None else x + pos.double()
    xk = key if kpos is None else key + kpos.double()

    def lin(t, p, heads):
        y = t @ w[f"{p}.weight"].T
        y = y if w[f"{p}.bias"] is None else y + w[f"{p}.bias"]
        return y.unflatten(-1, (heads, -1)).transpose(1, 2)  # (B, heads, L, D)

    q, k, v = (
        lin(xq, "q", m.num_heads),
        lin(xk, "k", m.num_kv_heads),
        lin(value, "v", m.num_kv_heads),
    )
    o, probs = naive_attention(q, k, v, mask=mask, causal=causal, scale=m.attend.scale)
    o = o.transpose(1, 2).flatten(2)  # (B, N, H·Dv)
    if w["o.weight"] is not None:
        o = o @ w["o.weight"].T + (0 if w["o.bias"] is None else w["o.bias"])
    return o, probs


CASES = {
    # one width for everything, but keys and values from different tensors, Dv != Dk
    "fused": dict(dim=12, num_heads=3, v_head_dim=5),
    "split": dict(dim=12, num_heads=4, context_dim=7, head_dim=2, v_head_dim=6),
    "separate": dict(dim=12, num_heads=2, key_dim=9, value_dim=5, v_head_dim=7),
    "separate-gqa": dict(
        dim=12, num_heads=6, num_kv_heads=2, key_dim=3, value_dim=10, v_head_dim=1
    ),
    "separate-mqa-no-wo": dict(
        dim=10,
        num_heads=3,
        num_kv_heads=1,
        key_dim=4,
        value_dim=11,
        head_dim=3,
        v_head_dim=4,
        out_proj=False,
    ),
    "no-bias": dict(dim=8, num_heads=2, key_dim=6, value_dim=3, qkv_bias=False, out_bias=False),
}
LAYOUT = {"fused": FusedQKV, "split": SplitQKV}


def _inputs(m, n=7, s=9, dtype=torch.float32):
    x = rand(2, n, m.dim, dtype=dtype)
    key = rand(2, s, m.key_dim, seed=1, dtype=dtype)
    value = rand(2, s, m.value_dim, seed=2, dtype=dtype)
    mask = rand(2, 1, n, s, seed=3) > -0.6
    mask[1, 0, 2] = False  # a query that sees nothing: output 0 before W_O
    return x, key, value, mask


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_distinct_keys_values_and_head_widths_match_float64(case, backend):
    torch.manual_seed(0)
    m = MultiHeadAttention(**CASES[case], backend=backend).eval()
    assert isinstance(m.in_proj, LAYOUT.get(case, SeparateQKV))
    x, key, value, mask = _inputs(m)
    pos, kpos = rand(2, 7, m.dim, seed=4), rand(1, 9, m.key_dim, seed=5)
    for causal in (False, True):
        got = m(x, key, value, mask=mask, causal=causal, pos=pos, context_pos=kpos)
        want, _ = float64_mha(m, x, key, value, mask=mask, causal=causal, pos=pos, kpos=kpos)
        assert got.shape == (2, 7, m.out_dim)
        torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_float64_module_equals_reference_to_1e12(case):
    m = MultiHeadAttention(**CASES[case], dtype=torch.float64).eval()
    x, key, value, mask = _inputs(m, dtype=torch.float64)
    for backend in BACKENDS:
        m.attend.backend = backend
        want, _ = float64_mha(m, x, key, value, mask=mask)
        torch.testing.assert_close(m(x, key, value, mask=mask), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("case", ["split", "separate-gqa", "separate-mqa-no-wo"])
def test_gradients_agree_across_backends_and_stay_finite(case):
    """Dv != Dk through backward on each backend (the native kernel on the CPU for chunked)."""
    m = MultiHeadAttention(**CASES[case], dtype=torch.float64)
    x, key, value, mask = _inputs(m, dtype=torch.float64)
    grads = {}
    for backend in BACKENDS:
        m.attend.backend = backend
        m.zero_grad()
        inputs = [t.clone().requires_grad_() for t in (x, key, value)]
        m(*inputs, mask=mask, causal=True).square().sum().backward()
        grads[backend] = [t.grad for t in inputs] + [p.grad.clone() for p in m.parameters()]
    for backend in BACKENDS:
        for got, want in zip(grads[backend], grads["reference"], strict=True):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_context_keyword_and_key_only_mean_key_equals_value():
    m = MultiHeadAttention(12, 3, context_dim=7, v_head_dim=2).eval()
    x, ctx = rand(2, 5, 12), rand(2, 4, 7, seed=1)
    want = m(x, ctx, ctx)
    assert torch.equal(m(x, ctx), want)
    assert torch.equal(m(x, context=ctx), want)
    assert torch.equal(m(x, key=ctx, value=ctx), want)
    torch.testing.assert_close(m(x, ctx).double(), float64_mha(m, x, ctx)[0], atol=2e-6, rtol=0)
    # self-attention: no key, no value
    s = MultiHeadAttention(12, 3, v_head_dim=2).eval()
    torch.testing.assert_close(s(x), s(x, x, x), atol=1e-6, rtol=0)


def test_record_attention_with_dk_ne_dv():
    m = MultiHeadAttention(12, 2, key_dim=9, value_dim=5, head_dim=3, v_head_dim=8).eval()
    x, key, value, mask = _inputs(m)
    with torch.no_grad():
        plain = m(x, key, value, mask=mask)
        with record_attention(m) as rec:
            recorded = m(x, key, value, mask=mask)
    _, probs = float64_mha(m, x, key, value, mask=mask)
    torch.testing.assert_close(recorded, plain, atol=1e-6, rtol=0)
    assert rec["attend"].shape == (2, 2, 7, 9)
    torch.testing.assert_close(rec["attend"].double(), probs, atol=1e-6, rtol=0)


def test_no_output_projection_returns_merged_heads():
    m = MultiHeadAttention(12, 3, head_dim=4, v_head_dim=5, out_proj=False).eval()
    assert isinstance(m.proj, nn.Identity) and m.out_dim == 15
    assert not any(name.startswith("proj") for name, _ in m.named_parameters())
    x = rand(2, 6, 12)
    q, k, v = m.heads_qkv(x)
    assert v.shape == (2, 3, 6, 5) and k.shape == (2, 3, 6, 4)
    o, _ = naive_attention(q, k, v)  # (B, H, N, Dv)
    torch.testing.assert_close(m(x).double(), o.transpose(1, 2).flatten(2), atol=1e-6, rtol=0)
    assert "out_proj=False" in repr(m) and "v_head_dim=5" in repr(m)
    lazy = MultiHeadAttention(None, 2, head_dim=3, out_proj=False)
    assert lazy(rand(1, 4, 5)).shape == (1, 4, 6)
    lazy = MultiHeadAttention(None, 2, out_dim=8, out_proj=False)  # head_dim = out_dim / H
    assert lazy(rand(1, 4, 5)).shape == (1, 4, 8) and lazy.head_dim == 4


def _torch_mha(e, h, kdim, vdim, dtype, bias=True):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(e, h, kdim=kdim, vdim=vdim, bias=bias, batch_first=True)
    m = m.to(dtype).eval()
    with torch.no_grad():  # torch zero-initialises biases: make them count
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-6), (torch.float64, 1e-12)], ids=["f32", "f64"]
)
@pytest.mark.parametrize(("kdim", "vdim"), [(10, 6), (16, 5), (7, 16), (None, None), (9, 9)])
@pytest.mark.parametrize("bias", [True, False])
def test_parity_and_exact_round_trip_with_torch_kdim_vdim(dtype, tol, kdim, vdim, bias):
    theirs = _torch_mha(16, 4, kdim, vdim, dtype, bias)
    ours = from_torch(theirs).eval()
    assert (ours.key_dim, ours.value_dim) == (theirs.kdim, theirs.vdim)
    x = rand(3, 5, 16, dtype=dtype)
    key, value = (
        rand(3, 8, theirs.kdim, seed=1, dtype=dtype),
        rand(3, 8, theirs.vdim, seed=2, dtype=dtype),
    )
    kpm = rand(3, 8, seed=3) > 0.6
    kpm[:, 0] = False  # torch gives NaN for fully padded rows
    want, _ = theirs(x, key, value, key_padding_mask=kpm, need_weights=False)
    with torch.no_grad():
        got = ours(x, key, value, mask=~kpm[:, None, None, :])
    assert (got - want).abs().max() <= tol
    back = to_torch(ours).eval()
    for (n1, p1), (n2, p2) in zip(
        theirs.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)
    again = from_torch(back)
    for (n1, p1), (n2, p2) in zip(
        ours.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(key_dim=0), "key_dim must be a positive integer"),
        (dict(value_dim=2.5), "value_dim must be a positive integer"),
        (dict(v_head_dim=-1), "v_head_dim must be a positive integer"),
        (dict(context_dim=8, key_dim=6), "context_dim=8 sets key_dim and value_dim; got key_dim=6"),
        (dict(context_dim=8, value_dim=5), "got value_dim=5"),
        (dict(out_proj=False, out_dim=12), r"out_dim=12 must equal num_heads·v_head_dim=8"),
        (dict(dim=None, value_dim=3, out_dim=12), "needs key_dim too"),
        (dict(dim=None, head_dim=3), "needs out_dim to size the output projection"),
    ],
)
def test_bad_widths_at_construction_name_the_argument(kwargs, message):
    base = dict(dim=12, num_heads=4, v_head_dim=2)
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**{**base, **kwargs})


def test_bad_inputs_name_the_argument_and_shapes():
    m = MultiHeadAttention(12, 2, key_dim=5, value_dim=7)
    x, key, value = rand(2, 3, 12), rand(2, 4, 5), rand(2, 4, 7)
    cases = [
        ((x, rand(2, 4, 6), value), {}, r"key must have shape \(B=2, S, 5\), got \(2, 4, 6\)"),
        ((x, key, rand(2, 4, 5)), {}, r"value must have shape \(B=2, S=4, 7\), got \(2, 4, 5\)"),
        ((x, key, rand(2, 3, 7)), {}, r"value must have shape \(B=2, S=4, 7\), got \(2, 3, 7\)"),
        ((x, key, rand(1, 4, 7)), {}, r"value must have shape \(B=2, S=4, 7\)"),
        ((x, key, rand(4, 7)), {}, r"value must have shape \(B, S, C\), got \(4, 7\)"),
        ((x, key), {}, r"pass value=\(B, S, 7\)"),
        ((x,), {"value": value}, "value needs key"),
        ((x, key, value), {"context": key}, "context= .* or key/value, not both"),
        ((x, key, value), {"context_pos": rand(2, 5, 5)}, "context_pos of shape"),
        ((x,), {"context_pos": rand(2, 4, 5)}, "context_pos needs a key"),
        ((x,), {}, r"pass key=\(B, S, 5\) and value=\(B, S, 7\)"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            m(*args, **kwargs)
    # a fused module (Ck = Cv = C) with a value of another length
    f = MultiHeadAttention(12, 2, v_head_dim=3)
    with pytest.raises(ValueError, match=r"value must have shape \(B=2, S=4, 12\)"):
        f(x, rand(2, 4, 12), rand(2, 5, 12))


def test_kv_cached_decoding_with_dk_ne_dv_equals_full_recomputation():
    from attnkit.models.decoding import CachedMultiHeadAttention, KVCache

    torch.manual_seed(0)
    m = CachedMultiHeadAttention(12, 3, num_kv_heads=1, v_head_dim=5).eval()
    x = rand(2, 6, 12)
    cache = KVCache()
    steps = [m(x[:, i : i + 1], causal=True, cache=cache) for i in range(6)]
    assert cache.entries[m][1].shape == (2, 1, 6, 5)  # (B, Hkv, S, Dv)
    torch.testing.assert_close(torch.cat(steps, 1), m(x, causal=True), atol=1e-6, rtol=0)
