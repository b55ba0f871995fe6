"""FlexAttention's BlockMask and attnkit's structured masks, both ways: `from_block_mask` means
what Flex's kernels compute (block lists + mask_mod) and skips by the lists; a mask_mod written
for per-element calls works; `to_block_mask` keeps a mask's meaning, lists blocks soundly, runs
on `meta`, and FlexAttention's compiled CPU forward computes with it what attnkit computes."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    create_mask,
    flex_attention,
    noop_mask,
)

import attnkit
from attnkit import masks
from attnkit.functional.structured import EMPTY, FULL, RowIntervals, causal_intervals

N = 200


def _ids(n=N):
    return torch.repeat_interleave(torch.arange(3), torch.tensor([70, 50, n - 120]))


def test_from_block_mask_equals_create_mask_with_batch_and_heads():
    ids = torch.stack([_ids(), _ids().flip(0)])  # (B, N): per batch row

    def mask_mod(b, h, q_idx, kv_idx):
        return (ids[b, q_idx] == ids[b, kv_idx]) & ((q_idx >= kv_idx) | (h == 1))

    bm = create_block_mask(mask_mod, 2, 3, N, N - 9, device="cpu", BLOCK_SIZE=64)
    got = masks.from_block_mask(bm)
    assert got.shape == (2, 3, N, N - 9)
    assert torch.equal(got.dense(), create_mask(mask_mod, 2, 3, N, N - 9, device="cpu"))


def test_block_lists_are_the_mask_where_flex_kernels_read_them():
    """Unlisted blocks masked, full blocks whole, partial blocks where mask_mod holds."""

    def odd_keys(b, h, q_idx, kv_idx):
        return kv_idx % 2 == 1

    num = torch.tensor([[[1, 0, 1, 1]]], dtype=torch.int32)  # (B, H, nqb): partial blocks
    idx = torch.tensor([[[[1, 0, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0], [2, 0, 0, 0]]]])
    full_num = torch.tensor([[[1, 0, 0, 1]]], dtype=torch.int32)
    full_idx = torch.tensor([[[[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0]]]])
    bm = BlockMask.from_kv_blocks(
        num, idx.int(), full_num, full_idx.int(), BLOCK_SIZE=50, mask_mod=odd_keys,
        seq_lengths=(N, N),
    )  # fmt: skip
    want = torch.zeros(N, N, dtype=torch.bool)
    odd = torch.arange(N) % 2 == 1
    for qb, kb, full in [(0, 1, False), (0, 0, True), (2, 3, False), (3, 2, False), (3, 3, True)]:
        rows, cols = slice(qb * 50, qb * 50 + 50), slice(kb * 50, kb * 50 + 50)
        want[rows, cols] = True if full else odd[cols]
    assert torch.equal(masks.from_block_mask(bm).dense()[0, 0], want)
    noop = BlockMask.from_kv_blocks(num, idx.int(), BLOCK_SIZE=50, seq_lengths=(N, N))
    assert noop.mask_mod is noop_mask
    assert int(masks.from_block_mask(noop).dense().sum()) == 3 * 50 * 50


def test_mask_mod_is_evaluated_on_partial_blocks_only():
    """Causal at N = 1024 on Flex's 128 × 128 blocks: attnkit's plan (128 × 256 tiles) calls
    the mask_mod on the 8 tiles that hold a diagonal block, a quarter of N × S."""
    n, seen = 1024, []

    def causal(b, h, q_idx, kv_idx):
        seen.append(math.prod(torch.broadcast_shapes(q_idx.shape, kv_idx.shape)))
        return q_idx >= kv_idx

    bm = create_block_mask(causal, None, None, n, n, device="cpu")
    seen.clear()
    q = torch.randn(1, 1, n, 8)
    got = attnkit.attention(q, q, q, mask=masks.from_block_mask(bm)).out
    assert sum(seen) <= 8 * 128 * 256 + 16  # + the per-element cross-check of 4 × 4 entries
    torch.testing.assert_close(got, attnkit.attention(q, q, q, causal=True).out)


def test_mask_mod_written_for_per_element_calls_works():
    def scalar_only(b, h, q_idx, kv_idx):  # vectorised, max() would reduce the whole block
        return torch.stack([q_idx, kv_idx]).max() == q_idx

    bm = create_block_mask(scalar_only, None, None, N, N, device="cpu", BLOCK_SIZE=64)
    got = masks.from_block_mask(bm)
    assert torch.equal(got.dense(), create_mask(scalar_only, 1, 1, N, N, device="cpu"))
    assert got.mod.mode == "vmap"


def test_mask_mod_that_cannot_be_evaluated_names_vectorisation():
    def python_if(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx if int(q_idx) > 3 else kv_idx == 0

    num = torch.ones(1, 1, 1, dtype=torch.int32)
    bm = BlockMask.from_kv_blocks(
        num, torch.zeros(1, 1, 1, 1, dtype=torch.int32), BLOCK_SIZE=8, mask_mod=python_if,
        seq_lengths=(8, 8),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"vectorised.*torch\.vmap.*tensor operations"):
        masks.from_block_mask(bm).dense()


def _attnkit_masks(n=N):
    ids = _ids(n)
    shuffled = ids[torch.randperm(n, generator=torch.Generator().manual_seed(0))]
    padding = (torch.arange(n) < n - 13)[None, None, None, :]  # (1, 1, 1, S) key padding

    def dilated(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx) % 3 == 0

    pos = torch.arange(n)  # far bands: rows see two runs of keys

    return {
        "window": masks.window(n, 40),
        "causal_document": masks.document(ids, causal=True),
        "prefix": masks.prefix(n, 50),
        "scattered_documents": masks.document(shuffled),
        "mixed": masks.document(ids, causal=True) & masks.from_function(dilated, n) & padding,
        "union": masks.window(n, 9) | masks.from_function(dilated, n),
        "runs": (masks.window(n, 9) | RowIntervals(pos + 60, pos + 75, n)) & padding,
        "runs-behind": masks.window(n, 5) | RowIntervals(pos - 90, pos - 83, n),
    }


@pytest.mark.parametrize("name", list(_attnkit_masks()))
def test_to_block_mask_keeps_the_meaning_and_lists_blocks_soundly(name):
    m = _attnkit_masks()[name]
    bm = masks.to_block_mask(m, 64)
    assert bm.BLOCK_SIZE == (64, 64) and tuple(bm.seq_lengths) == (N, N)
    assert torch.equal(masks.from_block_mask(bm).dense(), m.dense().expand_as(m.dense()))
    exact = m.block_map(64, 64)
    listed = masks.from_block_mask(bm).classes
    assert not ((listed == FULL) & (exact != FULL)).any()  # full only where nothing is masked
    assert not ((listed == EMPTY) & (exact != EMPTY)).any()  # skipped only where all is masked
    # the mask_mod alone is the mask wherever Flex applies it (vectorised call here)
    idx = torch.arange(N)
    got = bm.mask_mod(torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.zeros(1, 1, 1, 1).long(),
                      idx[None, None, :, None], idx[None, None, None, :])  # fmt: skip
    assert torch.equal(got.expand(1, 1, N, N), m.dense())


def test_from_block_mask_comes_back_as_itself():
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, N, N, device="cpu")
    assert masks.to_block_mask(masks.from_block_mask(bm)) is bm


def test_to_block_mask_on_meta():
    """Interval masks convert without reading data: on `meta` as on the CPU."""
    for build in (lambda d: masks.window(N, 40, device=d), lambda d: masks.prefix(N, 50, device=d)):
        cpu, meta = masks.to_block_mask(build("cpu")), masks.to_block_mask(build("meta"))
        assert meta.kv_num_blocks.device.type == "meta"
        for a, b in zip(cpu.as_tuple(), meta.as_tuple(), strict=True):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.dtype == b.dtype


def test_to_block_mask_refuses_tensors_and_bad_blocks():
    with pytest.raises(ValueError, match=r"structured mask, got torch\.bool"):
        masks.to_block_mask(torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_size must be integers >= 1"):
        masks.to_block_mask(masks.window(N, 4), 0)


@pytest.mark.slow
def test_to_block_mask_in_flex_compiled_cpu_forward():
    """FlexAttention's compiled CPU kernel with the converted mask (rows, a dense key padding
    and tiles, all read by its mask_mod) computes what attnkit computes (~10 s compiling)."""
    m = _attnkit_masks(256)["mixed"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 16, generator=g) for _ in range(3))
    want = attnkit.attention(q, k, v, mask=m).out
    got = torch.compile(flex_attention, fullgraph=True)(q, k, v, block_mask=masks.to_block_mask(m))
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    "mask, affine",
    [
        (masks.window(50, 7, causal=True), True),
        (masks.window(40, 5, s=64), True),  # two-sided, bottom-right offset S - N
        (masks.prefix(50, 12), True),
        (masks.prefix(30, 12, s=45), True),
        (causal_intervals(33, 70), True),
        (masks.document(masks.document_ids([20, 30]), causal=True), False),
        (masks.prefix(50, torch.tensor([3, 9])), False),  # per batch row: read from arrays
    ],
)
def test_interval_masks_with_a_formula_get_an_arithmetic_mask_mod(mask, affine):
    """Causal limits, windows and prefix-LM get a mask_mod of comparisons only (no loads per
    score); it equals the mask on every position, as the array-reading one does."""
    from attnkit.functional._mask_plan import plan_mask
    from attnkit.functional.flex_masks import _affine_rows

    plan = plan_mask(mask, 16, 16, "cpu")
    assert (plan.rows is not None and _affine_rows(*plan.rows[:, 0]) is not None) == affine
    bm = masks.to_block_mask(mask, 16)
    b = torch.arange(mask.batch)[:, None, None, None]
    q, kv = torch.arange(mask.n)[None, None, :, None], torch.arange(mask.s)[None, None, None, :]
    got = bm.mask_mod(b, torch.zeros(1, 1, 1, 1, dtype=torch.long), q, kv)
    assert torch.equal(got.expand(mask.batch, 1, mask.n, mask.s), mask.dense().expand_as(got))
