"""Model view: a grid of heatmaps, layers (rows) × heads (columns), one colour scale.

Dimensions: L layers, H heads, N queries, S keys. Long inputs are pooled into at most
``max_tokens`` blocks per axis (queries averaged, keys summed so rows still sum to 1)
and the title says so, which keeps the picture's pixel size bounded.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnkit._io import atomic_write_bytes
from attnkit.viz._lang import localize
from attnkit.viz.fonts import use_cjk_font
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.raster import pool_tokens as _pool

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["model_view", "save_model_view"]

_MAX_WIDTH_IN = 22.0  # figure size caps (inches); at 100 dpi the PNG stays <= 2200 x 2000 px
_MAX_HEIGHT_IN = 20.0
_CELL_IN = 2.2  # preferred heatmap size when there is room (a 2 × 2 grid: 670 px wide)
_MIN_FONT_PT = 8.0  # below this, only every k-th token label is drawn (11 px at 100 dpi)


def model_view(
    maps: AttentionMaps,
    *,
    layers: int | Sequence[int] | None = None,
    heads: int | Sequence[int] | None = None,
    max_tokens: int = 64,
    title: str | None = None,
    cmap: str = "viridis",
    lang: str = "en",
) -> Figure:
    """Draw ``maps`` (L, H, N, S) as an L × H grid of (N, S) heatmaps.

    Args:
        maps: attention of one example.
        layers, heads: which to draw (see :meth:`AttentionMaps.select`); None draws all.
        max_tokens: if N or S is larger, that axis is pooled into ``max_tokens`` blocks
            of consecutive tokens: query blocks are averaged and key blocks summed, so
            each drawn row is still a distribution. The title states the pooling.
        title: figure title (default "Attention maps").
        cmap: matplotlib colour map; 0 and the largest drawn weight span the scale.

    Returns a figure not registered with pyplot (nothing to close; no display needed).
    Query tokens label the left column, key tokens the bottom row.
    """
    if not isinstance(maps, AttentionMaps):
        raise ValueError(f"maps: expected AttentionMaps, got {type(maps).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected an int >= 1, got {max_tokens!r}")
    sel = maps.select(layers, heads)
    L, H, N, S = sel.shape
    data, q_labels, q_block = _pool(sel.maps, sel.tokens, dim=2, max_blocks=max_tokens, op="mean")
    data, k_labels, k_block = _pool(
        data, sel.key_tokens or sel.tokens, dim=3, max_blocks=max_tokens, op="sum"
    )
    n, s = data.shape[2], data.shape[3]  # data: (L, H, n, s)
    vmax = max(float(data.max()), 1e-6)

    label_w, label_h = 1.4, 1.2  # inches for token labels left of / below the grid
    extra_w, extra_h = label_w + 0.9, label_h + 1.0  # + colour bar / + title
    cell = min(  # inches per heatmap: big enough to read, small enough for the caps
        _CELL_IN * max(1.0, max(n, s) / 24),
        (_MAX_WIDTH_IN - extra_w) / H,
        (_MAX_HEIGHT_IN - extra_h) / L,
    )
    fig_w, fig_h = extra_w + cell * H, extra_h + cell * L
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    FigureCanvasAgg(fig)
    gs = fig.add_gridspec(
        L,
        H,
        left=label_w / fig_w,
        right=1 - 0.9 / fig_w,
        bottom=label_h / fig_h,
        top=1 - 1.0 / fig_h,
        wspace=0.08,
        hspace=0.12,
    )
    # Label every token when the font fits, else every k-th; size the font to the spacing.
    q_step = max(1, math.ceil(_MIN_FONT_PT * n / (cell * 72)))
    k_step = max(1, math.ceil(_MIN_FONT_PT * s / (cell * 72)))
    font = min(10.0, 0.9 * cell * 72 * min(q_step / n, k_step / s))
    image = None
    for li in range(L):
        for hi in range(H):
            ax = fig.add_subplot(gs[li, hi])
            image = ax.imshow(
                data[li, hi].numpy(),
                cmap=cmap,
                vmin=0.0,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if li == 0:
                ax.set_title(f"head {_orig(heads, maps.num_heads)[hi]}", fontsize=10, pad=3)
            if hi == 0:
                ax.set_yticks(range(0, n, q_step), q_labels[::q_step], fontsize=font)
                ax.set_ylabel(sel.names[li], fontsize=10)
            if li == L - 1:
                ax.set_xticks(range(0, s, k_step), k_labels[::k_step], fontsize=font, rotation=90)
    cax = fig.add_axes(
        (1 - 0.75 / fig_w, label_h / fig_h, 0.15 / fig_w, 1 - (1.0 + label_h) / fig_h),
        label="colorbar",
    )
    fig.colorbar(image, cax=cax).ax.tick_params(labelsize=10)

    note = [f"{N} queries × {S} keys"]
    if q_block > 1 or k_block > 1:
        note.append(
            f"pooled to {n} × {s} blocks of ≤{q_block} queries (mean) × ≤{k_block} keys (sum) "
            f"since max_tokens={max_tokens}"
        )
    fig.suptitle(
        f"{title or 'Attention maps'}\n{'; '.join(note)}",
        fontsize=11,
        y=1 - 0.15 / fig_h,
        va="top",
    )
    return localize(fig, lang)


def save_model_view(
    maps: AttentionMaps, path: str | os.PathLike[str], *, dpi: int = 100, **kwargs
) -> Path:
    """Render :func:`model_view` (``kwargs`` go to it) and write a PNG atomically."""
    fig = model_view(maps, **kwargs)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return atomic_write_bytes(path, buf.getvalue())


def _orig(index: int | Sequence[int] | None, size: int) -> list[int]:
    """Original head numbers of the drawn columns (for the column titles)."""
    if index is None:
        return list(range(size))
    return [i % size for i in ([index] if isinstance(index, int) else index)]
