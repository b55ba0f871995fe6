"""A structured mask's plan: built in memory that follows its partial blocks, not N · S."""

from __future__ import annotations

import torch

from attnkit import masks
from attnkit.functional import _grid
from attnkit.functional._mask_plan import TILE_EMPTY, kernel_plan, plan_mask


def test_a_band_predicate_is_evaluated_a_key_chunk_at_a_time():
    """The predicate's int64 temporaries of a 128-row block over all S keys made the plan's
    peak O(S) per row of blocks (≈ 1 GiB at N = 32768 for this band, measured); evaluated on at
    most 4096 keys at a time they stay a few MiB (38 MiB at N = 32768), and the plan keeps
    only the band's partial tiles."""
    n, seen = 5000, []

    def band(b, h, q, kv):
        seen.append((q.shape[2], kv.shape[3]))
        return (kv - q).abs() < 32

    plan = kernel_plan(masks.from_function(band, n), "cpu")
    assert max(r for r, _ in seen) <= 128 and max(c for _, c in seen) <= _grid._CHUNK_KEYS < n
    bq, bk = plan.tiles.shape[1:]
    touched = int((plan.table != TILE_EMPTY).sum())
    assert touched <= plan.table.shape[2] * (-(-(bq + 64) // bk) + 1)  # the band's blocks only


def test_tiles_read_in_key_chunks_equal_the_mask():
    """Key chunks of 4096 cut rows of blocks in pieces: the tiles and table still give back
    the mask (S = 9000: three chunks, the last one short)."""
    n, s = 300, 9000
    mask = masks.from_function(lambda b, h, q, kv: ((kv * 7 + q) % 13 == 0) | (kv < q), n, s)
    plan = plan_mask(mask, 128, 256, "cpu")
    grid = torch.cat([plan.tiles, torch.ones(1, 128, 256, dtype=torch.uint8),
                      torch.zeros(1, 128, 256, dtype=torch.uint8)])[plan.table.long()]  # fmt: skip
    whole = grid.permute(0, 1, 2, 4, 3, 5).reshape(1, 1, 3 * 128, 36 * 256)[..., :n, :s]
    assert torch.equal(whole.bool(), mask.dense())
