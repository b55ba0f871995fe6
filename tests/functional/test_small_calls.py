"""attention()'s fast path for calls that run SDPA unmasked (`_fast_path.plain_call`): the same
meaning, the same contracts and the same refusals as the full route, against a float64 truth."""

from __future__ import annotations

import importlib

import pytest
import torch

from attnkit import attention, use_backend
from attnkit.functional import _choose, _fast_path, native
from tests.naive import naive_attention

# the module (attnkit.functional's `attention` attribute is the function)
attention_module = importlib.import_module("attnkit.functional.attention")


def plain_call(*args):
    """The fast path's output for a call (None: the full route), `use_backend`'s choice in force."""
    return _fast_path.plain_call(*args, _choose.override)


@pytest.fixture(params=["kernel", "sum"])
def finite_route(request, monkeypatch):
    """Rule 1's check both ways: the kernel's scan of q (loaded first), and the sum of q that
    calls made before the kernel's first use take."""
    if request.param == "kernel" and not native.available():
        pytest.skip("compiled kernel unavailable")
    if request.param == "sum":
        monkeypatch.setattr(_fast_path, "finite_check", lambda: None)
        monkeypatch.setattr(_fast_path, "_scan", None)
    return request.param


def qkv(h, hkv, n, s, d=16, dv=None, dtype=torch.float32, seed=0, grad=False):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((2, h, n, d), (2, hkv, s, d), (2, hkv, s, dv or d))  # (B, H|Hkv, N|S, D|Dv)
    return [torch.randn(sh, generator=gen, dtype=torch.float64).to(dtype) for sh in shapes]


@pytest.mark.parametrize(
    ("h", "hkv", "n", "s", "causal"),
    [(4, 4, 1, 1, True), (4, 2, 1, 7, True), (4, 1, 1, 97, True), (4, 4, 7, 7, True),
     (4, 4, 1, 1025, False), (4, 2, 97, 33, False), (4, 4, 16, 16, False)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_path_matches_float64_truth(h, hkv, n, s, causal, dtype):
    """Causal with N = 1 is bottom-right (the one query sees every key), run unmasked."""
    q, k, v = qkv(h, hkv, n, s, dv=24, dtype=dtype)
    assert plain_call(q, k, v, causal, 0.3, 0.0, False, "auto") is not None  # the fast path
    res = attention(q, k, v, causal=causal, scale=0.3)
    want, _ = naive_attention(q, k, v, causal=causal, scale=0.3)
    tol = 2e-5 if dtype == torch.float32 else 1e-10
    assert res.out.dtype == dtype and res.weights is None and res.lse is None
    torch.testing.assert_close(res.out.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("why", "call"),
    [
        ("causal, 1 < N != S: SDPA's is_causal is top-left", dict(n=7, s=9, causal=True)),
        ("causal with scale <= 0", dict(n=5, s=5, causal=True, scale=-0.5)),
        ("dropout", dict(dropout_p=0.1, training=True)),
        ("dropout_p out of range, even in eval", dict(dropout_p=1.5)),
        ("no key", dict(s=0)),
        ("no query", dict(n=0)),
        ("backend chunked", dict(backend="chunked")),
        ("a tensor scale", dict(scale=torch.tensor(0.5))),
    ],
)
def test_other_calls_take_the_full_route(why, call):
    n, s = call.pop("n", 5), call.pop("s", 5)
    q, k, v = qkv(2, 2, n, s)
    args = {"causal": False, "scale": None, "dropout_p": 0.0, "training": False}
    args |= {"backend": "auto"} | call
    assert plain_call(q, k, v, *args.values()) is None, why
    if why.startswith("dropout_p out of range"):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.5"):
            attention(q, k, v, **args)
    else:
        assert attention(q, k, v, **args).out.shape == (2, 2, n, 16)  # the full route's answer


def test_dropout_out_of_training_keeps_the_fast_path():
    """A module in eval mode passes its dropout_p with training=False: no dropout, so SDPA."""
    q, k, v = qkv(4, 2, 1, 9)
    assert plain_call(q, k, v, True, None, 0.1, False, "auto") is not None
    got = attention(q, k, v, causal=True, dropout_p=0.1, training=False).out
    torch.testing.assert_close(got.double(), naive_attention(q, k, v)[0], atol=2e-5, rtol=2e-5)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_override_and_tracing_take_the_full_route():
    q, k, v = qkv(2, 2, 3, 3)
    with use_backend("chunked"):
        assert plain_call(q, k, v, False, None, 0.0, False, "auto") is None
        assert plain_call(q, k, v, False, None, 0.0, False, "fused") is not None  # explicit
    with use_backend("fused"):
        assert plain_call(q, k, v, False, None, 0.0, False, "auto") is not None
    traced = torch.jit.trace(lambda q, k, v: attention(q, k, v, causal=True).out, (q, k, v))
    torch.testing.assert_close(traced(q, k, v), attention(q, k, v, causal=True).out)
    assert plain_call(torch.nn.Parameter(q), k, v, False, None, 0.0, False, "auto") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "s"), [(1, 97), (16, 16)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_rows_whose_q_is_not_finite_are_nan(dtype, n, s, bad, finite_route):
    """Rule 1 of the non-finite contract on the fast path (SDPA's CPU kernel gives some such
    rows 0), with and without a graph recorded."""
    q, k, v = qkv(4, 2, n, s, dtype=dtype)
    q[1, 3, n - 1, 5] = bad
    for grad in (False, True):
        out = attention(*(t.clone().requires_grad_(grad) for t in (q, k, v)), causal=True).out
        assert out[1, 3, n - 1].isnan().all()
        out[1, 3, n - 1] = 0
        assert out.isfinite().all()


def test_refusals_keep_their_messages():
    q, k, v = qkv(4, 2, 3, 5)
    with pytest.raises(ValueError, match=r"k must have shape \(B=2, Hkv, S, D=16\)"):
        attention(q, k[..., :8], v)
    with pytest.raises(ValueError, match="share a dtype"):
        attention(q, k.double(), v)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        attention(q, k, v, scale=float("inf"))
    with pytest.raises(ValueError, match="floating"):
        attention(q.long(), k.long(), v.long())


def test_second_order_gradients_are_exact_on_the_fast_path():
    q, k, v = (t.requires_grad_() for t in qkv(2, 1, 1, 6, d=3, dtype=torch.float64))
    assert plain_call(q, k, v, True, None, 0.0, False, "auto") is not None
    fn = lambda q, k, v: attention(q, k, v, causal=True).out  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (q, k, v))


def full_route(monkeypatch, *args, **kwargs):
    """`attention` with the short path turned off: the route every other call takes."""
    with monkeypatch.context() as m:
        m.setattr(attention_module, "plain_call", lambda *a: None)
        return attention(*args, **kwargs)


@pytest.mark.parametrize(
    ("h", "hkv", "n", "s", "causal", "scale"),
    [(4, 4, 1, 97, True, None), (4, 2, 1, 7, False, 0.3), (4, 4, 16, 16, True, None),
     (4, 1, 7, 7, False, 2), (4, 4, 64, 64, False, None)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("grad", [False, True])
def test_fast_path_equals_the_full_route_bit_for_bit(monkeypatch, h, hkv, n, s, causal, scale,
                                                     dtype, grad):  # fmt: skip
    """Same kernel, same scale (SDPA's default 1/sqrt(D) when none is given), same bits:
    outputs and the gradients of q, k and v."""
    q, k, v = qkv(h, hkv, n, s, d=24, dtype=dtype)
    if grad and dtype == torch.bfloat16 and not _choose.NATIVE_BF16:
        dtype = torch.float32  # auto takes chunked there (pinned by its own tests)
        q, k, v = (t.float() for t in (q, k, v))
    inputs = [[t.clone().requires_grad_(grad) for t in (q, k, v)] for _ in range(2)]
    assert plain_call(*inputs[0], causal, scale, 0.0, False, "auto") is not None
    fast = attention(*inputs[0], causal=causal, scale=scale).out
    full = full_route(monkeypatch, *inputs[1], causal=causal, scale=scale).out
    assert torch.equal(fast, full)
    if grad:
        dout = torch.randn(fast.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        fast.backward(dout)
        full.backward(dout)
        for a, b in zip(inputs[0], inputs[1], strict=True):
            assert torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("d", [2, 3, 24, 32, 64, 97])
def test_default_scale_is_sdpas_to_the_bit(d):
    """`default_scale` is the double SDPA computes (``D ** -0.5`` differs for D = 2, 3, 24,
    32...), so leaving SDPA its default and passing attention's scale agree in float64."""
    q, k, v = qkv(2, 2, 5, 9, d=d, dtype=torch.float64)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(sdpa(q, k, v), sdpa(q, k, v, scale=_fast_path.default_scale(d)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "s"), [(1, 1), (1, 128), (16, 16)])
def test_a_q_row_whose_every_score_is_minus_inf_is_nan(dtype, n, s, finite_route):
    """Why the fast path sums q (rule 1): q = +inf in one entry where every key is negative
    gives the row the score -inf for every key, and SDPA's CPU kernel returns 0 there, as for
    a row that sees nothing. attnkit returns NaN in that row only, with or without a graph."""
    q, k, v = qkv(4, 4, n, s, dtype=dtype)
    k[..., 0] = -k[..., 0].abs() - 0.1  # every key negative in entry 0
    q[1, 2, n - 1, 0] = float("inf")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert (sdpa(q, k, v)[1, 2, n - 1] == 0).all()  # the behaviour the check corrects
    for grad in (False, True):
        out = attention(*(t.clone().requires_grad_(grad) for t in (q, k, v))).out
        assert out[1, 2, n - 1].isnan().all()
        want = naive_attention(q.nan_to_num(posinf=0.0), k, v)[0].to(dtype)
        rows = torch.ones(out.shape[:3], dtype=torch.bool)
        rows[1, 2, n - 1] = False
        tol = 2e-5 if dtype == torch.float32 else 1e-10
        torch.testing.assert_close(out[rows].detach(), want[rows], atol=tol, rtol=tol)


def test_a_finite_row_whose_every_score_is_minus_inf_sees_nothing():
    """Rule 2 on the fast path: keys whose entry 0 is -inf give a row with q_0 > 0 the score
    -inf for every key: output 0, never NaN; rows with q_0 < 0 get +inf scores: NaN."""
    q, k, v = qkv(2, 2, 1, 6, dtype=torch.float64)
    q[..., 0] = torch.tensor([1.0, -1.0])[:, None, None]  # batch 0: > 0, batch 1: < 0
    k[..., 0] = -float("inf")
    assert plain_call(q, k, v, False, None, 0.0, False, "auto") is not None
    out = attention(q, k, v).out
    assert (out[0] == 0).all() and out[1].isnan().all()


def test_gradients_match_float64_truth_on_the_fast_path():
    q, k, v = (t.requires_grad_() for t in qkv(4, 2, 1, 33, d=16, dtype=torch.float64))
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn(2, 4, 1, 16, dtype=torch.float64)
    attention(q, k, v, causal=True).out.backward(dout)
    naive_attention(*ref, causal=True)[0].backward(dout)
    for got, want in zip((q, k, v), ref, strict=True):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-10, rtol=1e-10)


def test_k_or_v_on_another_device_is_refused_in_words():
    """SDPA's own check sends the call to the full route, whose ValueError names the devices."""
    q, k, v = qkv(2, 2, 3, 5)
    assert plain_call(q, k.to("meta"), v, False, None, 0.0, False, "auto") is None
    with pytest.raises(ValueError, match="must share a device"):
        attention(q, k.to("meta"), v)
