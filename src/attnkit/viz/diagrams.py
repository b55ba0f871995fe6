"""Teaching figures: masks beside the attention weights they yield, the sinusoidal position
table, and the encoder-decoder Transformer as a data-flow diagram with its shapes.

Dimensions: B batch, N queries (target length T in the decoder), S keys (source length),
C model width, F feed-forward hidden width, V vocabulary. Masks are boolean, True = may
attend. Every function returns a matplotlib `Figure` (made with pyplot, so a notebook shows
it and `fig.savefig` writes it); the data drawn can be read back from the artists
(`ax.images[0].get_array()`, `ax.lines[i].get_ydata()`, the texts), which is what the tests do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attnkit._optional import require
from attnkit.viz._lang import localize
from attnkit.viz.fonts import use_cjk_font

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["plot_masks", "plot_positional_encoding", "plot_transformer"]

_ALLOWED, _BLOCKED = "#08519c", "#eeeeee"  # mask cells: may attend, blocked


def _plt():
    return require("matplotlib.pyplot", "viz", "drawing the tutorial figures")


def _matrix(name: str, what: str, t: Tensor) -> Tensor:
    """A 2-D (N, S) view of `t`: leading dimensions of size 1 are dropped."""
    if not isinstance(t, Tensor):
        raise ValueError(f"plot_masks: {what} {name!r} must be a tensor, got {type(t).__name__}")
    while t.dim() > 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2:
        raise ValueError(
            f"plot_masks: {what} {name!r} must be (N, S) (leading 1s allowed), got {tuple(t.shape)}"
        )
    return t.detach().cpu()


def _cells(ax: Axes, rows: int, cols: int) -> None:
    """Index ticks (every one up to 8, else every 4th) and thin lines between the cells."""
    ax.set_xticks(range(0, cols, 1 if cols <= 8 else 4))
    ax.set_yticks(range(0, rows, 1 if rows <= 8 else 4))
    ax.set_xticks([c - 0.5 for c in range(1, cols)], minor=True)
    ax.set_yticks([r - 0.5 for r in range(1, rows)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)


def plot_masks(
    masks: Mapping[str, Tensor],
    weights: Mapping[str, Tensor] | None = None,
    *,
    panel_size: float = 2.5,
    lang: str = "en",
) -> Figure:
    """Masks side by side, each over the attention weights it yields.

    Args:
        masks: title -> boolean mask (N, S), True = may attend (leading dimensions of size 1,
            as in a (1, 1, N, S) mask, are dropped). Drawn dark where a query may attend,
            light where the key is blocked; the top row of the figure.
        weights: title -> attention weights (N, S) for the same titles, drawn as a heat map
            (white = 0 up to the panel's largest weight, with its colour bar) in a second
            row. A blocked key's weight is exactly 0; a fully masked row is all 0.
        panel_size: inches per panel.

    Returns the figure; its axes are the masks left to right, then the weights.
    """
    plt = _plt()
    from matplotlib.colors import ListedColormap

    names = list(masks)
    if not names:
        raise ValueError("plot_masks: masks is empty")
    drawn = {n: _matrix(n, "mask", masks[n]) for n in names}
    if any(m.dtype != torch.bool for m in drawn.values()):
        bad = [n for n, m in drawn.items() if m.dtype != torch.bool]
        raise ValueError(f"plot_masks: masks must be boolean (True = may attend): {bad}")
    shown = {}
    if weights is not None:
        if set(weights) != set(names):
            raise ValueError(
                f"plot_masks: weights must have the masks' titles {names}, got {list(weights)}"
            )
        for n in names:
            w = _matrix(n, "weights", weights[n]).float()
            if w.shape != drawn[n].shape:
                raise ValueError(
                    f"plot_masks: weights {n!r} {tuple(w.shape)} differ from the mask's "
                    f"{tuple(drawn[n].shape)}"
                )
            shown[n] = w
    rows = 1 if weights is None else 2
    fig, axes = plt.subplots(
        rows,
        len(names),
        figsize=(panel_size * len(names), panel_size * rows + 0.3),
        squeeze=False,
    )
    for j, n in enumerate(names):
        m = drawn[n]
        ax = axes[0, j]
        ax.imshow(m.float().numpy(), cmap=ListedColormap([_BLOCKED, _ALLOWED]), vmin=0, vmax=1)
        ax.set_title(n, fontsize=11)
        _cells(ax, *m.shape)
        ax.set_xlabel("key", fontsize=10)
        if j == 0:
            ax.set_ylabel("mask\nquery", fontsize=10)
        if weights is None:
            continue
        ax = axes[1, j]
        w = shown[n]
        top = float(w.max()) if w.numel() and float(w.max()) > 0 else 1.0
        image = ax.imshow(w.numpy(), cmap="Oranges", vmin=0, vmax=top)
        # a colour bar per panel: its scale runs to the panel's largest weight
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=10)
        _cells(ax, *w.shape)
        ax.set_xlabel("key", fontsize=10)
        if j == 0:
            ax.set_ylabel("attention weights\nquery", fontsize=10)
    fig.tight_layout()
    return localize(fig, lang)


def plot_positional_encoding(
    pe: Tensor, *, starts: Sequence[int] = (0, 10, 30), max_offset: int = 16, lang: str = "en"
) -> Figure:
    """The position table as a heat map and its dot products against distance.

    Args:
        pe: the table (N, C), one row per position (e.g. `positional.sinusoidal(N, C)`).
        starts: positions p whose curve k -> PE[p]·PE[p + k] is drawn on the right (in
            float64). For the sinusoidal table the curves coincide: the dot product depends
            on the distance k only.
        max_offset: the largest k drawn; p + k must stay inside the table.

    Returns the figure: the heat map (positions down, dimensions across, values in [-1, 1]
    for a sin-cos table) and one line per start.
    """
    plt = _plt()
    if not isinstance(pe, Tensor) or pe.dim() != 2:
        got = tuple(pe.shape) if isinstance(pe, Tensor) else type(pe).__name__
        raise ValueError(f"plot_positional_encoding: pe must be (N, C), got {got}")
    n = pe.shape[0]
    if max_offset < 1 or any(p < 0 or p + max_offset >= n for p in starts):
        raise ValueError(
            f"plot_positional_encoding: starts {list(starts)} + max_offset {max_offset} "
            f"must stay inside the table's {n} positions"
        )
    table = pe.detach().cpu().double()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), width_ratios=(1.15, 1))
    image = left.imshow(table.float().numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    fig.colorbar(image, ax=left, fraction=0.05, pad=0.02)
    left.set_title(f"position table ({n} positions × {pe.shape[1]} dimensions)", fontsize=11)
    left.set_xlabel("dimension", fontsize=10)
    left.set_ylabel("position", fontsize=10)
    offsets = list(range(max_offset + 1))
    styles = ("-", "--", ":", "-.")
    for i, p in enumerate(starts):
        dots = [float(table[p] @ table[p + k]) for k in offsets]
        right.plot(offsets, dots, styles[i % len(styles)], marker="o", markersize=3,
                   linewidth=2.5 - i * 0.5, label=f"p = {p}")  # fmt: skip
    right.set_title("PE[p] · PE[p + k]", fontsize=11)
    right.set_xlabel("distance k", fontsize=10)
    right.set_ylabel("dot product", fontsize=10)
    right.legend(fontsize=10)
    right.grid(alpha=0.3)
    fig.tight_layout()
    return localize(fig, lang)


_W, _H, _PITCH = 3.0, 0.5, 0.78  # box width, box height, distance between boxes (data units)
_FILL = {
    "embed": "#fde0dd",
    "attn": "#fff2cc",
    "norm": "#e2f0d9",
    "ff": "#dae8fc",
    "out": "#e1d5e7",
}


class _Column:
    """One column of the diagram (encoder or decoder), built from the bottom up."""

    def __init__(self, ax: Axes, x: float, side: int) -> None:
        self.ax, self.x, self.side, self.y = ax, x, side, 0.4  # side: -1 residuals on the left
        self.centres: dict[str, float] = {}

    def text(self, label: str, shape: str | None = None, *, lift: float = 0.0) -> None:
        self.ax.text(self.x, self.y, label, ha="center", va="center", fontsize=11)
        self._shape(shape, self.y + lift)
        self.centres[label] = self.y

    def box(
        self, label: str, kind: str, shape: str | None = None, *, key: str | None = None
    ) -> float:
        """A box one step up; `shape` is written beside the arrow that leaves it."""
        from matplotlib.patches import FancyBboxPatch

        self.y += _PITCH
        patch = FancyBboxPatch((self.x - _W / 2, self.y - _H / 2), _W, _H,
                               boxstyle="round,pad=0,rounding_size=0.08",
                               facecolor=_FILL[kind], edgecolor="#555555", linewidth=1)  # fmt: skip
        self.ax.add_patch(patch)
        self.ax.text(self.x, self.y, label, ha="center", va="center", fontsize=10.5)
        self._arrow(self.y - _PITCH + _H / 2 + 0.02, self.y - _H / 2)
        self._shape(shape, self.y + _PITCH / 2)
        self.centres[key or label] = self.y
        return self.y

    def _arrow(self, y0: float, y1: float) -> None:
        self.ax.annotate("", (self.x, y1), (self.x, y0),
                         arrowprops={"arrowstyle": "->", "color": "#333333"})  # fmt: skip

    def _shape(self, shape: str | None, y: float) -> None:
        if shape is None:
            return
        self.ax.text(self.x + _W / 2 + 0.75, y, shape, ha="left", va="center", fontsize=10.5,
                     color="#444444", family="monospace")  # fmt: skip

    def sublayer(self, label: str, kind: str, pre_norm: bool, inner: str | None = None) -> None:
        """[LayerNorm ->] sublayer -> Add [& Norm], with the residual line around it; `inner`
        is written beside the sublayer's box."""
        start = self.y + _H / 2 + 0.1
        if pre_norm:
            self.box("LayerNorm", "norm", key=f"LayerNorm before {label}")
        self._shape(inner, self.box(label, kind))
        add = self.box("Add (x + ·)" if pre_norm else "Add & Norm", "norm", key=f"Add of {label}")
        rail = self.x + self.side * (_W / 2 + 0.35)
        edge = self.x + self.side * _W / 2
        self.ax.plot([self.x, rail, rail], [start, start, add], color="#c0504d", linewidth=1.5)
        red = {"arrowstyle": "->", "color": "#c0504d", "lw": 1.5}
        self.ax.annotate("", (edge, add), (rail, add), arrowprops=red)

    def frame(self, bottom: float, repeat: int) -> None:
        from matplotlib.patches import FancyBboxPatch

        top, pad = self.y + _H / 2 + 0.12, _W / 2 + 0.6
        self.ax.add_patch(FancyBboxPatch((self.x - pad, bottom), 2 * pad, top - bottom,
                                         boxstyle="round,pad=0,rounding_size=0.15",
                                         facecolor="none", edgecolor="#999999",
                                         linewidth=1.2, linestyle="--"))  # fmt: skip
        self.ax.text(self.x + self.side * (pad + 0.15), (bottom + top) / 2, f"{repeat}×",
                     ha="right" if self.side < 0 else "left", va="center", fontsize=14,
                     fontweight="bold")  # fmt: skip
        self.y = top - _H / 2 + 0.05


def plot_transformer(
    *,
    src_shape: tuple[int, int],
    tgt_shape: tuple[int, int],
    d_model: int,
    d_ff: int,
    vocab: int,
    num_heads: int,
    layers: tuple[int, int] = (6, 6),
    pre_norm: bool = False,
    lang: str = "en",
) -> Figure:
    """The encoder-decoder Transformer (Vaswani et al. 2017, Figure 1) as a data-flow diagram,
    with the shapes of the tensors that pass between the parts.

    Args:
        src_shape: (B, S) source token ids; tgt_shape: (B, T) the decoder's input ids.
        d_model, d_ff, vocab, num_heads: C, F, V and H.
        layers: (encoder blocks, decoder blocks), written as "N×" beside each stack.
        pre_norm: draw `x + sublayer(LayerNorm(x))` and a final LayerNorm per stack (as
            `TransformerConfig(norm_first=True)`) instead of the paper's post-norm
            `LayerNorm(x + sublayer(x))` ("Add & Norm").

    Encoder (left): tokens -> embedding + positions -> N× [self-attention, Add & Norm,
    feed-forward, Add & Norm] -> memory. Decoder (right): tokens -> embedding + positions ->
    N× [masked self-attention, Add & Norm, cross-attention (keys and values: the memory),
    Add & Norm, feed-forward, Add & Norm] -> linear -> softmax. Residual connections are the
    red lines around each sublayer.
    """
    plt = _plt()
    (b, s), (bt, t) = src_shape, tgt_shape
    if b != bt:
        raise ValueError(f"plot_transformer: batch sizes differ: src {src_shape}, tgt {tgt_shape}")
    fig, ax = plt.subplots(figsize=(11, 9.6 if pre_norm else 8.0))
    enc, dec = _Column(ax, 3.2, -1), _Column(ax, 11.0, +1)
    dims = {"C": d_model, "F": d_ff, "V": vocab, "H": num_heads}

    def shape(names: str, *sizes: int) -> str:
        return f"({names}) = ({', '.join(str(v) for v in sizes)})"

    enc.text("source tokens", shape("B, S", b, s))
    dec.text("target tokens (shifted right)", shape("B, T", b, t))
    enc.box("embedding + positions", "embed", shape("B, S, C", b, s, d_model))
    dec.box("embedding + positions", "embed", shape("B, T, C", b, t, d_model))
    bottom = enc.y + _H / 2 + 0.1
    enc.sublayer("self-attention", "attn", pre_norm)
    enc.sublayer("feed-forward C → F → C", "ff", pre_norm, shape("B, S, F", b, s, d_ff))
    enc.frame(bottom, layers[0])
    dec.sublayer("masked self-attention", "attn", pre_norm)
    dec.sublayer("cross-attention", "attn", pre_norm)
    dec.sublayer("feed-forward C → F → C", "ff", pre_norm, shape("B, T, F", b, t, d_ff))
    dec.frame(bottom, layers[1])
    if pre_norm:
        enc.box("LayerNorm", "norm", key="final LayerNorm")
        dec.box("LayerNorm", "norm", key="final LayerNorm")
    enc.y += _PITCH
    enc._arrow(enc.y - _PITCH + _H / 2 + 0.02, enc.y - 0.15)
    enc.text("memory", shape("B, S, C", b, s, d_model), lift=0.3)
    dec.box("linear C → V", "out", shape("B, T, V", b, t, vocab))
    dec.box("softmax", "out")
    dec.y += _PITCH
    dec._arrow(dec.y - _PITCH + _H / 2 + 0.02, dec.y - 0.15)
    dec.text("next-token probabilities")
    # The memory feeds every decoder block's cross-attention (its keys and values).
    cross, mem = dec.centres["cross-attention"], enc.centres["memory"]
    turn = 9.0
    ax.plot([enc.x + 0.75, turn, turn], [mem, mem, cross], color="#2f5597", linewidth=1.5)
    ax.annotate("", (dec.x - _W / 2, cross), (turn, cross),
                arrowprops={"arrowstyle": "->", "color": "#2f5597", "lw": 1.5})  # fmt: skip
    ax.text(turn + 0.08, (mem + cross) / 2, "keys, values", rotation=90, ha="left",
            va="center", fontsize=10.5, color="#2f5597")  # fmt: skip
    ax.text(1.0, dec.y, "encoder", fontsize=13, fontweight="bold", va="center")
    ax.text(16.3, dec.y, "decoder", fontsize=13, fontweight="bold", va="center", ha="right")
    legend = ", ".join(f"{k} = {v}" for k, v in dims.items())
    ax.text(8.25, -0.35, f"B batch, S source length, T target length, {legend}\n"
            "a shape is the tensor on the arrow beside it (beside a feed-forward: its hidden "
            "layer); red lines: residual connections", ha="center", va="center", fontsize=10.5,
            color="#444444", linespacing=1.5)  # fmt: skip
    ax.set_xlim(0, 16.5)
    ax.set_ylim(-0.75, dec.y + 0.4)
    ax.axis("off")
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1)
    return localize(fig, lang)
