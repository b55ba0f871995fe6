"""draw_head_lines (the head view as a still picture) and layer_view (one layer's heads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from attnkit.viz import AttentionMaps, draw_head_lines, layer_view


def probs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).softmax(-1)


@pytest.fixture
def maps() -> AttentionMaps:
    return AttentionMaps(["a", "b", "c", "d"], probs(2, 3, 4, 5), key_tokens=list("vwxyz"))


def axes() -> object:
    fig = Figure()
    FigureCanvasAgg(fig)
    return fig.add_subplot()


def lines_of(ax) -> tuple[np.ndarray, np.ndarray]:
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    return np.array(lines.get_segments()), lines.get_colors()


def test_one_query_row_as_lines_whose_opacity_is_the_weight(maps):
    ax = axes()
    draw_head_lines(ax, maps, 1, 2, query="c", color="red")
    segments, colors = lines_of(ax)
    row = maps.maps[1, 2, 2].numpy()  # (S,)
    drawn = np.flatnonzero(row >= 0.005)
    assert len(segments) == len(drawn)
    np.testing.assert_allclose(colors[:, 3], row[drawn], rtol=1e-6)
    np.testing.assert_allclose(colors[:, :3], [[1.0, 0.0, 0.0]] * len(drawn))
    q_y = 1 - (2 + 0.5) / 4  # query 2 of 4, top to bottom
    np.testing.assert_allclose(segments[:, 0, 1], q_y)
    np.testing.assert_allclose(segments[:, 1, 1], 1 - (drawn + 0.5) / 5)  # to each key's row
    texts = {t.get_text(): t for t in ax.texts}
    assert set(texts) == {"a", "b", "c", "d", "v", "w", "x", "y", "z"}
    assert texts["c"].get_fontweight() == "bold" and texts["a"].get_fontweight() == "normal"
    assert ax.get_title() == "layer 1, head 2"


def test_every_row_without_a_query(maps):
    ax = axes()
    draw_head_lines(ax, maps, -1, 0, title="t")
    segments, colors = lines_of(ax)
    weights = maps.maps[1, 0].numpy()  # (N, S)
    assert len(segments) == int((weights >= 0.005).sum())
    np.testing.assert_allclose(np.sort(colors[:, 3]), np.sort(weights[weights >= 0.005]))
    assert ax.get_title() == "t"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layer": 2, "head": 0}, "layer"),
        ({"layer": 0, "head": 3}, "head"),
        ({"layer": 0, "head": 0, "query": "q"}, "query"),
        ({"layer": 0, "head": 0, "query": 4}, "query"),
    ],
)
def test_bad_arguments_name_themselves(maps, kwargs, match):
    with pytest.raises(ValueError, match=match):
        draw_head_lines(axes(), maps, **kwargs)


def test_layer_view_draws_every_head_of_one_layer_on_one_scale(maps):
    fig = layer_view(maps, 1, columns=2)
    panels = [ax for ax in fig.axes if ax.images and ax.get_label() != "colorbar"]
    assert len(panels) == 3
    for h, ax in enumerate(panels):
        np.testing.assert_array_equal(ax.images[0].get_array(), maps.maps[1, h].numpy())
        assert ax.images[0].get_clim() == (0.0, 1.0)
        assert ax.get_title() == f"head {h}"
    ylabels = [[t.get_text() for t in ax.get_yticklabels()] for ax in panels]
    xlabels = [[t.get_text() for t in ax.get_xticklabels()] for ax in panels]
    assert ylabels == [list("abcd"), [], list("abcd")]  # the left column
    assert xlabels == [[], list("vwxyz"), list("vwxyz")]  # nothing below heads 1 and 2
    assert fig._suptitle.get_text() == "layer 1"


def test_layer_view_rejects_bad_arguments(maps):
    with pytest.raises(ValueError, match="layer"):
        layer_view(maps, 2)
    with pytest.raises(ValueError, match="columns"):
        layer_view(maps, 0, columns=0)
    with pytest.raises(ValueError, match="maps"):
        layer_view(maps.maps, 0)
