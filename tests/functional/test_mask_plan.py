"""A structured mask's plan: every entry evaluated once, in chunks of whole blocks, kept in
memory that follows its partial blocks, not N · S."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.analysis.peak_tensors import PeakTensors
from attnkit.functional import _block_scan
from attnkit.functional._block_scan import EMPTY, FULL, PARTIAL
from attnkit.functional._grid import FINE_GRID
from attnkit.functional._mask_plan import (
    TILE_EMPTY,
    TILE_FULL,
    dense_with_plan,
    kernel_plan,
    plan_mask,
)


def _random_predicate(seed: int, n: int, s: int, batch: int = 1, heads: int = 1):
    """Rows with a random key interval, OR coarse random patches per (batch row, head): blocks
    of every class on every grid, and the mask depends on b and h where they are > 1."""
    g = torch.Generator().manual_seed(seed)
    lo = torch.randint(0, s, (n,), generator=g)
    width = torch.randint(0, max(1, s // 3), (n,), generator=g)
    patches = torch.rand(batch, heads, -(-n // 13), -(-s // 29), generator=g) < 0.3

    def fn(b, h, q, kv):
        band = (kv >= lo[q]) & (kv < lo[q] + width[q])
        return band | patches[b, h, q // 13, kv // 29]

    return masks.from_function(fn, n, s, batch=batch, heads=heads)


CASES = [(97, 97, 1, 1), (1025, 1025, 1, 1), (97, 1025, 1, 1), (1025, 300, 2, 3), (1, 7, 1, 2)]


def _block_classes(dense: torch.Tensor, bq: int, bk: int) -> torch.Tensor:
    """int8 (B, H, nqb, nkb) block classes of a dense boolean mask, by any/all on its blocks."""
    b, h, n, s = dense.shape
    nqb, nkb = -(-n // bq), -(-s // bk)
    out = torch.empty(b, h, nqb, nkb, dtype=torch.int8)
    for qb in range(nqb):
        for kb in range(nkb):
            tile = dense[:, :, qb * bq : (qb + 1) * bq, kb * bk : (kb + 1) * bk].flatten(2)
            out[:, :, qb, kb] = torch.where(
                tile.all(-1), FULL, torch.where(tile.any(-1), PARTIAL, EMPTY)
            )
    return out


def _check_plan(plan, mask, bq: int, bk: int) -> None:
    """The plan's table has the dense mask's block classes, a tile for each partial block only,
    tiles zero past N and S, and table & tiles give back the dense mask."""
    dense = mask.dense().expand(mask.shape)
    want = _block_classes(dense, bq, bk)
    table = plan.table
    assert plan.tiles.shape[1:] == (bq, bk)
    assert torch.equal(table == TILE_FULL, want == FULL)
    assert torch.equal(table == TILE_EMPTY, want == EMPTY)
    assert sorted(table[table >= 0].tolist()) == list(range(plan.tiles.shape[0]))
    got = dense_with_plan(None, None, table, plan.tiles, mask.n, mask.s)
    assert torch.equal(got.expand(mask.shape), dense)
    partial_only = table.clamp(min=TILE_EMPTY)  # full blocks read as empty: the tiles alone
    size = (table.shape[2] * bq, table.shape[3] * bk)
    whole = dense_with_plan(None, None, partial_only, plan.tiles, *size)
    assert not whole[..., mask.n :, :].any() and not whole[..., mask.s :].any()


@pytest.mark.parametrize(("n", "s", "batch", "heads"), CASES)
@pytest.mark.parametrize(("bq", "bk"), [(16, 32), (128, 256), (7, 150)])
def test_plans_equal_the_dense_mask_on_random_predicates(n, s, batch, heads, bq, bk):
    mask = _random_predicate(n * s + batch, n, s, batch, heads)
    _check_plan(plan_mask(mask, bq, bk, "cpu"), mask, bq, bk)
    dense = mask.dense().expand(mask.shape)
    assert torch.equal(mask.block_map(bq, bk), _block_classes(dense, bq, bk))
    assert mask.density == pytest.approx(dense.double().mean().item())


@pytest.mark.parametrize(("n", "s", "batch", "heads"), CASES)
def test_the_kernel_plan_pools_one_evaluation_into_the_grid_it_chooses(n, s, batch, heads):
    """kernel_plan reads every entry once on the fine grid (plus the first chunk again, the
    determinism check) and pools that into the chosen grid: the same table and tiles as
    evaluating the mask on that grid."""
    mask = _random_predicate(n + s, n, s, batch, heads)
    entries = []
    fn = mask.fn
    mask.fn = lambda b, h, q, kv: entries.append(q.shape[2] * kv.shape[3]) or fn(b, h, q, kv)
    plan = kernel_plan(mask, "cpu")
    bq, bk = plan.tiles.shape[1:]
    assert sum(entries) - entries[0] == n * s
    _check_plan(plan, mask, bq, bk)
    direct = plan_mask(_random_predicate(n + s, n, s, batch, heads), bq, bk, "cpu")
    assert torch.equal(plan.table, direct.table) and torch.equal(plan.tiles, direct.tiles)


def test_a_predicate_is_read_in_chunks_of_whole_blocks_within_the_budget():
    n, s, seen = 3000, 5000, []

    def band(b, h, q, kv):
        seen.append((q[0, 0, 0, 0].item(), q.shape[2], kv[0, 0, 0, 0].item(), kv.shape[3]))
        return (kv - q).abs() < 32

    plan_mask(masks.from_function(band, n, s, heads=4), 128, 256, "cpu")
    for i0, rows, j0, keys in seen:
        assert 4 * rows * keys <= max(_block_scan._CHUNK_ENTRIES, 4 * 128 * 256)
        assert i0 % 128 == 0 and j0 % 256 == 0 and (rows % 128 == 0 or i0 + rows == n)
        assert keys % 256 == 0 or j0 + keys == s


@pytest.mark.parametrize("plan", [lambda m: plan_mask(m, 128, 256, "cpu"), kernel_plan])
def test_a_predicate_that_is_not_deterministic_is_refused(plan):
    mask = masks.from_function(lambda b, h, q, k: torch.rand(q.shape[2], k.shape[3]) < 0.5, 300)
    with pytest.raises(ValueError, match="must be deterministic"):
        plan(mask, "cpu") if plan is kernel_plan else plan(mask)


def test_a_band_plan_peaks_far_below_the_dense_mask():
    """N = 16384: the dense boolean mask is 256 MiB; the plan holds one chunk's temporaries,
    the fine grid's classes (N · S / 512 bytes) and the band's tiles."""
    n = 16384
    mask = masks.from_function(lambda b, h, q, kv: (kv - q).abs() < 32, n)
    with PeakTensors() as peak:
        plan = kernel_plan(mask, "cpu")
    chunk = 8 * _block_scan._CHUNK_ENTRIES  # one int64 temporary of the predicate
    fine = n * n // (FINE_GRID[0] * FINE_GRID[1])
    assert peak.peak < 4 * chunk + 4 * fine + 3 * plan.tiles.nbytes
    assert peak.peak < n * n / 16
    bq, bk = plan.tiles.shape[1:]
    assert plan.tiles.shape[0] <= -(-n // bq) * (-(-(bq + 64) // bk) + 1)  # the band's blocks


@pytest.mark.parametrize("join", [0, 1 << 30])
def test_tiles_of_many_chunks_come_back_in_the_tables_order(monkeypatch, join):
    """Chunks of 16 × 1025 (a small budget): 65 chunks whose tiles are joined every 64 while
    small, kept apart when large; nearly every block partial, the plan still gives back the mask."""
    monkeypatch.setattr(_block_scan, "_CHUNK_ENTRIES", 1 << 14)
    monkeypatch.setattr(_block_scan, "_JOIN_BYTES", join)
    n = 1025
    mask = masks.from_function(lambda b, h, q, kv: (q + kv) % 3 == 0, n)
    plan = plan_mask(mask, 16, 32, "cpu")
    _check_plan(plan, mask, 16, 32)
