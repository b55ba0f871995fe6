"""The figures of tutorials 11-14 draw the tensors they are given, with a colour bar on every
weights panel, legible on the site's 868 px column, and in the reader's language."""

from __future__ import annotations

import warnings

import pytest
import torch
from matplotlib import font_manager
from matplotlib.text import Text

from attnkit.viz import lessons
from attnkit.viz.lessons_more import (
    CJK_FONTS,
    curves_figure,
    kernel_regression_figure,
    weights_figure,
)

COLUMN_PX = 868  # the width of the site's content column


def _axes(fig, label):
    found = [ax for ax in fig.axes if ax.get_label() == label]
    assert len(found) == 1, [ax.get_label() for ax in fig.axes]
    return found[0]


def _texts(fig):
    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]


def _smallest_px_on_column(fig) -> float:
    """The smallest text in pixels once the PNG (saved at dpi 100) is shown 868 px wide."""
    width_px = fig.get_size_inches()[0] * 100
    scale = min(1.0, COLUMN_PX / width_px)
    return min(t.get_fontsize() for t in _texts(fig)) * 100 / 72 * scale


def _colour_bars(fig) -> int:
    return sum(1 for ax in fig.axes if ax.get_label() == "<colorbar>")


def _toy(n=7, s=5):
    g = torch.Generator().manual_seed(0)
    x_keys = torch.sort(torch.rand(s, generator=g, dtype=torch.float64)).values
    y_keys = torch.randn(s, generator=g, dtype=torch.float64)
    x_q = torch.linspace(0, 1, n, dtype=torch.float64)
    w = torch.softmax(-(((x_q[:, None] - x_keys[None, :]) * 3) ** 2), dim=1)  # (n, s)
    return x_keys, y_keys, x_q, w


def test_kernel_regression_figure_draws_the_weights_and_predictions_given():
    x_keys, y_keys, x_q, w = _toy()
    wide = torch.softmax(-((x_q[:, None] - x_keys[None, :]) ** 2), dim=1)
    fig = kernel_regression_figure(
        x_keys, y_keys, x_q, {"sharp": w @ y_keys, "wide": wide @ y_keys},
        {"w sharp": w, "w wide": wide}, truth=torch.sin(x_q),
    )  # fmt: skip
    for i, m in enumerate((w, wide)):
        drawn = torch.tensor(_axes(fig, f"weights {i}").images[0].get_array())
        torch.testing.assert_close(drawn, m)
    lines = {line.get_label(): line for line in _axes(fig, "curves").lines}
    torch.testing.assert_close(
        torch.tensor(lines["sharp"].get_ydata()), w @ y_keys, check_dtype=False
    )
    assert _colour_bars(fig) == 2
    assert fig.get_size_inches()[0] * 100 <= 900
    assert min(t.get_fontsize() for t in _texts(fig)) >= lessons.FONT
    assert _smallest_px_on_column(fig) >= 14  # 11 pt, well over 11 px


def test_kernel_regression_figure_refuses_mismatched_shapes():
    x_keys, y_keys, x_q, w = _toy()
    with pytest.raises(ValueError, match=r"weights\['w'\]: expected \(7, 5\), got \(5, 7\)"):
        kernel_regression_figure(x_keys, y_keys, x_q, {}, {"w": w.T})
    with pytest.raises(ValueError, match=r"predictions\['p'\]: expected \(7,\), got \(6,\)"):
        kernel_regression_figure(x_keys, y_keys, x_q, {"p": torch.zeros(6)}, {"w": w})
    with pytest.raises(ValueError, match="lang: expected one of"):
        kernel_regression_figure(x_keys, y_keys, x_q, {}, {"w": w}, lang="fr")


def test_weights_figure_shares_one_scale_and_gives_each_panel_a_colour_bar():
    a = torch.softmax(torch.randn(4, 10), -1)
    b = torch.eye(4, 10)
    fig = weights_figure({"a": a, "b": b}, title="two")
    images = [_axes(fig, f"weights {i}").images[0] for i in range(2)]
    assert [im.get_clim() for im in images] == [(0.0, 1.0)] * 2  # one scale: 0 .. max of all
    torch.testing.assert_close(torch.tensor(images[0].get_array()), a, check_dtype=False)
    assert _colour_bars(fig) == 2
    assert _smallest_px_on_column(fig) >= 14
    with pytest.raises(ValueError, match="1 to 4 matrices, got 5"):
        weights_figure({str(i): a for i in range(5)})
    with pytest.raises(ValueError, match=r"weights\['v'\]: expected \(N, S\), got \(10,\)"):
        weights_figure({"v": a[0]})


def test_curves_figure_plots_each_series_at_the_given_x():
    fig = curves_figure(
        [256, 512, 1024],
        {"memory": {"plain": [1.0, 4.0, 16.0], "tiled": [0.5, 0.6, 0.8]}, "time": {"t": [1, 2, 3]}},
        xlabel="N", ylabel=["MiB", "ms"], logx=True, logy=True,
    )  # fmt: skip
    ax = _axes(fig, "panel 0")
    assert [list(line.get_ydata()) for line in ax.lines] == [[1.0, 4.0, 16.0], [0.5, 0.6, 0.8]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["256", "512", "1024"]
    assert _axes(fig, "panel 1").get_ylabel() == "ms"
    assert _smallest_px_on_column(fig) >= 14
    with pytest.raises(ValueError, match=r"panels\['m'\]\['a'\]: 2 values for 3 x"):
        curves_figure([1, 2, 3], {"m": {"a": [1, 2]}}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="ylabel: expected 1 or 2 labels, got 3"):
        curves_figure([1], {"a": {"s": [1]}, "b": {"s": [1]}}, xlabel="x", ylabel=["1", "2", "3"])


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")
def test_chinese_figures_have_chinese_labels_in_a_cjk_font_or_say_which_to_install():
    x_keys, y_keys, x_q, w = _toy()
    installed = {f.name for f in font_manager.fontManager.ttflist} & set(CJK_FONTS[:-1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = kernel_regression_figure(
            x_keys, y_keys, x_q, {"预测": w @ y_keys}, {"权重": w}, lang="zh"
        )
    said = [str(c.message) for c in caught if "CJK font" in str(c.message)]
    assert bool(said) != bool(installed), (said, installed)  # a warning exactly when none is found
    if said:
        assert "fonts-noto-cjk" in said[0]
    texts = _texts(fig)
    assert all(t.get_fontfamily() == list(CJK_FONTS) for t in texts)
    shown = {t.get_text() for t in texts}
    assert {"查询", "键", "预测"} <= shown and "query" not in shown
