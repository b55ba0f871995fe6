"""The teaching figures print the numbers they are given, computed right, and stay legible."""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.text import Text

import attnkit
from attnkit.viz import lessons
from attnkit.viz.lessons import attention_row_figure, attention_steps_figure, multi_head_figure
from attnkit.viz.lessons_vision import channel_spatial_figure, soft_split_figure


def _axes(fig, label):
    found = [ax for ax in fig.axes if ax.get_label() == label]
    assert len(found) == 1, [ax.get_label() for ax in fig.axes]
    return found[0]


def _cells(ax) -> dict[tuple[int, int], float]:
    """The numbers a matrix panel prints, by (row, column)."""
    out = {}
    for t in ax.texts:
        gid = t.get_gid() or ""
        if gid.startswith("cell-"):
            i, j = map(int, gid.split("-")[1:])
            text = t.get_text().replace("−∞", "-inf")
            out[i, j] = float(text)
    return out


def _assert_prints(ax, m: torch.Tensor, cols: int, decimals: int = 2):
    cells = _cells(ax)
    assert set(cells) == {(i, j) for i in range(m.shape[0]) for j in range(cols)}
    for (i, j), shown in cells.items():
        want = float(m[i, j])
        if math.isinf(want):
            assert shown == want
        else:
            assert abs(shown - want) <= 0.5 * 10**-decimals + 1e-9, (ax.get_label(), i, j)


def _min_font(fig) -> float:
    """The smallest font of any text the figure shows (titles, labels, tick labels, cells)."""
    fig.canvas.draw()
    shown = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
    return min(t.get_fontsize() for t in shown)


def test_six_steps_print_the_computed_matrices():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 12, generator=g)
    w_q, w_k, w_v = (torch.randn(12, 5, generator=g) for _ in range(3))
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    fig = attention_steps_figure(x, q, k, v, tokens=["a", "b"], max_cols=3)
    # float64 truth, independent of the figure's own arithmetic
    scores = q.double() @ k.double().T
    weights = torch.softmax(scores / math.sqrt(5), -1)
    for label, m, cols in [
        ("X", x, 3),
        ("Q = XW$^Q$", q, 3),
        ("V = XW$^V$", v, 3),
        ("QK$^T$", scores, 2),
        ("A = softmax(row)", weights, 2),
        ("Z = AV", weights @ v.double(), 3),
    ]:
        _assert_prints(_axes(fig, label), m, cols)
    x_ax = _axes(fig, "X")
    assert "(2, 12)" in x_ax.get_title()  # the full shape, though 3 columns are printed
    assert sum(t.get_text() == "…" for t in x_ax.texts) == 2  # one per row: columns cut
    assert [t.get_text() for t in x_ax.get_yticklabels()] == ["a", "b"]
    assert "÷ √5" in _axes(fig, "÷ √5 = 2.23607").get_title()
    assert fig.get_size_inches()[0] * fig.dpi <= 900
    assert _min_font(fig) >= lessons.FONT


def test_row_figure_follows_one_query_through_a_causal_mask():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(5, 3, generator=g) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    fig = attention_row_figure(q, k, v, 2, mask=mask)
    ref = attnkit.attention(
        q.double()[None, None],
        k.double()[None, None],
        v.double()[None, None],
        causal=True,
        need_weights=True,
        backend="reference",
    )
    scores = (q.double() @ k.double().T / math.sqrt(3)).masked_fill(~mask, float("-inf"))
    _assert_prints(_axes(fig, "scores"), scores, 5, decimals=1)
    weights_ax = _axes(fig, "weights")
    shown = [float(t.get_text()) for t in weights_ax.texts if (t.get_gid() or "").startswith("w")]
    torch.testing.assert_close(
        torch.tensor(shown, dtype=torch.float64), ref.weights[0, 0, 2], atol=0.005, rtol=0
    )
    assert shown[3:] == [0.0, 0.0]  # the future keys of query 2 are masked out
    _assert_prints(_axes(fig, "output"), ref.out[0, 0, 2][None], 3)
    _assert_prints(_axes(fig, "values"), v, 3)
    with pytest.raises(ValueError, match="row: expected 0 <= row < 5"):
        attention_row_figure(q, k, v, 5)
    assert _min_font(fig) >= lessons.FONT


def test_multi_head_figure_draws_the_module_maps_and_output():
    torch.manual_seed(0)
    mha = attnkit.MultiHeadAttention(24, 3).eval()
    x = torch.randn(2, 7, 24)
    fig = multi_head_figure(mha, x, example=1)
    with attnkit.record_attention(mha) as rec, torch.no_grad():
        y = mha(x)
    for i in range(3):
        drawn = torch.tensor(_axes(fig, f"map {i}").images[0].get_array())
        torch.testing.assert_close(drawn, rec["attend"][1, i], check_dtype=False)
    torch.testing.assert_close(
        torch.tensor(_axes(fig, "y").images[0].get_array()), y[1], check_dtype=False
    )
    assert "(2, 3, 7, 8)" in _axes(fig, "q head 0").get_title()
    assert "(2, 7, 24)" in _axes(fig, "concat").get_title()
    assert len([p for p in _axes(fig, "q").patches if (p.get_gid() or "").startswith("band")]) == 3
    assert _min_font(fig) >= lessons.FONT


def test_soft_split_outlines_the_window_each_token_holds():
    image = torch.arange(100.0).reshape(10, 10)
    fig = soft_split_figure(image, 4, 2, 1, windows=(0, 5))
    tokens = torch.nn.functional.unfold(image[None, None], 4, padding=1, stride=2)[0].T
    drawn = torch.tensor(_axes(fig, "tokens").images[0].get_array())
    torch.testing.assert_close(drawn, tokens)  # (25, 16): 5 × 5 windows of 16 pixels
    window = {p.get_gid(): p for p in _axes(fig, "image").patches}["window-5"]
    top, left = int(window.get_y() + 0.5), int(window.get_x() + 0.5)  # in the padded image
    padded = torch.nn.functional.pad(image, (1, 1, 1, 1))
    torch.testing.assert_close(padded[top : top + 4, left : left + 4].flatten(), tokens[5])
    tile = torch.tensor(_axes(fig, "window 5").images[0].get_array())
    torch.testing.assert_close(tile.flatten(), tokens[5])  # the tile is the token's pixels
    marker = {line.get_gid(): line for line in _axes(fig, "tokens").lines}["token-5"]
    assert list(marker.get_ydata()) == [5]
    with pytest.raises(ValueError, match="token 25 does not exist"):
        soft_split_figure(image, 4, 2, 1, windows=(25,))


def test_channel_spatial_figure_draws_the_gates():
    channel, spatial = torch.rand(8), torch.rand(4, 5)
    attn = torch.softmax(torch.randn(20), 0).reshape(4, 5)
    fig = channel_spatial_figure(channel, spatial, attn, position=(1, 2))
    heights = [b.get_height() for b in _axes(fig, "channel").patches]
    torch.testing.assert_close(torch.tensor(heights), channel, check_dtype=False)
    drawn = torch.tensor(_axes(fig, "spatial").images[0].get_array())
    torch.testing.assert_close(drawn, spatial)
    assert "sum = 1.00" in _axes(fig, "attention").get_title()
    assert len(channel_spatial_figure(channel, spatial).axes) == 3  # 2 panels + colour bar
    with pytest.raises(ValueError, match="channel"):
        channel_spatial_figure(channel[None], spatial)
