"""Teaching figures: attention drawn with the numbers of a tutorial's own example.

Each function takes the tensors a page has just computed and returns a matplotlib figure
(not registered with pyplot) whose panels print those numbers, rounded, in their cells.
Sizes suit a documentation page: at most 9 inches wide (900 px at 100 dpi) and no text
smaller than 11 pt, so text stays at 10 pt or more down to a page 820 px wide.

Dimensions: N queries (tokens), S keys, D head dimension, C channels, H heads.
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

__all__ = [
    "attention_row_figure",
    "attention_steps_figure",
    "channel_spatial_figure",
    "multi_head_figure",
    "soft_split_figure",
]

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
    return fig


def attention_row_figure(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    row: int,
    *,
    mask: Tensor | None = None,
    tokens: Sequence[str] | None = None,
    decimals: int = 2,
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
    return fig


def multi_head_figure(mha, x: Tensor, *, example: int = 0) -> Figure:
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

    def heat(ax, m: Tensor, title: str | None, cmap="RdBu_r", positive=False):
        m = m.detach().float()
        top = max(float(m.abs().max()), 1e-12)
        ax.imshow(
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
        heat(
            ax,
            res.weights[example, i],
            "softmax(qk$^T$/√D)\n(N, N) per head" if first else None,
            cmap="viridis",
            positive=True,
        )
        ax.set_ylabel(f"head {i}", fontsize=FONT, color=colors[i])
        heat(
            fig.add_subplot(grid[i, 3], label=f"out head {i}"),
            res.out[example, i],
            f"× v = out\n({b}, {h}, {n}, {d})" if first else None,
        )
        frame(fig.axes[-1], i)
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
    return fig


def soft_split_figure(
    image: Tensor, kernel_size: int, stride: int, padding: int = 0, *, windows=(0, 1)
) -> Figure:
    """How `nn.Unfold` cuts an image into tokens (ViT's patches, T2T's soft split).

    Args:
        image: one channel (height, width).
        kernel_size, stride, padding: those of `torch.nn.Unfold` (stride < kernel_size:
            windows overlap, as in T2T; stride == kernel_size: ViT's patches).
        windows: the windows (token numbers) to outline, in row-major order.

    Left: the padded image with the chosen windows outlined. Middle: those windows. Right:
    the tokens (N, kernel_size²), one flattened window per row, the chosen rows marked in
    the same colours.
    """
    if image.dim() != 2:
        raise ValueError(f"image: expected (height, width), got {tuple(image.shape)}")
    unfold = torch.nn.Unfold(kernel_size, padding=padding, stride=stride)
    tokens = unfold(image[None, None].float())[0].T  # (N, k²)
    padded = torch.nn.functional.pad(image.float(), (padding,) * 4)  # (H + 2p, W + 2p)
    per_row = (padded.shape[1] - kernel_size) // stride + 1
    n = tokens.shape[0]
    fig = _figure(_WIDTH, 4.6)
    grid = fig.add_gridspec(
        1, 3, left=0.06, right=0.94, top=0.84, bottom=0.2, wspace=0.3, width_ratios=[1, 0.3, 1.2]
    )
    ax = fig.add_subplot(grid[0], label="image")
    ax.imshow(padded.numpy(), cmap="gray_r", interpolation="nearest")
    ax.set_title(
        f"image {tuple(image.shape)}, padding {padding}\n"
        f"{kernel_size}×{kernel_size} windows, stride {stride}",
        fontsize=FONT + 1,
    )
    ax.tick_params(labelsize=FONT)
    right = fig.add_subplot(grid[2], label="tokens")
    right.imshow(tokens.numpy(), cmap="gray_r", aspect="auto", interpolation="nearest")
    right.set_title(
        f"tokens (N, {kernel_size}·{kernel_size}) = {tuple(tokens.shape)}", fontsize=FONT + 1
    )
    right.set_xlabel("pixel of the window", fontsize=FONT)
    right.set_ylabel("token (window)", fontsize=FONT)
    right.tick_params(labelsize=FONT)
    tiles = grid[1].subgridspec(max(len(windows), 1), 1, hspace=0.45)
    handles, labels = [], []
    for i, w in enumerate(windows):
        if not 0 <= w < n:
            raise ValueError(f"windows: token {w} does not exist (N = {n})")
        top, left = (w // per_row) * stride, (w % per_row) * stride
        color = f"C{i + 1}"
        frame = Rectangle((left - 0.5, top - 0.5), kernel_size, kernel_size, fill=False, lw=2.5)
        frame.set(ec=color, gid=f"window-{w}")
        ax.add_patch(frame)
        tile = fig.add_subplot(tiles[i], label=f"window {w}")
        window = padded[top : top + kernel_size, left : left + kernel_size]  # (k, k)
        tile.imshow(window.numpy(), cmap="gray_r", vmin=0, vmax=max(float(padded.max()), 1e-12))
        tile.set_xticks([])
        tile.set_yticks([])
        tile.set_title(f"window {w}", fontsize=FONT, color=color)
        for spine in tile.spines.values():
            spine.set(ec=color, lw=2.5)
        # a marker right of row w (staggered so that neighbouring rows stay apart)
        x = kernel_size**2 + 1 + 2.2 * i
        right.plot(x, w, "<", color=color, ms=8, clip_on=False, gid=f"token-{w}")
        handles.append(Rectangle((0, 0), 1, 1, fc="none", ec=color, lw=2.5))
        labels.append(f"window {w} → row {w}")
    right.set_xlim(-0.5, kernel_size**2 - 0.5)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=FONT, frameon=False)
    overlap = max(kernel_size - stride, 0)
    fig.suptitle(
        f"{n} windows → {n} tokens; neighbours share {overlap} pixel columns", fontsize=FONT + 2
    )
    return fig


def channel_spatial_figure(
    channel: Tensor, spatial: Tensor, attention: Tensor | None = None, *, position=None
) -> Figure:
    """Channel gates, spatial gates and (optionally) one position's self-attention weights.

    Args:
        channel: gates (C,) in [0, 1], one per channel (SE).
        spatial: gates (H, W) in [0, 1], one per position (CBAM's spatial attention).
        attention: weights (H, W) of one query position over all positions; they sum to 1.
        position: (row, column) of that query, marked with a cross.
    """
    if channel.dim() != 1 or spatial.dim() != 2:
        raise ValueError(
            f"channel (C,), spatial (H, W): got {tuple(channel.shape)}, {tuple(spatial.shape)}"
        )
    panels = 3 if attention is not None else 2
    fig = _figure(_WIDTH, 3.8)
    grid = fig.add_gridspec(
        1,
        panels,
        left=0.06,
        right=0.93,
        top=0.8,
        bottom=0.14,
        wspace=0.45,
        width_ratios=[1.3] + [1] * (panels - 1),
    )
    ax = fig.add_subplot(grid[0], label="channel")
    ax.bar(range(channel.numel()), channel.detach().float().numpy(), width=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("channel", fontsize=FONT)
    ax.set_title(f"channel gates ({channel.numel()},)\nsigmoid: each in [0, 1]", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax = fig.add_subplot(grid[1], label="spatial")
    im = ax.imshow(spatial.detach().float().numpy(), cmap="magma", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046).ax.tick_params(labelsize=FONT)
    ax.set_title(f"spatial gates {tuple(spatial.shape)}\nsigmoid: each in [0, 1]", fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    if attention is not None:
        ax = fig.add_subplot(grid[2], label="attention")
        im = ax.imshow(attention.detach().float().numpy(), cmap="viridis", vmin=0)
        fig.colorbar(im, ax=ax, fraction=0.046).ax.tick_params(labelsize=FONT)
        if position is not None:
            ax.plot(position[1], position[0], "x", color="red", ms=10, mew=2.5)
        total = float(attention.double().sum())
        ax.set_title(f"attention of one position\nsoftmax: sum = {total:.2f}", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    return fig
