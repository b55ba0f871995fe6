"""Head statistics on hand-built attention patterns with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.analysis.heads import grid_positions, head_stats


def patterns(n):
    identity = torch.eye(n, dtype=torch.float64)
    uniform = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    band = torch.zeros(n, n, dtype=torch.float64)  # half on itself, half on the next key
    for i in range(n):
        band[i, i] += 0.5
        band[i, min(i + 1, n - 1)] += 0.5
    return torch.stack([identity, uniform, band])[None]  # (B=1, H=3, N, N)


def test_exact_distances_and_entropies():
    n = 6
    stats = head_stats(patterns(n))
    mean_abs = sum(abs(i - j) for i in range(n) for j in range(n)) / n / n
    band_dist = (n - 1) * 0.5 / n  # the last row puts both halves on itself
    assert stats.distance.shape == (1, 3)
    torch.testing.assert_close(
        stats.distance[0], torch.tensor([0.0, mean_abs, band_dist], dtype=torch.float64)
    )
    band_entropy = (n - 1) * math.log(2) / n
    torch.testing.assert_close(
        stats.entropy[0], torch.tensor([0.0, math.log(n), band_entropy], dtype=torch.float64)
    )


def test_special_share_and_query_mask():
    n = 4
    p = patterns(n).expand(2, 3, n, n).clone()
    special = torch.tensor([True, False, False, True])
    stats = head_stats(p, special=special)
    torch.testing.assert_close(stats.special_share[0, 1], torch.tensor(0.5, dtype=torch.float64))
    torch.testing.assert_close(stats.special_share[0, 0], torch.tensor(0.5, dtype=torch.float64))
    # padded queries are excluded: only query 0 counts, which looks at itself (special)
    only_first = torch.tensor([[True, False, False, False]] * 2)
    masked = head_stats(p, special=special, query_mask=only_first)
    assert masked.special_share[0, 0] == 1.0 and masked.distance[0, 0] == 0.0


def test_image_distances_in_pixels_skip_class_token():
    grid, patch = 3, 16
    pos = grid_positions(grid, grid, patch, prefix=1)  # (10, 2)
    n = 1 + grid * grid
    p = torch.zeros(1, 1, n, n, dtype=torch.float64)
    p[0, 0, :, 1] = 1.0  # everyone looks at patch (0, 0)
    stats = head_stats(p, positions=pos)
    rows = torch.arange(grid).repeat_interleave(grid).double()
    cols = torch.arange(grid).repeat(grid).double()
    want = (torch.sqrt(rows**2 + cols**2) * patch).mean()  # class-token query left out
    torch.testing.assert_close(stats.distance[0, 0], want)


def test_layers_as_list_and_summary():
    stats = head_stats([patterns(5), patterns(5)])
    assert stats.distance.shape == (2, 3)
    lines = stats.summary()
    assert len(lines) == 2 and lines[0].startswith("layer 0: distance 0.00–")


def test_bad_shapes():
    with pytest.raises(ValueError, match="maps must be"):
        head_stats(torch.rand(3, 4))
    with pytest.raises(ValueError, match="positions must have shape"):
        head_stats(patterns(4), positions=torch.zeros(5, 1))
