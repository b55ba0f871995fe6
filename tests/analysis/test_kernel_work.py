"""`kernel_work` equals the counter on the compiled kernel: fwd and bwd, every mask kind."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.analysis import kernel_work, mha_cost
from attnkit.analysis.kernel_work import PASSES, TILE_KEYS, TILE_ROWS
from attnkit.functional import native
from attnkit.functional._grid import _TILE_GRIDS, offset_bands

needs_kernel = pytest.mark.skipif(
    not native.available(), reason="the compiled kernel could not be built here"
)


def _kinds(n: int, s: int) -> dict:
    """Masks of every kind for N queries and S keys (document masks need N == S)."""
    kinds = {
        "none": None,
        "window": masks.window(n, 9, s),
        "window-causal": masks.window(n, 200, s, causal=True),
        "prefix": masks.prefix(n, min(s, 37), s),
        "function": masks.from_function(lambda b, h, q, k: ((q - k) % 5 == 0) | (k < 2), n, s),
        "function-heads": masks.from_function(lambda b, h, q, k: k <= q + 7 * h, n, s, heads=4),
        "union": masks.window(n, 12, s, causal=True) | masks.prefix(n, 20, s),
    }
    if n == s:
        ids = masks.document_ids([n // 4, n // 2, n - n // 4 - n // 2])
        kinds |= {
            "document": masks.document(ids),
            "document-causal": masks.document(ids, causal=True),
            "document-batch": masks.document(torch.stack([ids, masks.document_ids([n])])),
            "document-scattered": masks.document(torch.arange(n) % 3),
            "prefix-rows": masks.prefix(n, torch.tensor([0, n // 2])),
            "with-padding": masks.document(ids, causal=True)
            & masks.padding(torch.tensor([max(n - 9, 0), n]), n),
            # reordered: the gathered tokens' tiles or runs, or interleaved sequences read in
            # place where the dilation or stride divides N
            "dilated": masks.dilated_window(n, 5, 3),
            "strided": masks.strided(n, 5, causal=True),
            "natten": masks.neighborhood_2d(*_canvas(n)),
        }
    return kinds


def _canvas(n: int) -> tuple[int, int, tuple[int, int]]:
    """A height x width canvas of n tokens (the largest height <= sqrt(n) dividing n) and a
    neighbourhood that fits it, odd and non-square where it can be."""
    height = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
    width = n // height
    return height, width, (min(5, height - (height + 1) % 2), min(7, width - (width + 1) % 2))


def _counted(mask, causal, b, h, hkv, n, s):
    """(forward, backward) score entries the kernel counts for one call and its gradient."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, n, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(b, hkv, s, 8, generator=g, requires_grad=True) for _ in range(2))
    with native.count_work() as forward:
        out = attnkit.attention(q, k, v, mask=mask, causal=causal, backend="chunked").out
    with native.count_work() as backward:
        out.sum().backward()
    return forward.item(), backward.item()


SIZES = [(1, 1), (7, 7), (97, 97), (300, 300), (1025, 1025), (130, 700), (700, 130)]


@needs_kernel
@pytest.mark.parametrize("n,s", SIZES, ids=lambda x: str(x))
@pytest.mark.parametrize("causal", [False, True], ids=["", "causal"])
def test_model_equals_the_kernel_counter(n, s, causal):
    """The walk with the kernel's blocks == `native.count_work()`, forward and backward apart,
    for every mask kind, odd sizes, N != S, a batch of 2 and GQA (4 query heads, 2 kv heads)."""
    for name, mask in _kinds(n, s).items():
        b, h = 2, 4
        want = _counted(mask, causal, b, h, 2, n, s)
        got = tuple(
            kernel_work(mask, n=n, s=s, causal=causal, pass_=p, batch=b, heads=h).computed
            for p in ("forward", "backward")
        )
        assert got == want, f"{name} at N={n}, S={s}, causal={causal}: {got} != kernel {want}"


@needs_kernel
def test_bias_and_dropout_change_no_block():
    n, mask = 333, masks.document(masks.document_ids([100, 33, 200]), causal=True)
    q, k, v = (torch.randn(2, 4, n, 8, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 4, n, n)
    with native.count_work() as counted:
        out = attnkit.attention(
            q, k, v, mask=mask, bias=bias, dropout_p=0.3, training=True, backend="chunked"
        ).out
        out.sum().backward()
    work = [kernel_work(mask, pass_=p, batch=2, heads=4).computed for p in PASSES]
    assert counted.item() == sum(work)


@needs_kernel
def test_a_bias_keeps_a_band_off_the_offset_path():
    """A band of 47 keys: a plain backward takes the offset path (each row's own keys) on
    AVX-512 builds, one with a bias the blocks (`kernel_work(plain=False)`)."""
    n, mask = 300, masks.window(300, 24)
    q, k, v = (torch.randn(1, 2, n, 8, requires_grad=True) for _ in range(3))
    counts = []
    for bias in (None, torch.randn(1, 2, n, n)):
        out = attnkit.attention(q, k, v, mask=mask, bias=bias, backend="chunked").out
        with native.count_work() as counted:
            out.sum().backward()
        counts.append(counted.item())
    plain, biased = (kernel_work(mask, pass_="backward", heads=2, plain=p) for p in (True, False))
    assert counts == [plain.computed, biased.computed]
    assert (plain.computed < biased.computed) == offset_bands()


@needs_kernel
def test_a_bias_keeps_rows_of_several_runs_off_the_forward_offset_path():
    """Rows of three runs (a 3 x 3 neighbourhood on a 15 x 20 image, in token order): a plain
    forward takes the offset path, one with a bias the blocks, and `kernel_work(plain=...)`
    says which."""
    n, mask = 300, masks.neighborhood_2d(15, 20, 3).natural
    q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
    counts = []
    for bias in (None, torch.randn(1, 2, n, n)):
        with torch.no_grad(), native.count_work() as counted:
            attnkit.attention(q, k, v, mask=mask, bias=bias, backend="chunked")
        counts.append(counted.item())
    plain, biased = (kernel_work(mask, heads=2, plain=p) for p in (True, False))
    assert counts == [plain.computed, biased.computed]
    assert plain.computed < biased.computed


@needs_kernel
def test_one_head_of_one_row_and_the_block_counts():
    n = 1000
    mask = masks.window(n, 256, causal=True)
    assert kernel_work(mask).computed == _counted(mask, False, 1, 1, 1, n, n)[0]
    fwd = kernel_work(mask, pass_="forward")
    # rows path: query blocks of bq rows (chosen for the window, the last one shorter) span
    # w + bq - 1 keys, fewer at the start; in steps of 512 keys
    bq = fwd.block_q
    assert bq in (16, 32, 64, 128) and fwd.block_k == 512
    # except a first block of at most TILE_KEYS rows: its tiles of TILE_ROWS rows (row i sees
    # keys 0..i) span at most TILE_KEYS keys, the tile path: each tile over its rows' keys
    first = bq if bq <= TILE_KEYS else 0
    tiles = sum(TILE_ROWS * (t + TILE_ROWS) for t in range(0, first, TILE_ROWS))
    starts = range(first, n, bq)
    spans = [min(i0 + bq, n) - max(i0 - 255, 0) for i0 in starts]
    blocks = sum(min(bq, n - i0) * w for i0, w in zip(starts, spans, strict=True))
    assert fwd.computed == tiles + blocks
    assert fwd.blocks == sum(-(-w // 512) for w in spans)
    assert fwd.allowed == sum(min(i + 1, 256) for i in range(n)) < fwd.computed < fwd.dense


def test_tiles_put_both_passes_on_the_tile_grid():
    mask = masks.from_function(lambda b, h, q, k: (q // 100) == (k // 100), 600)
    fwd, bwd = (kernel_work(mask, pass_=p) for p in ("forward", "backward"))
    assert (fwd.block_q, fwd.block_k) == (bwd.block_q, bwd.block_k)
    assert (fwd.block_q, fwd.block_k) in _TILE_GRIDS
    assert fwd == bwd and fwd.allowed == 6 * 100 * 100


def test_blocks_follow_a_narrow_mask():
    """A window wider than the row path's rows gets short query blocks and a scattered mask a
    fine tile grid: the entries computed stay within 2.5x of those allowed (128-row blocks:
    ~8x). A window both passes' row paths take (at most 32 keys a row) keeps 128-row blocks,
    each row computing its own keys alone."""
    n = 2048
    wide = kernel_work(masks.window(n, 40))  # 79 keys a row
    assert wide.block_q < 128 and wide.computed < 2.5 * wide.allowed
    for w in (5, 9, 16):  # 9, 17 and 31 keys a row
        for pass_ in ("forward", "backward"):
            narrow = kernel_work(masks.window(n, w), pass_=pass_)
            assert narrow.block_q == 128 and narrow.computed == narrow.allowed
    band = masks.from_function(lambda b, h, q, k: (q // 16) == (k // 16), n)
    tiled = kernel_work(band)
    assert (tiled.block_q, tiled.block_k) != (128, 256)
    assert tiled.computed < 2.5 * tiled.allowed


def test_without_a_mask_every_entry_or_the_causal_blocks():
    dense = kernel_work(n=300, s=200, batch=2, heads=3)
    assert dense.computed == dense.allowed == dense.dense == 2 * 3 * 300 * 200
    causal = kernel_work(n=300, causal=True)
    assert causal.allowed == 300 * 301 // 2
    # query blocks of 128 rows compute keys up to their last row: 128 + 256 + 300
    assert causal.computed == 128 * 128 + 128 * 256 + 44 * 300


def test_batch_and_heads_multiply_what_does_not_depend_on_them():
    mask = masks.document(masks.document_ids([100, 200]), causal=True)
    one = kernel_work(mask)
    many = kernel_work(mask, batch=3, heads=5)
    assert many.computed == 15 * one.computed and many.blocks == 15 * one.blocks
    assert many.allowed == 15 * one.allowed and many.dense == 15 * 300 * 300


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mask": masks.window(8, 2), "n": 9}, "describes N=8 queries and S=8 keys, not N=9, S=8"),
        ({"n": None}, "n is required without a mask"),
        ({"n": 4, "pass_": "both"}, "pass_ must be 'forward' or 'backward'"),
        ({"mask": masks.prefix(8, torch.tensor([1, 2])), "batch": 3}, "mask has batch 2"),
        ({"mask": torch.ones(4, 4, dtype=torch.bool)}, "must be a StructuredMask"),
        ({"n": 4, "heads": 0}, "heads must be a positive integer"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernel_work(**kwargs)


# --------------------------------------------------------------------------- mha_cost(mask=)


def test_mha_cost_with_a_mask_counts_allowed_and_computed_products():
    n, c, h = 300, 32, 4
    mask = masks.document(masks.document_ids([100, 120, 80]))
    cost = mha_cost(n, c, h, mask=mask, batch=2)
    work = kernel_work(mask, batch=2, heads=h)
    per_entry = 2 * (c // h)  # the two score products, d_k + d_v MACs per entry
    assert cost.macs == mha_cost(n, c, h, batch=2).macs  # dense kernels compute everything
    assert cost.masked_macs == (work.dense - work.allowed) * per_entry
    assert cost.skipped_macs == (work.dense - work.computed) * per_entry
    assert cost.computed_macs == cost.macs - cost.skipped_macs
    assert cost.unmasked_macs < cost.computed_macs < cost.macs
    assert cost.to_dict()["computed_macs"] == cost.computed_macs


@pytest.mark.parametrize("causal", [False, True])
def test_a_structured_window_allows_what_the_window_argument_counts(causal):
    n, s = 50, 70
    old = mha_cost(n, 16, 2, context_len=s, window=6, causal=causal)
    new = mha_cost(n, 16, 2, context_len=s, mask=masks.window(n, 6, s), causal=causal)
    assert new.masked_macs == old.masked_macs and new.macs == old.macs
    assert old.skipped_macs == 0 and new.skipped_macs > 0


def test_mha_cost_mask_errors():
    with pytest.raises(ValueError, match="mask describes N=8 queries and S=8 keys, not N=9, S=9"):
        mha_cost(9, 16, 2, mask=masks.window(8, 2))
    with pytest.raises(ValueError, match="window=3 and mask"):
        mha_cost(8, 16, 2, mask=masks.window(8, 2), window=3)
    with pytest.raises(ValueError, match="mask has heads 4"):
        mha_cost(8, 16, 2, mask=masks.from_function(lambda b, h, q, k: k <= q, 8, heads=4))


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
def test_narrow_windows_take_the_row_path_in_both_passes(causal):
    """Rows that see at most ROW_PATH_KEYS keys of a wider block span are computed over their
    own keys alone: both passes compute exactly the allowed pairs, in no blocks."""
    n = 203
    mask = masks.window(n, 5, causal=causal)  # 9 keys, or 5 causal
    fwd, bwd = (kernel_work(mask, pass_=p, heads=3) for p in PASSES)
    for work in (fwd, bwd):
        assert work.computed == work.allowed and work.blocks == 0
    q, k, v = (torch.randn(1, 3, n, 8, requires_grad=True) for _ in range(3))
    with native.count_work() as counted:
        attnkit.attention(q, k, v, mask=mask, backend="chunked").out.sum().backward()
    assert counted.item() == fwd.computed + bwd.computed
