"""Chunked backend pinned to a naive float64 reference (values, lse and all gradients).

Legend: B batch, H heads, Hkv kv heads, N queries, S keys, D head width, Dv value width.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.functional._dropout import (
    NO_DROPOUT,
    draw_seed,
    dropout_keep_mask,
    keep_threshold,
    keep_words,
    row_ids,
)
from attnkit.functional.chunked import chunked_attention


def naive(q, k, v, *, mask=None, bias=None, causal=False, scale=1.0, keep=None, p=0.0):
    """Plain matmul + softmax in the inputs' dtype; empty rows -> out 0, lse -inf."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)  # (B, H, S, D|Dv)
    n, s_len = q.shape[2], k.shape[2]
    s = scale * q @ k.transpose(-1, -2)  # (B, H, N, S)
    if bias is not None:
        s = s + bias
    allowed = torch.ones(n, s_len, dtype=torch.bool)
    if causal:  # bottom-right: query i sees keys j <= i + S - N
        allowed = torch.arange(s_len)[None, :] <= torch.arange(n)[:, None] + s_len - n
    if mask is not None:
        allowed = allowed & mask
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(-1, keepdim=True).detach().nan_to_num(neginf=0.0)  # softmax is shift-invariant
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    l_safe = torch.where(l > 0, l, torch.ones_like(l))  # no 0 * inf in backward
    probs = e / l_safe
    lse = (l_safe.log() + m).masked_fill(l == 0, -math.inf).squeeze(-1)
    if keep is not None:
        _, inv = keep_threshold(p)
        probs = probs * keep * inv
    return probs @ v, lse


def run(q, k, v, **kw):
    kw = {"mask": None, "bias": None, "causal": False, "scale": 1.0, "dropout_p": 0.0,
          "training": False, **kw}  # fmt: skip
    return chunked_attention(q, k, v, **kw)


def make(b, h, hkv, n, s, d, dv, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=gen, dtype=dtype).requires_grad_()
    k = torch.randn(b, hkv, s, d, generator=gen, dtype=dtype).requires_grad_()
    v = torch.randn(b, hkv, s, dv, generator=gen, dtype=dtype).requires_grad_()
    return q, k, v


def grads(out, lse, inputs, seed=1):
    """Gradients of a random linear function of out and of lse's finite entries."""
    gen = torch.Generator().manual_seed(seed)
    # drawn in float64 and rounded: the same cotangents whatever the dtype (randn draws other
    # numbers for float32 than for float64 from one seed), so that float32 and float64 runs
    # compare
    go = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)
    gl = torch.randn(lse.shape, generator=gen, dtype=torch.float64).to(lse.dtype)
    loss = (out * go).sum() + (lse.nan_to_num(neginf=0.0) * gl).sum()
    return torch.autograd.grad(loss, [x for x in inputs if x.requires_grad])


def check(q, k, v, atol=1e-10, **kw):
    """Chunked vs naive, both float64: out, lse (incl. -inf pattern) and every gradient."""
    ref_kw = {x: kw[x] for x in ("mask", "bias", "causal", "scale") if x in kw}
    out, lse = run(q, k, v, **kw)
    rout, rlse = naive(q, k, v, **ref_kw)
    assert out.shape == rout.shape and out.dtype == q.dtype and lse.dtype == torch.float64
    torch.testing.assert_close(out, rout, atol=atol, rtol=0)
    assert torch.equal(lse.isneginf(), rlse.isneginf())
    torch.testing.assert_close(lse.nan_to_num(neginf=0.0), rlse.nan_to_num(neginf=0.0))
    inputs = [q, k, v] + ([kw["bias"]] if kw.get("bias") is not None else [])
    for a, b in zip(grads(out, lse, inputs), grads(rout, rlse, inputs), strict=True):
        assert a.shape == b.shape and torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=atol, rtol=0)
    return out, lse


SIZES = [(1, 1), (7, 7), (1, 97), (97, 7), (97, 257), (257, 97), (257, 257), (1025, 97), (7, 1025)]


@pytest.mark.parametrize(("n", "s"), SIZES)
@pytest.mark.parametrize("causal", [False, True])
def test_sizes_causal(n, s, causal):
    q, k, v = make(1, 2, 2, n, s, 32, 24)
    check(q, k, v, causal=causal, scale=0.3, block_q=64, block_k=96)


@pytest.mark.parametrize(("d", "dv"), [(8, 8), (32, 32), (64, 16), (80, 80), (80, 64)])
def test_head_widths(d, dv):
    q, k, v = make(2, 2, 2, 97, 257, d, dv)
    check(q, k, v, scale=d**-0.5)


def test_large_default_blocks():
    q, k, v = make(1, 2, 2, 1025, 1025, 64, 64)
    check(q, k, v, scale=0.125, causal=True)


@pytest.mark.parametrize("hkv", [2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(hkv, causal):
    q, k, v = make(2, 8, hkv, 97, 130, 16, 8)
    mask = torch.rand(2, 8, 97, 130, generator=torch.Generator().manual_seed(3)) > 0.3
    bias = torch.randn(1, 8, 97, 130, dtype=torch.float64).requires_grad_()
    check(q, k, v, causal=causal, mask=mask, bias=bias, scale=0.25, block_q=40, block_k=64)


@pytest.mark.parametrize("mshape", [(97, 130), (2, 1, 1, 130), (2, 4, 97, 130), (97, 1)])
def test_mask_shapes(mshape):
    q, k, v = make(2, 4, 2, 97, 130, 16, 16)
    mask = torch.rand(mshape, generator=torch.Generator().manual_seed(5)) > 0.4
    check(q, k, v, mask=mask, block_q=32, block_k=50)


@pytest.mark.parametrize("bshape", [(97, 130), (2, 1, 1, 130), (1, 4, 97, 130), (4, 97, 1), (1,)])
def test_bias_broadcast_grad(bshape):
    q, k, v = make(2, 4, 2, 97, 130, 16, 16)
    bias = torch.randn(bshape, dtype=torch.float64).requires_grad_()
    check(q, k, v, bias=bias, causal=True, block_q=32, block_k=50)


def test_fully_masked_rows_zero_and_finite():
    q, k, v = make(2, 4, 2, 33, 40, 16, 16)
    mask = torch.rand(2, 1, 33, 40, generator=torch.Generator().manual_seed(7)) > 0.5
    mask[0, :, 3] = False  # a row masked by the boolean mask
    bias = torch.randn(2, 4, 33, 40, dtype=torch.float64)
    bias[1, 2, 5] = -math.inf  # a row masked by the bias alone
    bias = bias.requires_grad_()
    check(q, k, v, mask=mask, bias=bias, block_q=8, block_k=16)
    out, lse = run(q, k, v, mask=mask, bias=bias, block_q=8, block_k=16)
    assert (out[0, :, 3] == 0).all() and (out[1, 2, 5] == 0).all()
    assert lse[0, :, 3].isneginf().all() and lse[1, 2, 5].isneginf()
    dq, dk, dv, db = torch.autograd.grad(out.sum(), [q, k, v, bias])
    assert (dq[0, :, 3] == 0).all() and (dq[1, 2, 5] == 0).all()
    assert (db[0, :, 3] == 0).all() and (db[1, 2, 5] == 0).all()
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv, db))


def test_everything_masked():
    q, k, v = make(1, 2, 1, 5, 6, 8, 8)
    out, lse = run(q, k, v, mask=torch.zeros(5, 6, dtype=torch.bool))
    assert (out == 0).all() and lse.isneginf().all()
    assert all((g == 0).all() for g in torch.autograd.grad(out.sum(), [q, k, v]))


def test_causal_n_greater_than_s_leading_rows_empty():
    q, k, v = make(1, 2, 2, 20, 8, 8, 8)
    out, lse = check(q, k, v, causal=True, block_q=6, block_k=3)
    assert (out[:, :, :12] == 0).all() and lse[:, :, :12].isneginf().all()
    assert torch.isfinite(lse[:, :, 12:]).all()


def test_causal_ignores_future_keys():
    q, k, v = make(1, 2, 2, 50, 70, 16, 16)
    out, _ = run(q, k, v, causal=True, block_q=16, block_k=16)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 60:] += 5.0  # keys j > i + 20 are invisible to rows i < 40
    v2[:, :, 60:] -= 3.0
    out2, _ = run(q, k2, v2, causal=True, block_q=16, block_k=16)
    torch.testing.assert_close(out[:, :, :40], out2[:, :, :40], atol=0, rtol=0)
    assert not torch.allclose(out[:, :, 40:], out2[:, :, 40:])


@pytest.mark.parametrize(("bq", "bk"), [(1, 1), (5, 3), (31, 200), (1000, 7)])
def test_odd_block_sizes(bq, bk):
    q, k, v = make(1, 2, 1, 37, 45, 8, 8)
    mask = torch.rand(37, 45, generator=torch.Generator().manual_seed(9)) > 0.2
    check(q, k, v, mask=mask, causal=True, block_q=bq, block_k=bk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_within_twice_naive_error(dtype):
    """flash-attention's rule: error vs float64 at most 2× that of naive attention in dtype."""
    q, k, v = make(2, 4, 2, 257, 300, 64, 64, dtype=dtype)
    bias = (0.5 * torch.randn(1, 4, 257, 300)).to(dtype).requires_grad_()
    mask = torch.rand(2, 1, 1, 300, generator=torch.Generator().manual_seed(2)) > 0.1
    kw = {"mask": mask, "bias": bias, "causal": True, "scale": 0.125}
    out, lse = run(q, k, v, block_q=64, block_k=128, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32
    low = naive(q, k, v, **kw)
    hi_in = [x.detach().double().requires_grad_() for x in (q, k, v, bias)]
    hi = naive(*hi_in[:3], mask=mask, bias=hi_in[3], causal=True, scale=0.125)
    assert (out.double() - hi[0]).abs().max() <= 2 * (low[0].double() - hi[0]).abs().max() + 1e-6
    assert (lse.double() - hi[1]).nan_to_num().abs().max() < 1e-2
    ours = grads(out, lse.to(dtype), [q, k, v, bias])
    lows = grads(*low, [q, k, v, bias])
    his = grads(*hi, hi_in)
    for a, b, c in zip(ours, lows, his, strict=True):
        assert a.dtype == dtype
        assert (a.double() - c).abs().max() <= 2 * (b.double() - c).abs().max() + 1e-5


def test_gradcheck_float64():
    q, k, v = make(1, 2, 1, 6, 9, 4, 3)
    mask = torch.rand(1, 1, 6, 9, generator=torch.Generator().manual_seed(4)) > 0.3
    mask[0, 0, 2] = False
    bias = torch.randn(2, 6, 1, dtype=torch.float64).requires_grad_()

    def f(q, k, v, bias):
        out, lse = run(q, k, v, mask=mask, bias=bias, causal=True, scale=0.7, block_q=4, block_k=4)
        return out, lse.masked_fill(lse.isneginf(), 0.0)  # finite differences of -inf are NaN

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


def test_gradcheck_dropout_fixed_seed():
    q, k, v = make(1, 2, 2, 5, 7, 4, 4)

    def f(q, k, v):
        torch.manual_seed(11)  # the call draws its dropout seed from the default generator
        return run(q, k, v, dropout_p=0.3, training=True, block_q=2, block_k=3)

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_keep_threshold_exact():
    assert keep_threshold(0.1) == (3865470566, 2**32 / 3865470566)
    assert keep_threshold(0.001) == (4290672329, 2**32 / 4290672329)  # one byte kept all
    assert keep_threshold(0.0) == (NO_DROPOUT, 1.0)
    assert keep_threshold(1.0) == (0, 0.0)
    for p in (1e-12, 0.001, 0.01, 0.1, 0.25, 0.5, 0.9, 0.999, 1 - 1e-12):
        t, inv = keep_threshold(p)
        assert 1 <= t <= 2**32 - 1 and inv == 2**32 / t  # never all kept, never all dropped
        bound = 2**-32 if p < 1e-9 or p > 1 - 1e-9 else 2**-33  # 2^-32: clamped ends
        assert abs(t / 2**32 - (1 - p)) <= bound


@pytest.mark.parametrize("p", [0.001, 0.1, 0.5])
def test_keep_rate(p):
    keep = dropout_keep_mask(123, (2, 4, 300, 500), p)
    rate, expect = keep.double().mean().item(), keep_threshold(p)[0] / 2**32
    assert abs(rate - expect) < 5 * math.sqrt(expect * (1 - expect) / keep.numel())
    # neither rows, heads nor key ranges repeat the same bits
    assert not torch.equal(keep[:, :, :64, :128], keep[:, :, 64:128, :128])
    assert not torch.equal(keep[:, :, :64, :128], keep[:, :, :64, 128:256])
    assert not torch.equal(keep[:, 0], keep[:, 1]) and not torch.equal(keep[0], keep[1])
    assert not torch.equal(dropout_keep_mask(124, (2, 4, 300, 500), p), keep)


def chi_square_uniform(values, bins):
    """Chi-square statistic of integer values in 0..bins-1 against the uniform law."""
    counts = torch.bincount(values.flatten(), minlength=bins).double()
    expect = values.numel() / bins
    return ((counts - expect) ** 2 / expect).sum().item()


def test_keep_words_uniform_and_independent_of_blocking():
    rows = row_ids(2, 3, 50, 0, 50)  # (B·H·N,)
    whole = keep_words(7, rows, 0, 203)  # (300, 203) in 0..2^32-1
    assert whole.min() >= 0 and whole.max() < 2**32
    # top and bottom bytes of the words (the top byte decides p <= 1/256 on its own; the
    # bottom one is what the threshold's last bits read): chi-square, df 255, sd ~22.6
    limit = 255 + 6 * math.sqrt(2 * 255)
    assert chi_square_uniform(whole >> 24, 256) < limit
    assert chi_square_uniform(whole & 0xFF, 256) < limit
    # each of the 32 bits is set half the time (60900 words: sd of a frequency 0.002)
    bits = (whole.unsqueeze(-1) >> torch.arange(32)) & 1  # (300, 203, 32)
    freq = bits.double().mean((0, 1))
    assert ((freq - 0.5).abs() < 5 * 0.5 / math.sqrt(whole.numel())).all()
    # neighbouring keys of a row, and the same key of neighbouring rows, are not correlated
    for a, b in ((whole[:, :-1], whole[:, 1:]), (whole[:-1], whole[1:])):
        corr = torch.corrcoef(torch.stack([a.double().flatten(), b.double().flatten()]))[0, 1]
        assert abs(corr) < 5 / math.sqrt(a.numel())
    # within a row the words are a bijection of the key index: no repeats
    assert all(row.unique().numel() == row.numel() for row in whole)
    # any key range of any row set regenerates the same words (forward and backward blocks)
    for j0, nk in ((0, 1), (1, 1), (5, 11), (8, 64), (101, 102), (200, 3), (202, 1)):
        part = keep_words(7, rows[17:40], j0, nk)
        assert torch.equal(part, whole[17:40, j0 : j0 + nk])


def test_dropout_matches_same_keep_mask_and_grads():
    q, k, v = make(2, 4, 2, 37, 53, 8, 8)
    bias = torch.randn(4, 37, 53, dtype=torch.float64).requires_grad_()
    torch.manual_seed(2024)
    keep = dropout_keep_mask(draw_seed(), (2, 4, 37, 53), 0.2)
    torch.manual_seed(2024)
    kw = {"bias": bias, "causal": True, "scale": 0.5}
    out, lse = run(q, k, v, dropout_p=0.2, training=True, block_q=16, block_k=24, **kw)
    rout, rlse = naive(q, k, v, keep=keep, p=0.2, **kw)
    torch.testing.assert_close(out, rout, atol=1e-10, rtol=0)
    torch.testing.assert_close(lse, rlse, atol=1e-10, rtol=0)  # lse ignores dropout
    inputs = [q, k, v, bias]
    for a, b in zip(grads(out, lse, inputs), grads(rout, rlse, inputs), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_dropout_seed_and_training_flag():
    q, k, v = make(1, 2, 2, 30, 30, 8, 8)
    torch.manual_seed(1)
    a, _ = run(q, k, v, dropout_p=0.5, training=True)
    torch.manual_seed(1)
    b, _ = run(q, k, v, dropout_p=0.5, training=True)
    c, _ = run(q, k, v, dropout_p=0.5, training=True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    e, _ = run(q, k, v, dropout_p=0.5, training=False)
    torch.testing.assert_close(e, naive(q, k, v)[0])


def test_dropout_unbiased():
    q, k, v = make(1, 2, 2, 16, 24, 8, 8, seed=3)
    ref = naive(q, k, v)[0].detach()
    torch.manual_seed(0)
    with torch.no_grad():
        outs = torch.stack([run(q, k, v, dropout_p=0.3, training=True)[0] for _ in range(2000)])
    z = (outs.mean(0) - ref) / (outs.std(0) / math.sqrt(outs.shape[0]))  # ~ N(0, 1) each
    assert (z.abs() < 5).all()
    # mean z^2 ~ 1 (sd sqrt(2 / 256) = 0.09): a missing 1/keep rescale, off by ~0.3 * |out|,
    # gives ~20; a bound on |err| alone is either loose or flaky (stderr reaches 0.035 here)
    assert (z**2).mean() < 1 + 6 * math.sqrt(2 / z.numel())


def test_backward_leaves_incoming_gradient_untouched():
    q, k, v = make(1, 2, 2, 9, 11, 4, 4)
    out, _ = run(q, k, v, dropout_p=0.5, training=True)
    go = torch.ones_like(out)
    out.backward(go)
    assert (go == 1).all()
