from __future__ import annotations

import math

import pytest
import torch

from attnkit import positional


def test_sinusoidal_formula_and_offset():
    pe = positional.sinusoidal(50, 16)
    pos, i = 37, 3
    assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert pe[pos, 2 * i + 1].item() == pytest.approx(
        math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6
    )
    torch.testing.assert_close(positional.sinusoidal(10, 16, offset=40), pe[40:])
    assert positional.sinusoidal(4, 7).shape == (4, 7)


def test_sincos_2d_rows_then_columns():
    pe = positional.sincos_2d(3, 5, 8)
    assert pe.shape == (15, 8)
    # patches in the same row share the first half; same column share the second
    assert torch.equal(pe[5, :4], pe[9, :4]) and not torch.equal(pe[5, 4:], pe[9, 4:])
    assert torch.equal(pe[1, 4:], pe[11, 4:])
    assert pe[0, :2].tolist() == [0.0, 0.0] and pe[0, 2:4].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="multiple of 4"):
        positional.sincos_2d(2, 2, 6)


def _detr_sine_by_hand(mask, dim, temperature=10000.0, scale=2 * math.pi):
    """DETR's PositionEmbeddingSine written as loops over pixels and channels (float64)."""
    b, h, w = mask.shape
    out = torch.zeros(b, h, w, dim, dtype=torch.float64)
    half = dim // 2
    for n in range(b):
        for r in range(h):
            for c in range(w):
                y = mask[n, : r + 1, c].sum().item() / (mask[n, :, c].sum().item() + 1e-6)
                x = mask[n, r, : c + 1].sum().item() / (mask[n, r, :].sum().item() + 1e-6)
                for i in range(half):
                    freq = temperature ** (2 * (i // 2) / half)
                    trig = math.sin if i % 2 == 0 else math.cos
                    out[n, r, c, i] = trig(y * scale / freq)
                    out[n, r, c, half + i] = trig(x * scale / freq)
    return out.flatten(1, 2)


def test_detr_sine_2d_matches_the_formula_with_padding():
    mask = torch.ones(2, 4, 5, dtype=torch.bool)
    mask[1, 3:, :] = False  # padded bottom row and right columns, as a batch of images gives
    mask[1, :, 3:] = False
    got = positional.detr_sine_2d(mask, 12, dtype=torch.float64)
    assert got.shape == (2, 20, 12)
    torch.testing.assert_close(got, _detr_sine_by_hand(mask, 12), atol=1e-12, rtol=0)
    # the image's positions do not depend on how much padding surrounds it
    small = positional.detr_sine_2d(torch.ones(1, 3, 3, dtype=torch.bool), 12, dtype=torch.float64)
    torch.testing.assert_close(
        got[1].view(4, 5, 12)[:3, :3].reshape(9, 12), small[0], atol=1e-12, rtol=0
    )


def test_detr_sine_2d_refuses_bad_input():
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        positional.detr_sine_2d(torch.ones(1, 3, 3), 8)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        positional.detr_sine_2d(torch.ones(3, 3, dtype=torch.bool), 8)
    with pytest.raises(ValueError, match="multiple of 4"):
        positional.detr_sine_2d(torch.ones(1, 3, 3, dtype=torch.bool), 10)
