"""Pictures of one head and of one layer, drawn with matplotlib for pages and papers.

Dimensions: L layers, H heads, N queries, S keys.

:func:`draw_head_lines` is the head view (bertviz's picture, the HTML of
:func:`attnkit.viz.head_view`) as a still image: queries in a column on the left, keys on
the right, a line from query i to key j whose opacity is the weight ``maps[l, h, i, j]``.
:func:`layer_view` is the model view of one layer, its heads in a grid of heatmaps large
enough to read the token labels.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from attnkit.viz._lang import check_lang, localize, translate
from attnkit.viz.fonts import use_cjk_font
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["draw_head_lines", "layer_view"]

_LEFT, _RIGHT = 0.3, 0.7  # x of the query and key columns, in axes coordinates


def draw_head_lines(
    ax: Axes,
    maps: AttentionMaps,
    layer: int,
    head: int,
    *,
    query: int | str | None = None,
    color: str = "C0",
    title: str | None = None,
    fontsize: float = 10.0,
    lang: str = "en",
) -> None:
    """Draw head ``head`` of layer ``layer`` on ``ax`` as lines from queries to keys.

    Args:
        ax: a matplotlib axes; its frame and ticks are turned off.
        maps: attention of one example, (L, H, N, S).
        layer, head: which map to draw (negative counts from the end).
        query: draw only this query's row: its index, or a token (the first occurrence).
            Its keys' labels are shaded by their weight. None draws every row.
        color: the lines' colour; each line's opacity is its weight (0 invisible, 1 solid).
        title: axes title (default "layer l, head h").
        fontsize: size of the token labels, in points.
        lang: the default title's language, "en" or "zh".
    """
    check_lang(lang)
    if not isinstance(maps, AttentionMaps):
        raise ValueError(f"maps: expected AttentionMaps, got {type(maps).__name__}")
    L, H, N, S = maps.shape
    for name, value, size in (("layer", layer, L), ("head", head, H)):
        if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
            raise ValueError(
                f"{name}: expected an int in [{-size}, {size}) for maps of shape {maps.shape}, "
                f"got {value!r}"
            )
    if isinstance(query, str):
        if query not in maps.tokens:
            raise ValueError(f"query: {query!r} is not one of the tokens {maps.tokens}")
        query = maps.tokens.index(query)
    elif query is not None and (
        isinstance(query, bool) or not isinstance(query, int) or not -N <= query < N
    ):
        raise ValueError(f"query: expected a token, an int in [{-N}, {N}) or None, got {query!r}")
    weights = maps.maps[layer, head].numpy()  # (N, S)
    rows = range(N) if query is None else [query % N]
    ys_q, ys_k = _column(N), _column(S)
    segments, colors = [], []
    r, g, b, _ = to_rgba(color)
    for i in rows:
        for j in range(S):
            w = float(np.clip(weights[i, j], 0.0, 1.0))
            if w >= 0.005:  # fainter lines are invisible anyway
                segments.append([(_LEFT + 0.02, ys_q[i]), (_RIGHT - 0.02, ys_k[j])])
                colors.append((r, g, b, w))
    ax.add_collection(LineCollection(segments, colors=colors, linewidths=2.0))
    for i, token in enumerate(token_labels(maps.tokens)):
        chosen = query is not None and i == query % N
        ax.text(
            _LEFT, ys_q[i], token, ha="right", va="center", fontsize=fontsize,
            fontweight="bold" if chosen else "normal", gid="token",
        )  # fmt: skip
    for j, token in enumerate(token_labels(maps.key_tokens or maps.tokens)):
        shade = None
        if query is not None:
            shade = {"facecolor": (r, g, b, 0.6 * weights[query % N, j]), "edgecolor": "none"}
        ax.text(_RIGHT, ys_k[j], token, ha="left", va="center", fontsize=fontsize, bbox=shade,
                gid="token")  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    default = translate(f"layer {layer % L}, head {head % H}", lang)
    ax.set_title(title or default, fontsize=fontsize + 1)


def _column(count: int) -> np.ndarray:
    """y of `count` labels from top to bottom, in axes coordinates."""
    return 1 - (np.arange(count) + 0.5) / max(count, 1)


def layer_view(
    maps: AttentionMaps,
    layer: int,
    *,
    columns: int = 3,
    title: str | None = None,
    panel_inches: float = 2.3,
    cmap: str = "viridis",
    lang: str = "en",
) -> Figure:
    """Draw every head of one layer as a heatmap, ``columns`` heads per row.

    Args:
        maps: attention of one example, (L, H, N, S).
        layer: which layer (negative counts from the end).
        columns: heads per row; the rows follow (H / columns, rounded up).
        title: figure title (default: the layer's name).
        panel_inches: size of each heatmap; 2.3 in at 100 dpi fits three heads with their
            labels in 870 pixels, the width of the site's column, so no text is shrunk
            below 11 px there.
        cmap: matplotlib colour map on the fixed scale 0..1, so layers compare.

    Queries run down, keys across. Query tokens label the left column and key tokens the
    bottom row. Returns a figure not registered with pyplot.
    """
    if not isinstance(maps, AttentionMaps):
        raise ValueError(f"maps: expected AttentionMaps, got {type(maps).__name__}")
    L, H, N, S = maps.shape
    if isinstance(layer, bool) or not isinstance(layer, int) or not -L <= layer < L:
        raise ValueError(f"layer: expected an int in [{-L}, {L}) for maps of shape {maps.shape}")
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns: expected an int >= 1, got {columns!r}")
    columns = min(columns, H)
    rows = math.ceil(H / columns)
    label, top, bar = 1.0, 0.6, 0.8  # inches: token labels, title, colour bar
    fig_w, fig_h = label + columns * panel_inches + bar, top + rows * panel_inches + label
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(
        rows, columns, left=label / fig_w, right=1 - bar / fig_w, bottom=label / fig_h,
        top=1 - top / fig_h, wspace=0.06, hspace=0.16,
    )  # fmt: skip
    font = min(10.0, 0.85 * panel_inches * 72 / max(N, S, 1))  # pt: rows no closer than that
    queries, keys = token_labels(maps.tokens), token_labels(maps.key_tokens or maps.tokens)
    image = None
    for h in range(H):
        ax = fig.add_subplot(grid[h // columns, h % columns])
        data = maps.maps[layer, h].numpy()  # (N, S)
        image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=10, pad=3)
        ax.set_xticks([])
        ax.set_yticks([])
        if h % columns == 0:
            ax.set_yticks(range(N), queries, fontsize=font)
        if h + columns >= H:  # nothing below it
            ax.set_xticks(range(S), keys, fontsize=font, rotation=90)
    cax = fig.add_axes(
        (1 - 0.6 / fig_w, label / fig_h, 0.15 / fig_w, 1 - (top + label) / fig_h),
        label="colorbar",
    )
    fig.colorbar(image, cax=cax).ax.tick_params(labelsize=10)
    fig.suptitle(title or maps.names[layer], fontsize=12, y=1 - 0.12 / fig_h, va="top")
    return localize(fig, lang)
