"""The legibility check the page test applies to every figure a tutorial saves (issue 37,
item 3): the smallest text, in px where the site's 868 px column shows the PNG."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from tests.docs import legibility


def _figure(width_in: float, size_pt: float) -> Figure:
    fig = Figure(figsize=(width_in, 3))
    ax = fig.add_subplot()
    ax.set_title("a title", fontsize=size_pt + 4)
    ax.set_xlabel("small label", fontsize=size_pt)
    ax.tick_params(labelsize=size_pt + 2)
    ax.text(5.0, 5.0, "off the axes: not drawn", fontsize=1)  # outside the view: not counted
    return fig


def test_recording_measures_each_saved_figure_in_displayed_px():
    with legibility.recording() as saved:
        _figure(11, 8).savefig(io.BytesIO(), format="png", dpi=100)  # 1100 px wide
        _figure(8.6, 8).savefig(io.BytesIO(), format="png", dpi=100)  # 860 px: not shrunk
        _figure(6, 10).savefig(io.BytesIO(), format="png", dpi=50)
    wide, narrow, low = saved
    assert wide.text == "small label" and wide.width_px == pytest.approx(1100)
    assert wide.text_px == pytest.approx(8 * 100 / 72)
    assert wide.shown_px == pytest.approx(8 * 100 / 72 * 868 / 1100)  # 8.8 px: too small
    assert wide.shown_px < legibility.MIN_PX <= narrow.shown_px  # 11.1 px
    assert low.shown_px == pytest.approx(10 * 50 / 72)  # 6.9 px at 50 dpi


def test_recording_restores_savefig():
    original = Figure.savefig
    with legibility.recording():
        assert Figure.savefig is not original
    assert Figure.savefig is original
