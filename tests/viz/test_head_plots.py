from __future__ import annotations

import pytest
import torch

from attnkit.analysis.heads import head_stats
from attnkit.viz.head_plots import head_distance_figure


def test_one_point_per_head_at_its_distance():
    maps = torch.softmax(torch.randn(3, 1, 4, 6, 6), -1)  # (L, B, H, N, N)
    stats = head_stats(maps)
    fig = head_distance_figure(stats, layer_names=["a", "b", "c"], title="t " * 80)
    ax = fig.axes[0]
    offsets = ax.collections[0].get_offsets()
    assert offsets.shape == (12, 2)
    torch.testing.assert_close(
        torch.tensor(offsets[:, 1]), stats.distance.flatten().float(), check_dtype=False
    )
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="expected 3 names, got 1"):
        head_distance_figure(stats, layer_names=["x"])
