"""Score functions (`attnkit.score_mods`): every backend against a float64 reference of the same
function applied to the full score matrix, forward, lse and gradients (into closed-over tables
too), with masks, GQA, N != S and dropout; gradcheck / gradgradcheck; composition; errors."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit import score_mods as sm
from attnkit.functional import alibi_slopes, relative_position_bucket

F64 = torch.float64
B, H, HKV, N, S, D = 2, 4, 2, 37, 53, 8


def _naive(q, k, v, fn, mask=None, bias=None, causal=False):
    """softmax(mask(fn(scale·q·kᵀ) + bias))·v on the whole (B, H, N, S) matrix, float64."""
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ kk.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, N, S)
    b, h, n, m = s.shape
    idx = torch.arange
    s = fn(s, idx(b).view(b, 1, 1, 1), idx(h).view(1, h, 1, 1), idx(n).view(n, 1), idx(m))
    if bias is not None:
        s = s + bias
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)  # bottom-right
    if mask is not None:
        allowed = allowed & mask
    s = s.masked_fill(~allowed, float("-inf"))
    dead = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    lse = torch.logsumexp(s, -1)
    return p @ vv, lse


def _inputs(n=N, s=S, hkv=HKV, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, hkv, s, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, hkv, s, D + 3, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def _mods(dtype=F64):
    """name -> (score function, tensors it closes over that want gradients)."""
    t5 = torch.randn(32, H, dtype=dtype).requires_grad_()
    swin = torch.randn(15**2, H, dtype=dtype).requires_grad_()  # window 8: (2·8 - 1)²
    free = torch.randn(H, 9, dtype=dtype).requires_grad_()
    slopes = alibi_slopes(H, dtype=dtype)

    def user(score, b, h, q_idx, kv_idx):  # a closure over a learned table, Flex-style
        return score * torch.sigmoid(free[h, (kv_idx - q_idx).abs() % 9]) + (b == 1) * 0.25

    return {
        "softcap": (sm.softcap(1.5), []),
        "alibi": (sm.alibi(slopes), []),
        "alibi-symmetric-offset": (sm.alibi(slopes, offset=16, symmetric=True), []),
        "t5": (sm.relative_bias(t5, sm.t5_buckets(32, 20)), [t5]),
        "t5-causal": (sm.relative_bias(t5, sm.t5_buckets(32, 20, bidirectional=False)), [t5]),
        "swin": (sm.relative_bias(swin, sm.window_offsets(8)), [swin]),
        "user": (user, [free]),
        "alibi+softcap": (sm.alibi(slopes) + sm.softcap(2.0), []),
        "t5+softcap+alibi": (
            sm.compose(sm.relative_bias(t5, sm.t5_buckets()), sm.softcap(3.0), sm.alibi(slopes)),
            [t5],
        ),
    }


MODS = list(_mods())


def _check(got, want, params, atol=1e-10):
    (out, lse), (wout, wlse) = got, want
    torch.testing.assert_close(out, wout, atol=atol, rtol=1e-9)
    if lse is not None:
        torch.testing.assert_close(lse, wlse, atol=atol, rtol=1e-9)
    g_out = torch.randn_like(wout)
    gs = torch.autograd.grad((out * g_out).sum(), params, allow_unused=True)
    ws = torch.autograd.grad((wout * g_out).sum(), params, allow_unused=True)
    for a, w in zip(gs, ws, strict=True):
        torch.testing.assert_close(a, w, atol=atol, rtol=1e-9)


@pytest.mark.parametrize("name", MODS)
@pytest.mark.parametrize("backend", ["reference", "chunked", "fused"])
@pytest.mark.parametrize("case", ["plain", "causal", "dense-mask", "structured", "bias"])
def test_matches_float64_reference(name, backend, case):
    fn, tables = _mods()[name]
    if backend == "fused" and not getattr(fn, "additive", False):
        with pytest.raises(ValueError, match="additive"):
            attnkit.attention(*_inputs(), score_mod=fn, backend=backend)
        return
    q, k, v = _inputs()
    g = torch.Generator().manual_seed(1)
    kw, ref = {}, {}
    if case == "causal":
        kw["causal"] = ref["causal"] = True
    elif case == "dense-mask":
        dense = torch.rand(N, S, generator=g) > 0.4
        dense[3] = False  # a fully masked row: out 0, grad 0
        kw["mask"] = ref["mask"] = dense
    elif case == "structured":
        kw["mask"] = masks.window(N, 9, causal=True) if N == S else masks.prefix(N, 11, s=S)
        ref["mask"] = kw["mask"].dense()[0, 0]
    elif case == "bias":
        bias = torch.randn(N, S, generator=g, dtype=F64)
        bias[5, :7] = float("-inf")  # -inf in bias stays -inf after a soft cap
        kw["bias"] = ref["bias"] = bias
    r = attnkit.attention(q, k, v, score_mod=fn, backend=backend, **kw)
    want = _naive(q, k, v, fn, **ref)
    _check((r.out, r.lse), want, [q, k, v, *tables])


def test_mha_and_n_equal_one():
    """One query against a cache (N = 1 < S), MHA (Hkv = H): offset puts it last, as causal."""
    q, k, v = _inputs(n=1, s=40, hkv=H)
    slopes = alibi_slopes(H, dtype=F64)
    fn = sm.alibi(slopes, offset=39)
    for backend in ("reference", "chunked", "fused"):
        r = attnkit.attention(q, k, v, score_mod=fn, backend=backend, causal=True)
        want = attnkit.attention(
            q, k, v, bias=attnkit.alibi_bias(H, 1, 40, dtype=F64), causal=True, backend="reference"
        )
        torch.testing.assert_close(r.out, want.out)


def test_builtins_equal_dense_biases_of_the_modules():
    """alibi / t5 / swin indices equal attnkit's dense bias builders, entry by entry."""
    n, s = 9, 30
    slopes = alibi_slopes(H, dtype=F64)
    zero = torch.zeros(1, H, n, s, dtype=F64)
    ar = torch.arange
    idx = (ar(1).view(1, 1, 1, 1), ar(H).view(1, H, 1, 1), ar(n).view(n, 1), ar(s))
    for symmetric in (False, True):
        got = sm.alibi(slopes, offset=s - n, symmetric=symmetric)(zero, *idx)
        torch.testing.assert_close(got, attnkit.alibi_bias(H, n, s, symmetric=symmetric, dtype=F64))
    buckets = sm.t5_buckets(16, 12, bidirectional=False, offset=s - n)(idx[2], idx[3])
    want = relative_position_bucket(
        ar(s)[None] - ar(s - n, s)[:, None], num_buckets=16, max_distance=12, bidirectional=False
    )
    assert torch.equal(buckets, want)
    from attnkit.vision import relative_position_index

    m2 = 25
    got = sm.window_offsets(5)(ar(m2).view(m2, 1), ar(m2))
    assert torch.equal(got, relative_position_index(5))


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_dropout_same_stream_as_without(backend):
    """Training: the same entries are dropped with and without a score function (a score
    function that changes nothing gives the very same output)."""
    q, k, v = _inputs(n=20, s=33)
    for seed in (0, 1):
        torch.manual_seed(seed)
        want = attnkit.attention(q, k, v, dropout_p=0.3, training=True, backend=backend)
        torch.manual_seed(seed)
        got = attnkit.attention(
            q,
            k,
            v,
            dropout_p=0.3,
            training=True,
            backend=backend,
            score_mod=lambda s, b, h, qi, ki: s + 0.0 * qi,
        )
        torch.testing.assert_close(got.out, want.out)
    # and in eval mode dropout does nothing at all
    fn = sm.softcap(1.0)
    ev = attnkit.attention(q, k, v, dropout_p=0.3, training=False, score_mod=fn, backend=backend)
    torch.testing.assert_close(ev.out, _naive(q, k, v, fn)[0])


def test_dropout_gradients_chunked():
    """With dropout on, the checkpointed recomputation keeps the same entries: the gradient
    of the chunked path equals the reference one computed from the same kept entries."""
    q, k, v = _inputs(n=20, s=33)
    t5 = torch.randn(32, H, dtype=F64, requires_grad=True)
    fn = sm.relative_bias(t5, sm.t5_buckets()) + sm.softcap(2.0)
    torch.manual_seed(3)
    r = attnkit.attention(q, k, v, dropout_p=0.3, training=True, score_mod=fn, backend="chunked")
    grads = torch.autograd.grad(r.out.sum(), (q, k, v, t5))
    # the same seed drops the same entries: the same gradients, bit for bit
    torch.manual_seed(3)
    r2 = attnkit.attention(q, k, v, dropout_p=0.3, training=True, score_mod=fn, backend="chunked")
    grads2 = torch.autograd.grad(r2.out.sum(), (q, k, v, t5))
    for a, b in zip(grads, grads2, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)

    # finite differences through the dropped call (the draw is a function of the seed only)
    def f(q_, t_):
        torch.manual_seed(3)
        fn_ = sm.relative_bias(t_, sm.t5_buckets()) + sm.softcap(2.0)
        return attnkit.attention(
            q_, k, v, dropout_p=0.3, training=True, score_mod=fn_, backend="chunked"
        ).out

    qs = q.detach()[:1, :, :5].clone().requires_grad_()
    torch.autograd.gradcheck(
        lambda q_, t_: f(q_.expand(B, H, 5, D).contiguous(), t_), (qs, t5), atol=1e-7
    )


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_gradcheck_and_gradgradcheck(backend):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 5, 3, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(1, 1, 7, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(1, 1, 7, 2, generator=g, dtype=F64, requires_grad=True)
    table = torch.randn(8, 2, generator=g, dtype=F64, requires_grad=True)
    mask = torch.rand(5, 7, generator=g) > 0.3

    def f(q, k, v, table):
        fn = sm.relative_bias(table, sm.t5_buckets(8, 6)) + sm.softcap(1.3)
        r = attnkit.attention(q, k, v, score_mod=fn, mask=mask, backend=backend)
        return r.out, r.lse

    torch.autograd.gradcheck(f, (q, k, v, table))
    torch.autograd.gradgradcheck(lambda *a: f(*a)[0], (q, k, v, table))


def test_fully_masked_rows_are_zero_with_zero_gradient():
    q, k, v = _inputs(n=6, s=9)
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[2] = False
    for backend in ("reference", "chunked"):
        r = attnkit.attention(q, k, v, mask=mask, score_mod=sm.softcap(1.0), backend=backend)
        assert torch.equal(r.out[:, :, 2], torch.zeros_like(r.out[:, :, 2]))
        assert torch.isneginf(r.lse[:, :, 2]).all()
        (dq,) = torch.autograd.grad(r.out.sum() + r.lse[:, :, :2].sum(), q)
        assert torch.equal(dq[:, :, 2], torch.zeros_like(dq[:, :, 2]))


def test_composition_and_addition():
    slopes = alibi_slopes(H, dtype=F64)
    a, c = sm.alibi(slopes), sm.softcap(2.0)
    s = torch.randn(1, H, 4, 5, dtype=F64)
    ar = torch.arange
    idx = (ar(1).view(1, 1, 1, 1), ar(H).view(1, H, 1, 1), ar(4).view(4, 1), ar(5))
    torch.testing.assert_close((a + c)(s, *idx), c(a(s, *idx), *idx))
    torch.testing.assert_close(sm.compose(c, a)(s, *idx), a(c(s, *idx), *idx))
    assert (a + c).parts == (a, c) and sm.compose(a + c, a).parts == (a, c, a)
    assert (a + a).additive and not (a + c).additive
    user = lambda s, b, h, qi, ki: s * 2  # noqa: E731
    torch.testing.assert_close((a + user)(s, *idx), a(s, *idx) * 2)
    torch.testing.assert_close((user + a)(s, *idx), a(s * 2, *idx))


def test_errors_name_the_problem():
    q, k, v = _inputs(n=5, s=10)

    def per_element(score, b, h, q_idx, kv_idx):
        return score if q_idx > kv_idx else score * 2  # a Python `if` on a tensor

    for backend in ("reference", "chunked"):
        with pytest.raises(ValueError, match="vectorised"):
            attnkit.attention(q, k, v, score_mod=per_element, backend=backend)
        with pytest.raises(ValueError, match=r"vectorised.*shape"):
            attnkit.attention(
                q, k, v, score_mod=lambda s, *_: s[..., :1, :1, :2].squeeze(0), backend=backend
            )
        with pytest.raises(ValueError, match="float tensor"):
            attnkit.attention(q, k, v, score_mod=lambda s, *_: 1.0, backend=backend)
    with pytest.raises(ValueError, match="score_mod must be a function"):
        attnkit.attention(q, k, v, score_mod=3.0)
    with pytest.raises(ValueError, match="cap must be a finite number > 0"):
        sm.softcap(0)
    with pytest.raises(ValueError, match="slopes must be a float tensor of shape"):
        sm.alibi(torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"table has shape \(30, 4\); it must be \(32, H\)"):
        sm.relative_bias(torch.ones(30, 4), sm.t5_buckets())
    with pytest.raises(ValueError, match="window_size must be an integer >= 1"):
        sm.window_offsets(0)
    with pytest.raises(ValueError, match="at least one"):
        sm.compose()
    slopes = alibi_slopes(3)
    with pytest.raises(ValueError, match=r"slopes of shape \(3,\) has 3 heads, the call H=4"):
        attnkit.attention(q, k, v, score_mod=sm.alibi(slopes) + sm.softcap(1.0))
    table = torch.zeros(25, 4, dtype=F64)
    with pytest.raises(ValueError, match="one 3×3 window holds 9 tokens"):
        attnkit.attention(q, k, v, score_mod=sm.relative_bias(table, sm.window_offsets(3)))
