"""attention(): every backend against a float64 reference, and the contracts of DESIGN.md."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from attnkit import AttentionOutput, attention, masks, use_backend
from attnkit.functional import _choose, _sdpa_backend
from tests.naive import naive_attention

# the module (attnkit.functional's `attention` attribute is the function)
attention_module = importlib.import_module("attnkit.functional.attention")

BACKENDS = ["reference", "fused", "chunked"]
TOL = {torch.float32: 2e-5, torch.float64: 1e-10}


def rand(*shape, dtype=torch.float32, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 2**31)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def qkv(b, h, hkv, n, s, d, dv=None, dtype=torch.float32, seed=0):
    dv = d if dv is None else dv
    return (
        rand(b, h, n, d, dtype=dtype, seed=seed),
        rand(b, hkv, s, d, dtype=dtype, seed=seed + 1),
        rand(b, hkv, s, dv, dtype=dtype, seed=seed + 2),
    )


SIZES = [(1, 1), (7, 7), (97, 97), (257, 257), (7, 97), (97, 7), (1, 257), (1025, 33)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("n", "s"), SIZES)
@pytest.mark.parametrize("d", [8, 80])
def test_matches_float64_reference(backend, n, s, d):
    q, k, v = qkv(2, 3, 3, n, s, d)
    out = attention(q, k, v, backend=backend).out
    want, _ = naive_attention(q, k, v)
    assert out.dtype == torch.float32 and out.shape == (2, 3, n, d)
    torch.testing.assert_close(out.double(), want, atol=TOL[torch.float32], rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [32, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_bias_causal_combine(backend, d, causal):
    n, s = 37, 53  # N != S: causal aligned bottom-right
    q, k, v = qkv(2, 4, 4, n, s, d, dv=24)
    mask = rand(2, 1, n, s, seed=5) > -0.8  # (B, 1, N, S) broadcast over heads
    bias = rand(1, 4, 1, s, seed=6)  # (1, H, 1, S) broadcast over batch and queries
    out = attention(q, k, v, mask=mask, bias=bias, causal=causal, backend=backend).out
    want, _ = naive_attention(q, k, v, mask=mask, bias=bias, causal=causal)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_causal_with_a_scale_of_zero_or_below(backend, scale):
    """SDPA's CPU kernel gives NaN rows for is_causal with scale <= 0 (the masked -inf times
    the scale); every backend must still give the float64 truth (found by hypothesis)."""
    q, k, v = qkv(2, 3, 3, 6, 6, 8, seed=3)
    out = attention(q, k, v, causal=True, scale=scale, backend=backend).out
    want, _ = naive_attention(q, k, v, causal=True, scale=scale)
    torch.testing.assert_close(out.double(), want, atol=TOL[torch.float32], rtol=0)


def test_causal_is_bottom_right_aligned():
    q, k, v = qkv(1, 1, 1, 3, 5, 4)
    weights = attention(q, k, v, causal=True, need_weights=True).weights[0, 0]
    # query i sees keys j <= i + 2
    assert torch.equal(weights > 0, masks.causal(3, 5)[0, 0])
    assert masks.causal(3, 5)[0, 0].tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa_equals_repeated_kv(backend, hkv):
    q, k, v = qkv(2, 8, hkv, 19, 23, 16)
    got = attention(q, k, v, causal=True, backend=backend).out
    rep = 8 // hkv
    k_full, v_full = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    want = attention(q, k_full, v_full, causal=True, backend="reference").out
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


@pytest.fixture(params=["sdpa zeroes them", "attnkit zeroes them"])
def sdpa_empty_rows(request, monkeypatch):
    """Run `fused` both ways: trusting SDPA with empty rows (torch >= 2.5) and fixing them."""
    if request.param == "attnkit zeroes them":
        monkeypatch.setattr(_sdpa_backend, "SDPA_ZEROES_EMPTY_ROWS", False)
    elif not _sdpa_backend.SDPA_ZEROES_EMPTY_ROWS:
        pytest.skip("this torch's SDPA gives NaN for empty rows; attnkit fixes them itself")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_give_zero_output_and_zero_grad(backend, dtype, sdpa_empty_rows):
    q, k, v = (t.requires_grad_() for t in qkv(2, 2, 2, 6, 9, 8, dtype=dtype))
    mask = torch.ones(2, 1, 6, 9, dtype=torch.bool)
    mask[0, 0, 2] = False  # one query of batch 0 sees nothing
    mask[1, 0, :] = False  # all of batch 1 sees nothing
    bias = torch.zeros(1, 1, 6, 9, dtype=dtype)
    bias[0, 0, 4] = float("-inf")  # a row blocked by the bias alone
    res = attention(q, k, v, mask=mask, bias=bias, backend=backend)
    assert torch.isfinite(res.out).all()
    assert (
        (res.out[0, :, 2] == 0).all() and (res.out[1] == 0).all() and (res.out[0, :, 4] == 0).all()
    )
    assert (res.out[0, :, 0] != 0).any()
    res.out.float().square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[0, :, 2] == 0).all() and (q.grad[1] == 0).all() and (q.grad[0, :, 4] == 0).all()
    assert (k.grad[1] == 0).all() and (v.grad[1] == 0).all()
    if res.lse is not None:
        assert torch.isneginf(res.lse[0, :, 2]).all() and torch.isneginf(res.lse[1]).all()


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_lse_is_logsumexp_of_scaled_masked_scores(backend):
    q, k, v = qkv(1, 2, 2, 11, 13, 8)
    mask = rand(1, 1, 11, 13, seed=3) > 0
    mask[..., 0] = True
    res = attention(q, k, v, mask=mask, scale=0.3, backend=backend)
    scores = (q.double() @ k.double().transpose(-1, -2) * 0.3).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(res.lse.double(), torch.logsumexp(scores, -1), atol=1e-5, rtol=0)


def test_weights_rows_sum_to_one_and_match_reference():
    q, k, v = qkv(2, 3, 3, 10, 12, 8)
    res = attention(q, k, v, need_weights=True)
    _, probs = naive_attention(q, k, v)
    torch.testing.assert_close(res.weights.double(), probs, atol=1e-6, rtol=0)
    torch.testing.assert_close(res.weights.sum(-1), torch.ones(2, 3, 10))


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_gradcheck_float64(backend):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 1, 5, 7, 3, dv=4, dtype=torch.float64))
    mask = rand(1, 1, 5, 7, seed=9) > -0.5
    bias = rand(1, 2, 5, 7, dtype=torch.float64, seed=10).requires_grad_()

    def f(q, k, v, bias):
        return attention(q, k, v, mask=mask, bias=bias, causal=True, backend=backend).out

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_matches_reference_grads(backend):
    q, k, v = qkv(2, 4, 2, 33, 29, 16)
    mask = rand(2, 1, 33, 29, seed=4) > -1
    grads = []
    for name in ("reference", backend):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(*leaves, mask=mask, causal=True, backend=name).out
        out.backward(rand(*out.shape, seed=7))
        grads.append([t.grad for t in leaves])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=5e-5, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_only_when_training(backend):
    q, k, v = qkv(1, 2, 2, 16, 16, 8)
    plain = attention(q, k, v, backend=backend).out
    evald = attention(q, k, v, dropout_p=0.5, training=False, backend=backend).out
    torch.testing.assert_close(evald, plain, atol=2e-6, rtol=0)
    torch.manual_seed(0)
    trained = attention(q, k, v, dropout_p=0.5, training=True, backend=backend).out
    assert (trained - plain).abs().max() > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_keep_rate_and_unbiased(backend):
    # v = identity picks out each probability: out[i, j] = keep[i, j] * p[i, j] / (1 - p)
    n = s = 64
    q = torch.zeros(1, 1, n, 8)
    k = torch.zeros(1, 1, s, 8)
    v = torch.eye(s)[None, None]
    torch.manual_seed(1)
    out = attention(q, k, v, dropout_p=0.25, training=True, backend=backend).out
    kept = (out > 0).double().mean().item()
    assert abs(kept - 0.75) < 0.02  # 4096 draws: 5 sigma ~ 0.034 / 0.75 ... well inside
    assert torch.allclose(out[out > 0], torch.tensor(1 / s / 0.75), rtol=1e-2)


def _half_error(dtype, backend):
    q, k, v = qkv(2, 4, 4, 97, 97, 64, dtype=torch.float64, seed=11)
    want, _ = naive_attention(q, k, v)
    got = attention(q.to(dtype), k.to(dtype), v.to(dtype), backend=backend).out
    qh, kh, vh = q.to(dtype), k.to(dtype), v.to(dtype)
    naive_half = torch.softmax((qh @ kh.transpose(-1, -2)) * 64**-0.5, -1) @ vh
    return (got.double() - want).abs().max(), (naive_half.double() - want).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_twice_naive_error(backend, dtype):
    ours, naive = _half_error(dtype, backend)
    assert ours <= 2 * naive, (ours, naive)


def test_use_backend_overrides_auto_only():
    q, k, v = qkv(1, 1, 1, 4, 4, 8)
    with use_backend("reference"):
        assert attention(q, k, v).lse is not None  # reference gives lse
        assert attention(q, k, v, backend="fused").lse is None  # explicit choice wins
    assert attention(q, k, v).lse is None  # auto without dropout: fused
    with pytest.raises(ValueError, match="use_backend"), use_backend("fast"):
        pass


def test_returns_attention_output():
    q, k, v = qkv(1, 1, 1, 2, 3, 4)
    res = attention(q, k, v)
    assert isinstance(res, AttentionOutput) and res.weights is None


BAD = [
    (dict(q=rand(2, 3, 4)), "q must have shape"),
    (dict(k=rand(2, 2, 5, 7)), "k must have shape"),
    (dict(k=rand(3, 2, 5, 8)), "k must have shape"),
    (dict(v=rand(2, 2, 6, 8)), "v must have shape"),
    (dict(k=rand(2, 3, 5, 8), v=rand(2, 3, 5, 8)), "multiple of key/value heads"),
    (dict(mask=torch.ones(4, 5)), "mask must be boolean"),
    (dict(mask=torch.ones(3, 5, dtype=torch.bool)), "does not broadcast"),
    (dict(bias=torch.ones(1, 1, 1, 1, 4, 5)), "does not broadcast"),
    (dict(bias=torch.ones(4, 5, dtype=torch.long)), "bias must be a floating"),
    (dict(dropout_p=1.0), "dropout_p"),
    (dict(q=rand(2, 4, 4, 8, dtype=torch.float64)), "share a dtype"),
    (dict(backend="flash"), "backend must be one of"),
    (dict(need_weights=True, backend="fused"), "need_weights"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_input_raises_value_error_naming_argument(change, message):
    args = dict(q=rand(2, 4, 4, 8), k=rand(2, 2, 5, 8), v=rand(2, 2, 5, 8))
    args.update(change)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=message):
        attention(q, k, v, **args)


def test_probe_of_sdpa_empty_rows_leaves_the_random_stream_alone():
    torch.manual_seed(3)
    _sdpa_backend._probe_sdpa_empty_rows()  # draws dropout bits in a forked RNG
    after = torch.rand(3)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(3))


@pytest.mark.parametrize("native_bf16", [True, False])
def test_auto_for_bfloat16_training_follows_the_cpu(native_bf16, monkeypatch):
    monkeypatch.setattr(_choose, "NATIVE_BF16", native_bf16)
    got = attention_module._choose_backend(
        "auto", need_weights=False, dropout=False, low_precision_grad=True
    )
    assert got == ("fused" if native_bf16 else "chunked")
    assert attention_module._choose_backend("auto", need_weights=False, dropout=False) == "fused"


def test_masks_whose_leading_dim_could_be_the_batch_are_refused():
    q, k, v = qkv(3, 2, 2, 3, 5, 8)  # B = N = 3
    pad = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) is ambiguous with B = N = 3"):
        attention(q, k, v, mask=pad)
    # spelled 4-D, each reading is accepted and they differ
    as_padding = attention(q, k, v, mask=pad[:, None, None, :]).out
    as_rows = attention(q, k, v, mask=pad[None, None]).out
    assert not torch.allclose(as_padding, as_rows)
    torch.testing.assert_close(
        as_padding, attention(q, k, v, mask=masks.from_hf_attention_mask(pad)).out
    )
    # (B, N, S) with B = H: Keras' mask or a per-head one
    q2, k2, v2 = qkv(2, 2, 2, 3, 5, 8)
    keras = torch.rand(2, 3, 5, generator=torch.Generator().manual_seed(1)) > 0.3
    with pytest.raises(ValueError, match=r"ambiguous with B = H = 2.*mask\[:, None\]"):
        attention(q2, k2, v2, mask=keras)
    with pytest.raises(ValueError, match="bias of shape"):
        attention(q2, k2, v2, bias=keras.float())
    attention(q2, k2, v2, mask=keras[:, None])


def test_unambiguous_low_rank_masks_still_broadcast():
    q, k, v = qkv(2, 4, 4, 3, 5, 8)  # B = 2, H = 4, N = 3
    m2 = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) > 0.3  # (N, S), N != B
    m3 = torch.rand(4, 3, 5, generator=torch.Generator().manual_seed(3)) > 0.3  # (H, N, S)
    for mask in (m2, m3, m2[:1], torch.ones(1, 5, dtype=torch.bool)):
        want = attention(q, k, v, mask=mask[(None,) * (4 - mask.dim())]).out  # spelled 4-D
        torch.testing.assert_close(attention(q, k, v, mask=mask).out, want)
    q1, k1, v1 = qkv(1, 2, 2, 1, 5, 8)  # B = N = 1 (decoding one token): both readings agree
    one = torch.tensor([[True, False, True, True, False]])
    torch.testing.assert_close(
        attention(q1, k1, v1, mask=one).out, attention(q1, k1, v1, mask=one[:, None, None]).out
    )
