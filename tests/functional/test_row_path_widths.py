"""The compiled kernel's row path at every width it serves: rows four at a time stage by stage
(_native/forward.h's `forward_rows`, backward_block.h's `backward_rows`, a block's last one
to three rows a shorter group), each key's dK and dV rows added to once for the rows that see
it (`add_dk_dv`), the vector tails of rows narrower than a vector (simd.h's masked
`load_part` / `store_part`) and the prefetches of the next rows. Windows of 1 to 64 keys on
odd sizes, N != S, causal, GQA and rows that see nothing, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis.kernel_work import kernel_work
from attnkit.functional import native
from attnkit.functional._grid import offset_bands
from attnkit.functional.chunked import chunked_attention

pytestmark = pytest.mark.skipif(not native.available(), reason="no compiled kernel")

# keys a row sees -> the window: two-sided windows of 2w - 1 keys, 64 as a causal window
WIDTHS = {1: (1, False), 3: (2, False), 9: (5, False), 17: (9, False), 33: (17, False),
          64: (64, True)}  # fmt: skip
SIZES = [(1, 1), (7, 7), (97, 97), (300, 300), (97, 300), (300, 97), (7, 300)]


def _mask(n, s, keys, padded=True):
    w, causal = WIDTHS[keys]
    if not padded:
        return masks.window(n, w, s, causal=causal)
    pad = torch.ones(2, 1, 1, s, dtype=torch.bool)
    pad[1, ..., s // 2 :] = False  # batch row 1: the second half of the keys is padding
    return masks.window(n, w, s, causal=causal) & pad  # so its last rows see nothing


def _inputs(n, s, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64)  # 4 query heads on 2
    k = torch.randn(2, 2, s, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, s, 12, generator=g, dtype=torch.float64)  # Dv = 12: a vector tail
    return q, k, v


@pytest.mark.parametrize("n, s", SIZES, ids=str)
@pytest.mark.parametrize("keys", list(WIDTHS))
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_windows_of_every_width_against_float64(n, s, keys, causal):
    q, k, v = _inputs(n, s)
    mask = _mask(n, s, keys)
    dense = mask.dense() & masks.causal(n, s) if causal else mask.dense()  # (B, 1, N, S)
    ref = attnkit.attention(*(t.requires_grad_() for t in (q, k, v)), mask=dense,
                            backend="reference").out  # fmt: skip
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4).masked_fill(~dense, -torch.inf)
    ref_lse = torch.logsumexp(scores, -1)
    cot = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), cot)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, lse = chunked_attention(
        q32, k32, v32, mask=mask, bias=None, causal=causal, scale=0.25, dropout_p=0.0,
        training=False, kernel="native",
    )  # fmt: skip
    got = torch.autograd.grad(out, (q32, k32, v32), cot.float())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=2e-6)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
    blind = ~dense.expand(2, 4, n, s).any(-1)  # (B, H, N): rows that see nothing
    assert torch.all(out[blind] == 0) and torch.all(lse[blind] == -torch.inf)
    assert torch.all(got[0][blind] == 0)


@pytest.mark.parametrize("keys", [1, 9, 17, 33, 64])
def test_the_row_path_takes_these_windows_and_the_model_counts_them(keys):
    """The windows above do take the row path (the forward up to 64 keys a row, the backward
    up to 32, and from 33 to 64 its offset path on AVX-512 builds, which counts the same
    entries: all query blocks but at most the first and the last, whose key span is no wider
    than their rows), and `kernel_work` counts what the kernel counts."""
    n = s = 300
    mask = _mask(n, s, keys, padded=False)
    fwd, bwd = (kernel_work(mask, n=n, s=s, pass_=p) for p in ("forward", "backward"))
    assert fwd.blocks <= 2 and (bwd.blocks <= 2) == (keys <= 32 or offset_bands())
    q, k, v = (t.float().requires_grad_() for t in _inputs(n, s))
    with native.count_work() as forward:
        out = attnkit.attention(q, k, v, mask=mask, backend="chunked").out
    with native.count_work() as backward:
        out.sum().backward()
    model = [
        kernel_work(mask, n=n, s=s, pass_=p, batch=2, heads=4).computed
        for p in ("forward", "backward")
    ]
    assert model == [forward.item(), backward.item()]


@pytest.mark.parametrize("keys", [3, 9, 17])
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_dropout_and_lse_gradients_equal_the_pytorch_kernel(keys, causal):
    """Same seed, same dropped entries and the same gradients (through out and lse) on the
    row path as on the PyTorch kernel, with GQA and a block whose last rows are a group
    shorter than four (N = 97)."""
    n, s = 97, 120
    results = []
    for kernel in ("native", "torch"):
        q, k, v = (t.float().requires_grad_() for t in _inputs(n, s, seed=3))
        torch.manual_seed(11)
        out, lse = chunked_attention(
            q, k, v, mask=_mask(n, s, keys), bias=None, causal=causal, scale=0.25,
            dropout_p=0.3, training=True, kernel=kernel,
        )  # fmt: skip
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        finite = torch.where(torch.isfinite(lse), lse, 0.0)
        loss = (out * cot).sum() + (finite * torch.arange(n) / n).sum()
        results.append((out, lse, *torch.autograd.grad(loss, (q, k, v))))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_rows_with_disjoint_keys_in_one_group():
    """Four adjacent rows whose keys do not overlap, with gaps no row sees and an empty row
    between them: each key's dK and dV come from exactly the rows that see it."""
    n = s = 40
    lo = torch.tensor([(7 * i) % 33 for i in range(n)])
    hi = torch.where(torch.arange(n) % 4 == 2, lo, lo + 1 + torch.arange(n) % 5)
    mask = attnkit.functional.structured.RowIntervals(lo, hi, s)
    assert kernel_work(mask, n=n, s=s, pass_="backward").blocks == 0
    q, k, v = _inputs(n, s, seed=5)
    dense = mask.dense()
    ref = attnkit.attention(*(t.requires_grad_() for t in (q, k, v)), mask=dense,
                            backend="reference").out  # fmt: skip
    cot = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), cot)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q32, k32, v32, mask=mask, backend="chunked").out
    got = torch.autograd.grad(out, (q32, k32, v32), cot.float())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=2e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("n, s", [(97, 130), (130, 97), (1, 5)], ids=str)
@pytest.mark.parametrize("keys", [1, 9, 17, 33])
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
@pytest.mark.parametrize("d, dv", [(64, 64), (20, 12)], ids=str)
def test_plain_windows_against_float64(n, s, keys, causal, d, dv):
    """Windows with nothing else (plain scores: the narrow path, _native/narrow_path.h, up to 16
    or 32 keys), heads of whole vectors (D = Dv = 64) and with tails, N odd and != S, windows
    cut by the sequence's ends, GQA; N > S: rows that see nothing."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, s, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, s, dv, generator=g, dtype=torch.float64)
    mask = _mask(n, s, keys, padded=False)
    dense = mask.dense() & masks.causal(n, s) if causal else mask.dense()  # (N, S)
    ref = attnkit.attention(*(t.requires_grad_() for t in (q, k, v)), mask=dense,
                            backend="reference").out  # fmt: skip
    scale = d**-0.5
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * scale
    scores = scores.masked_fill(~dense, -torch.inf)
    cot = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), cot)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, lse = chunked_attention(
        q32, k32, v32, mask=mask, bias=None, causal=causal, scale=scale, dropout_p=0.0,
        training=False, kernel="native",
    )  # fmt: skip
    got = torch.autograd.grad(out, (q32, k32, v32), cot.float())
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1), rtol=0, atol=2e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5)
    blind = ~dense.expand(2, 4, n, s).any(-1)  # (B, H, N): rows that see nothing
    assert blind.any() == (n > s)  # windows aligned bottom-right, as causal: rows past S
    assert torch.all(out[blind] == 0) and torch.all(lse[blind] == -torch.inf)
