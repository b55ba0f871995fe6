"""Teaching figures: attention drawn with the numbers of a tutorial's own example.

Each function takes the tensors a page has just computed and returns a matplotlib figure
(not registered with pyplot) whose panels print those numbers, rounded, in their cells.
Sizes suit a documentation page: at most 9 inches wide (900 px at 100 dpi) and no text
smaller than 11 pt, so text stays at 10 pt or more down to a page 820 px wide.

Dimensions: N queries (tokens), S keys, D head dimension, C channels, H heads. The figures of
the vision tutorials (03, 09) are in `attnkit.viz.lessons_vision`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from attnkit.viz._lang import localize
from attnkit.viz.fonts import use_cjk_font

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["attention_row_figure", "attention_steps_figure", "multi_head_figure"]

FONT = 11.0  # pt: the smallest text of every figure here (>= 10 pt when shown 820 px wide)
_WIDTH = 9.0  # inches: the widest figure (900 px at 100 dpi)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _fmt(value: float, decimals: int) -> str:
    if math.isinf(value):
        return "−∞" if value < 0 else "∞"
    return f"{round(value, decimals) + 0.0:.{decimals}f}"  # + 0.0: no "-0.00"


def _matrix(
    ax: Axes,
    m: Tensor,
    title: str,
    *,
    max_cols: int = 3,
    decimals: int = 2,
    cmap: str = "RdBu_r",
    positive: bool = False,
    row_labels: Sequence[str] | None = None,
) -> None:
    """Draw the matrix `m` (R, K) as pale coloured cells with their values printed; columns
    past `max_cols` become one "…" column. Pale colours keep black text readable."""
    m = m.detach().double().cpu()
    rows, cols = m.shape
    shown = m[:, :max_cols]  # (R, ≤ max_cols)
    finite = shown[torch.isfinite(shown)]
    top = float(finite.abs().max()) if finite.numel() else 1.0
    top = max(top, 1e-12) * 1.6  # pale: the largest value gets 60% of the colour range
    vmin = 0.0 if positive else -top
    grid = shown.clone()
    grid[~torch.isfinite(grid)] = float("nan")  # masked cells stay white
    ax.imshow(grid.numpy(), cmap=cmap, vmin=vmin, vmax=top, aspect="auto")
    for i in range(rows):
        for j in range(shown.shape[1]):
            ax.text(
                j,
                i,
                _fmt(float(shown[i, j]), decimals),
                ha="center",
                va="center",
                fontsize=FONT,
                gid=f"cell-{i}-{j}",
            )
        if cols > max_cols:
            ax.text(max_cols - 0.5 + 0.35, i, "…", ha="center", va="center", fontsize=FONT)
    ax.set_xlim(-0.5, shown.shape[1] - 0.5 + (0.7 if cols > max_cols else 0))
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_xticks([])
    ax.set_yticks(range(rows), list(row_labels) if row_labels else [""] * rows, fontsize=FONT)
    ax.tick_params(length=0)
    ax.set_title(title, fontsize=FONT + 1)


def attention_steps_figure(
    x: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    tokens: Sequence[str] | None = None,
    max_cols: int = 2,
    decimals: int = 2,
    lang: str = "en",
) -> Figure:
    """The six steps of self-attention as eight small matrices with their numbers.

    Args:
        x: embeddings (N, C); q, k: (N, D) and (S, D); v: (S, Dv), the rows of one sentence.
        tokens: names of the N rows (default x1, x2, ...).
        max_cols: columns printed per matrix; wider ones end in a "…" column (the title
            gives the full shape).
        decimals: digits printed per value.

    Top row: X, Q = XW^Q, K = XW^K, V = XW^V. Bottom row: QKᵀ, QKᵀ/√D, A = softmax of each
    row, Z = AV. The scores, weights and outputs are computed here in float64 from q, k, v.
    """
    for name, t in (("x", x), ("q", q), ("k", k), ("v", v)):
        if t.dim() != 2:
            raise ValueError(f"{name}: expected a matrix (rows, columns), got {tuple(t.shape)}")
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0] or x.shape[0] != q.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, x {tuple(x.shape)}: "
            "need q (N, D), k (S, D), v (S, Dv), x (N, C)"
        )
    n, d = q.shape
    names = list(tokens) if tokens is not None else [f"x{i + 1}" for i in range(n)]
    scores = q.double() @ k.double().T  # (N, S)
    scaled = scores / math.sqrt(d)
    weights = scaled.softmax(-1)  # (N, S)
    z = weights @ v.double()  # (N, Dv)

    def shape(t: Tensor) -> str:
        return f"({t.shape[0]}, {t.shape[1]})"

    panels = [
        (x, f"0  X  {shape(x)}", False),
        (q, f"1  Q = XW$^Q$  {shape(q)}", False),
        (k, f"1  K = XW$^K$  {shape(k)}", False),
        (v, f"1  V = XW$^V$  {shape(v)}", False),
        (scores, f"2  QK$^T$  {shape(scores)}", False),
        (scaled, f"3  ÷ √{d} = {math.sqrt(d):g}", False),
        (weights, "4  A = softmax(row)", True),
        (z, f"5, 6  Z = AV  {shape(z)}", False),
    ]
    rows = max(n, 2)
    height = 1.9 + 0.75 * rows
    fig = _figure(_WIDTH, height)
    grid = fig.add_gridspec(
        2, 4, left=0.1, right=0.99, top=1 - 0.75 / height, bottom=0.04, hspace=0.75, wspace=0.12
    )
    for i, (m, title, positive) in enumerate(panels):
        ax = fig.add_subplot(grid[i // 4, i % 4], label=title.split("  ")[1])
        _matrix(
            ax,
            m,
            title,
            max_cols=max_cols,
            decimals=decimals,
            positive=positive,
            cmap="Blues" if positive else "RdBu_r",
            row_labels=names if i % 4 == 0 else None,
        )
    fig.suptitle(
        "Self-attention in six steps: softmax(QK$^T$/√d$_k$)V",
        fontsize=FONT + 2,
        y=1 - 0.12 / height,
        va="top",
    )
    return localize(fig, lang)


def attention_row_figure(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row: int,
    *,
    mask: Tensor | None = None,
    tokens: Sequence[str] | None = None,
    decimals: int = 2,
    lang: str = "en",
) -> Figure:
    """One query's path: the score grid, its row's softmax, and the weighted sum of values.

    Args:
        q: (N, D), k: (S, D), v: (S, Dv) of one sequence; scores are q·kᵀ/√D.
        row: the query to follow (its row of the grid is outlined).
        mask: boolean (N, S), True = may attend; masked scores show as −∞ and get weight 0.
        tokens: names of the keys (default 0, 1, ...).

    Left: the scaled scores (N, S). Middle: the weights of `row` (they sum to 1). Right:
    the values V (S, Dv), each row labelled with its weight, and under them the output
    z = Σ_j a_j v_j. Every number is computed here in float64.
    """
    n, d = q.shape
    s = k.shape[0]
    if k.shape[1] != d or v.shape[0] != s:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not 0 <= row < n:
        raise ValueError(f"row: expected 0 <= row < {n}, got {row}")
    scores = q.double() @ k.double().T / math.sqrt(d)  # (N, S)
    if mask is not None:
        if mask.shape != (n, s):
            raise ValueError(f"mask: expected ({n}, {s}), got {tuple(mask.shape)}")
        scores = scores.masked_fill(~mask.bool(), float("-inf"))
    weights = scores[row].softmax(-1)  # (S,)
    z = weights @ v.double()  # (Dv,)
    names = list(tokens) if tokens is not None else [str(j) for j in range(s)]

    fig = _figure(_WIDTH, 1.9 + 0.36 * max(n, s))
    grid = fig.add_gridspec(
        1,
        3,
        left=0.07,
        right=0.99,
        top=0.84,
        bottom=0.12,
        wspace=0.35,
        width_ratios=[max(s, 3), 4, max(v.shape[1], 3) + 1],
    )
    ax = fig.add_subplot(grid[0], label="scores")
    _matrix(
        ax,
        scores,
        f"1  scores QK$^T$/√{d}  ({n}, {s})",
        max_cols=s,
        decimals=1,
        row_labels=[str(i) for i in range(n)],
    )
    ax.add_patch(Rectangle((-0.5, row - 0.5), s, 1, fill=False, lw=2.5, ec="black"))
    ax.set_xticks(range(s), names, fontsize=FONT)
    ax.set_ylabel("query", fontsize=FONT)
    ax.set_xlabel("key", fontsize=FONT)

    ax = fig.add_subplot(grid[1], label="weights")
    ax.barh(range(s), weights.numpy(), color="tab:blue")
    for j, w in enumerate(weights.tolist()):
        ax.text(w + 0.02, j, _fmt(w, decimals), va="center", fontsize=FONT, gid=f"weight-{j}")
    ax.set_xlim(0, 1.35)
    ax.set_ylim(s - 0.5, -0.5)
    ax.set_yticks(range(s), names, fontsize=FONT)
    ax.set_xticks([0, 0.5, 1], ["0", "0.5", "1"], fontsize=FONT)
    ax.set_title(f"2  softmax of row {row}\n(sum = {float(weights.sum()):.2f})", fontsize=FONT + 1)

    inner = grid[2].subgridspec(2, 1, height_ratios=[s, 1.6], hspace=0.5)
    ax = fig.add_subplot(inner[0], label="values")
    _matrix(
        ax,
        v,
        f"3  values V  {tuple(v.shape)}",
        max_cols=v.shape[1],
        decimals=decimals,
        row_labels=[f"{_fmt(w, decimals)} ×" for w in weights.tolist()],
    )
    ax = fig.add_subplot(inner[1], label="output")
    _matrix(ax, z[None], f"z{row} = Σ weight × value", max_cols=v.shape[1], decimals=decimals)
    return localize(fig, lang)


def multi_head_figure(mha, x: Tensor, *, example: int = 0, lang: str = "en") -> Figure:
    """Split into heads, attend per head, concatenate, project: drawn for one example.

    Args:
        mha: an `attnkit.MultiHeadAttention` (self-attention, H heads of width D = C/H).
        x: its input (B, N, C).
        example: which of the B examples to draw.

    Columns: q (N, C) with its H slices of D channels outlined; q of each head (N, D); each
    head's attention map (N, N); each head's output (N, D); the concatenation (N, C); the
    module's output (N, C) after W_O. The maps are the module's own probabilities.
    """
    from attnkit.functional import attention

    if x.dim() != 3:
        raise ValueError(f"x: expected (B, N, C), got {tuple(x.shape)}")
    with torch.no_grad():
        q, k, v = mha.heads_qkv(x)  # (B, H, N, D) each
        res = attention(q, k, v, scale=mha.attend.scale, need_weights=True, backend="reference")
        concat = mha.merge_heads(res.out)  # (B, N, H·D)
        y = mha.proj(concat)  # (B, N, C)
    b, h, n, d = q.shape
    c = concat.shape[-1]
    q_flat = mha.merge_heads(q)[example]  # (N, C)
    fig = _figure(_WIDTH, 1.2 + 1.25 * h)
    grid = fig.add_gridspec(
        h,
        6,
        left=0.03,
        right=0.99,
        top=1 - 0.95 / (1.2 + 1.25 * h),
        bottom=0.6 / (1.2 + 1.25 * h),
        wspace=0.35,
        hspace=0.25,
    )

    def heat(ax, m: Tensor, title: str | None, cmap="RdBu_r", positive=False, top=None):
        m = m.detach().float()
        top = max(float(m.abs().max()), 1e-12) if top is None else top
        image = ax.imshow(
            m.numpy(),
            cmap=cmap,
            vmin=0 if positive else -top,
            vmax=top,
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_xticks([])
        ax.set_yticks([])
        if title:
            ax.set_title(title, fontsize=FONT)
        return image

    colors = [f"C{i}" for i in range(h)]

    def bands(ax):  # one coloured band per head's D channels, under the title
        for i in range(h):
            ax.add_patch(
                Rectangle(
                    (i * d - 0.5, n - 0.5), d, n / 16, fc=colors[i], clip_on=False, gid=f"band-{i}"
                )
            )
        ax.set_xlabel("channels", fontsize=FONT, labelpad=n / 16 * 72 * 5.2 / n + 2)

    def frame(ax, i):
        for spine in ax.spines.values():
            spine.set(ec=colors[i], lw=2)

    top_weight = max(float(res.weights[example].max()), 1e-12)
    maps: list[Axes] = []
    ax = fig.add_subplot(grid[:, 0], label="q")
    heat(ax, q_flat, f"q (B, N, C)\n= ({b}, {n}, {c})")
    bands(ax)
    ax.set_ylabel(f"{n} tokens", fontsize=FONT)
    for i in range(h):
        first = i == 0
        heat(
            fig.add_subplot(grid[i, 1], label=f"q head {i}"),
            q[example, i],
            f"(B, H, N, D)\n= ({b}, {h}, {n}, {d})" if first else None,
        )
        frame(fig.axes[-1], i)
        ax = fig.add_subplot(grid[i, 2], label=f"map {i}")
        image = heat(
            ax,
            res.weights[example, i],
            "softmax(qk$^T$/√D)\n(N, N) per head" if first else None,
            cmap="viridis",
            positive=True,
            top=top_weight,  # one scale for all heads: the colour bar below
        )
        maps.append(ax)
        ax.set_ylabel(f"head {i}", fontsize=FONT, color=colors[i])
        heat(
            fig.add_subplot(grid[i, 3], label=f"out head {i}"),
            res.out[example, i],
            f"× v = out\n({b}, {h}, {n}, {d})" if first else None,
        )
        frame(fig.axes[-1], i)
    bar = fig.colorbar(image, ax=maps, location="bottom", fraction=0.04, pad=0.02, aspect=12)
    bar.ax.tick_params(labelsize=FONT)
    bar.ax.set_label("colorbar")
    bar.set_ticks([0.0, top_weight], labels=["0", f"{top_weight:.2f}"])  # two: they fit
    ax = fig.add_subplot(grid[:, 4], label="concat")
    heat(ax, concat[example], f"concat (B, N, C)\n= ({b}, {n}, {c})")
    bands(ax)
    ax = fig.add_subplot(grid[:, 5], label="y")
    heat(ax, y[example], f"· W$^O$ + b = y\n({b}, {n}, {c})")
    ax.set_xlabel("channels", fontsize=FONT)
    fig.suptitle(
        f"Multi-head attention, {h} heads of D = {c}/{h} = {d}, example {example}",
        fontsize=FONT + 2,
    )
    return localize(fig, lang)
