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
