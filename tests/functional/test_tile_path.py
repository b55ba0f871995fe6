"""The compiled kernel's forward tile path (_native/tile_path.h): blocks whose tiles of 8 rows
each span at most 32 keys and that the row path does not take (short documents, a strided
mask's short interleaved sequences, calls of at most 32 keys) get each tile's scores as one
register-blocked product over the union of its rows' keys. Against the float64 reference at
head widths that are not multiples of the packing (8, 40, 80), odd sizes, GQA, causal, rows
that see nothing, non-finite q, k and v, and every feature that leaves the lane-by-lane softmax
(bias, dense masks, score functions, dropout); and the work the kernel counts there."""

from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

import attnkit
from attnkit import masks, score_mods
from attnkit.analysis.kernel_work import TILE_KEYS, TILE_ROWS, kernel_work
from attnkit.functional import native
from attnkit.functional.chunked import chunked_attention

# the module (attnkit.analysis's `kernel_work` is the function)
kernel_work_module = importlib.import_module("attnkit.analysis.kernel_work")

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")


def _inputs(n, s, d=16, dv=12, seed=0, hkv=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n, d, generator=g, dtype=torch.float64)  # 4 query heads on hkv
    k = torch.randn(2, hkv, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, s, dv, generator=g, dtype=torch.float64)
    return q, k, v


def _documents(n, length, causal=False):
    """Documents of `length` tokens (the last one shorter)."""
    return masks.document(torch.arange(n) // length, causal=causal)


def _check(q, k, v, mask=None, causal=False, atol=2e-6, **kw):
    """out, lse and the gradients of a float32 chunked call against the float64 reference."""
    ref = attnkit.attention(*(t.requires_grad_() for t in (q, k, v)), mask=mask, causal=causal,
                            backend="reference", **kw)  # fmt: skip
    cot = torch.randn_like(ref.out)
    want = torch.autograd.grad(ref.out, (q, k, v), cot)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = attnkit.attention(q32, k32, v32, mask=mask, causal=causal, backend="chunked", **kw)
    grads = torch.autograd.grad(got.out, (q32, k32, v32), cot.float())
    torch.testing.assert_close(got.out.double(), ref.out.detach(), rtol=0, atol=atol)
    seen = torch.isfinite(ref.lse)
    torch.testing.assert_close(got.lse.double()[seen], ref.lse.detach()[seen], rtol=0, atol=atol)
    assert torch.all(got.lse[~seen] == -torch.inf) and torch.all(got.out[~seen] == 0)
    for a, b in zip(grads, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=10 * atol)
    return got


def _takes_tiles(mask, n, s, causal=False, pass_="forward"):
    """Whether the pass (as `kernel_work` walks it) puts some query block on the tile path
    (a last block of fewer than TILE_ROWS rows goes the block path)."""
    taken = []

    def path(*args):
        taken.append(real(*args))
        return taken[-1]

    real = kernel_work_module._path
    with mock.patch.object(kernel_work_module, "_path", path):
        kernel_work(mask, n=n, s=s, causal=causal, pass_=pass_)
    return any(t is not None and t[0] == "tiles" for t in taken)


@pytest.mark.parametrize("d", [8, 40, 64, 80, 128])
@pytest.mark.parametrize("length", [1, 2, 8, 9, 16, 32])
def test_documents_against_float64(length, d):
    """Documents of 8, 16, 32 tokens: tiles of whole documents; of 9: tiles where a block's
    tiles compute at most 5/4 of its entries, the row path elsewhere; of 1 and 2: the row path;
    the last block, one row, the block path."""
    n = 97  # the last document and the last tile shorter
    mask = _documents(n, length)
    assert _takes_tiles(mask, n, n) == (length >= 8)
    _check(*_inputs(n, n, d=d, dv=d + 4), mask=mask)


SHORT = [(1, 1), (7, 7), (8, 8), (17, 17), (32, 32), (5, 29), (8, 29), (29, 5)]


@pytest.mark.parametrize("n, s", SHORT, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_short_calls_and_narrow_windows(n, s, causal):
    """Calls of at most 32 keys and 8 queries or more (fewer: the block path), unmasked, causal
    (bottom-right: with N > S the first rows see nothing) and windows of 1, 2, 9 and 17 keys
    whose block spans no more than its widest row."""
    assert _takes_tiles(None, n, s, causal) == (n >= TILE_ROWS)
    _check(*_inputs(n, s), causal=causal)
    for w in (1, 2, 5, 9):  # two-sided: 1, 3, 9, 17 keys
        _check(*_inputs(n, s, seed=w), mask=masks.window(n, w, s), causal=causal)
    _check(*_inputs(n, s, seed=3), mask=masks.window(n, 2, s, causal=True))  # 2 keys


@pytest.mark.parametrize("n, stride", [(96, 6), (1024, 64), (64, 4)], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_strided_masks_interleaved_sequences(n, stride, causal):
    """A strided mask whose stride divides N: `stride` interleaved sequences (Args::groups) of
    N / stride tokens, at most 32: each sequence's tiles."""
    mask = masks.strided(n, stride, causal=causal)
    assert _takes_tiles(mask, n, n)
    _check(*_inputs(n, n, d=64, dv=64), mask=mask)


def test_rows_that_see_nothing_and_padding():
    n = 97
    mask = _documents(n, 16) & masks.padding(torch.tensor([n - 20, 50]), n)
    _check(*_inputs(n, n), mask=mask)


# What takes a tile's scores out of its lanes, through the row path's stages (both passes):
# a bias, score functions, a dense mask (`with_feature` builds the call's arguments).
LANE_FEATURES = pytest.mark.parametrize(
    "kw",
    [
        {"bias": "bias"},
        {"score_mod": score_mods.softcap(2.0)},
        {"score_mod": score_mods.alibi(torch.tensor([0.5, 0.25, 0.125, 0.0625]))},
        {"dense": True},
    ],
    ids=["bias", "softcap", "alibi", "dense mask"],
)


def with_feature(kw: dict, n: int, empty_row: bool = False) -> tuple:
    """(mask, keyword arguments) of a call on documents of 16 tokens with `kw` (a
    LANE_FEATURES case) made real: a (1, 4, n, n) bias, or the documents & a random dense
    mask (with `empty_row`, query 3 of batch row 0 seeing nothing)."""
    kw, mask = dict(kw), _documents(n, 16)
    if kw.pop("bias", None):
        kw["bias"] = torch.randn(1, 4, n, n, dtype=torch.float64)
    if kw.pop("dense", None):
        keep = torch.rand(2, 1, n, n, generator=torch.Generator().manual_seed(2)) < 0.7
        if empty_row:
            keep[0, :, 3] = False
        mask = mask & keep
    return mask, kw


@LANE_FEATURES
def test_features_that_leave_the_lane_softmax(kw):
    """Bias, score functions and dense masks: the tile's scores copied to rows, the row path's
    softmax."""
    n = 77
    q, k, v = _inputs(n, n)
    mask, kw = with_feature(kw, n)
    _check(q, k, v, mask=mask, **kw)


def test_dropout_drops_the_entries_of_the_pytorch_kernel():
    """Both passes' tiles with dropout (each lane through the row path's stages): out, lse and
    the gradients equal the PyTorch kernel's."""
    n = 90
    results = []
    for kernel in ("native", "torch"):
        q, k, v = (t.float().requires_grad_() for t in _inputs(n, n, seed=4))
        torch.manual_seed(7)
        out, lse = chunked_attention(
            q, k, v, mask=_documents(n, 16), bias=None, causal=False, scale=0.25,
            dropout_p=0.4, training=True, kernel=kernel,
        )  # fmt: skip
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append((out, lse, *torch.autograd.grad((out * cot).sum(), (q, k, v))))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_q_or_k_row_reaches_only_the_rows_that_read_it(where, bad):
    """A tile's rows are lanes of one product: a NaN or inf in one query row (or key row) acts
    on that row (the rows that see that key) as in the float64 reference (NaN, or an inf score
    of +inf: NaN, -inf: the key hidden) and leaves every other row's bits alone."""
    n = 64
    q, k, v = (t.float() for t in _inputs(n, n, d=64, dv=64))
    mask = _documents(n, 16)
    clean = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    t = {"q": q, "k": k}[where].clone()
    t[0, 1, 20, 3] = bad
    args = (t, k) if where == "q" else (q, t)
    got = attnkit.attention(*args, v, mask=mask, backend="chunked").out
    hit = torch.zeros(2, 4, n, dtype=torch.bool)
    if where == "q":
        hit[0, 1, 20] = True
    else:
        hit[0, 2:4, 16:32] = True  # kv head 1 serves query heads 2, 3; document 16..31
    want = attnkit.attention(*(x.double() for x in args), v.double(), mask=mask,
                             backend="reference").out[hit]  # fmt: skip
    assert want.isnan().any()
    torch.testing.assert_close(got[hit].double(), want, rtol=0, atol=2e-6, equal_nan=True)
    assert torch.equal(got[~hit], clean[~hit])


@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_a_non_finite_value_row_reaches_only_the_rows_that_see_its_key(causal):
    """A tile's rows share one score product, but a row never reads the value row of a key it
    does not see: an inf in value row 20 reaches the rows of its document that see key 20
    (all 16, or 20..31 when causal: rows of different spans in one tile) as in the float64
    reference, and no other row's bits."""
    n = 64
    q, k, v = (t.float() for t in _inputs(n, n, d=64, dv=72))
    mask = _documents(n, 16, causal=causal)
    clean = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    bad = v.clone()
    bad[0, 1, 20, 3] = float("inf")
    got = attnkit.attention(q, k, bad, mask=mask, backend="chunked").out
    hit = torch.zeros(2, 4, n, dtype=torch.bool)
    hit[0, 2:4, 20 if causal else 16 : 32] = True  # kv head 1 serves query heads 2, 3
    want = attnkit.attention(q.double(), k.double(), bad.double(), mask=mask,
                             backend="reference").out[hit]  # fmt: skip
    assert want[:, 3].isinf().all()
    torch.testing.assert_close(got[hit].double(), want, rtol=0, atol=2e-6, equal_nan=True)
    assert torch.equal(got[~hit], clean[~hit])


@pytest.mark.parametrize("n", [97, 1025])
def test_the_model_counts_the_tiles(n):
    """`kernel_work` counts what the kernel does: each tile's rows x the union of their keys."""
    cases = {"documents": (_documents(n, 16), False), "none": (None, True)}
    if n == 97:
        cases["short"] = (masks.window(n, 3) & masks.document(torch.arange(n) // 12), False)
    for name, (mask, causal) in cases.items():
        m = n if mask is not None or n <= TILE_KEYS else TILE_KEYS  # a short call
        q, k, v = (t.float() for t in _inputs(m, m))
        with native.count_work() as counted:
            attnkit.attention(q, k, v, mask=mask, causal=causal, backend="chunked")
        want = kernel_work(mask, n=m, s=m, causal=causal, batch=2, heads=4).computed
        assert counted.item() == want, name
    docs = kernel_work(_documents(n, 16), batch=1, heads=1)
    tiles = range(0, n - n % 16, TILE_ROWS)  # the last block, one row: the block path
    assert docs.blocks == 1 and docs.computed == TILE_ROWS * 16 * len(tiles) + (n % 16) ** 2
