"""Teaching figures of tutorials 11-14: attention as a soft lookup, FlashAttention from
scratch, a small GPT on real text, linear attention. Same conventions as
`attnkit.viz.lessons` (a page's own tensors in, a matplotlib figure out, at most 9 inches
wide at 100 dpi, text ≥ 11 pt: ≥ 14 px on the site's 868 px column).

Every function takes ``lang="en" | "zh"``: the fixed labels come in that language, and Chinese
text is drawn with the first CJK font matplotlib finds (`CJK_FONTS`); with none installed a
warning names the font to install (the labels would show as boxes). Labels a caller passes
(series names, panel titles) are drawn as given. Every weights panel has a colour bar.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter
from torch import Tensor

from attnkit.viz.lessons import _WIDTH, FONT, _figure

__all__ = ["CJK_FONTS", "curves_figure", "kernel_regression_figure", "weights_figure"]

# matplotlib (>= 3.6) falls back glyph by glyph along the family list: Latin from DejaVu
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "DejaVu Sans")
_LANGS = ("en", "zh")
_TEXT = {
    "en": {
        "keys": "keys (training points)",
        "truth": "truth f(x)",
        "x": "x",
        "y": "y",
        "query": "query",
        "key": "key",
        "weight": "attention weight",
        "lookup": "predictions",
    },
    "zh": {
        "keys": "键（训练样本）",
        "truth": "真实函数 f(x)",
        "x": "x",
        "y": "y",
        "query": "查询",
        "key": "键",
        "weight": "注意力权重",
        "lookup": "预测",
    },
}


def _check_lang(lang: str) -> dict[str, str]:
    if lang not in _LANGS:
        raise ValueError(f"lang: expected one of {_LANGS}, got {lang!r}")
    return _TEXT[lang]


def _styled(fig: Figure, lang: str) -> Figure:
    """Give every text of a Chinese figure the CJK family list (once it is drawn)."""
    if lang != "zh":
        return fig
    from matplotlib import font_manager
    from matplotlib.text import Text

    installed = {f.name for f in font_manager.fontManager.ttflist}
    if not installed & set(CJK_FONTS[:-1]):
        warnings.warn(
            "no CJK font found (one of Noto Sans CJK SC, Source Han Sans SC, WenQuanYi Zen "
            "Hei; Debian: apt-get install fonts-noto-cjk): Chinese labels show as boxes",
            stacklevel=3,
        )
    for text in fig.findobj(Text):
        text.set_fontfamily(list(CJK_FONTS))
    return fig


def _constrained(height: float) -> Figure:
    """A page-wide figure whose layout makes room for colour bars and legends."""
    fig = _figure(_WIDTH, height)
    fig.set_layout_engine("constrained")
    return fig


def _heatmap(fig: Figure, ax, m: Tensor, title: str, text: dict, *, vmax: float | None) -> None:
    """One weights matrix (queries × keys) with its colour bar."""
    image = ax.imshow(
        m.detach().double().cpu().numpy(),
        cmap="Blues",
        vmin=0.0,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
    )
    ax.set_title(title, fontsize=FONT + 1)
    ax.set_xlabel(text["key"], fontsize=FONT)
    ax.set_ylabel(text["query"], fontsize=FONT)
    ax.tick_params(labelsize=FONT)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.02)
    bar.ax.tick_params(labelsize=FONT)


def kernel_regression_figure(
    x_keys: Tensor,
    y_keys: Tensor,
    x_queries: Tensor,
    predictions: Mapping[str, Tensor],
    weights: Mapping[str, Tensor],
    *,
    truth: Tensor | None = None,
    lang: str = "en",
) -> Figure:
    """Attention pooling on a 1-D toy (Nadaraya 1964, Watson 1964; d2l §11.2).

    Args:
        x_keys, y_keys: the training points (S,): keys and values.
        x_queries: where the predictions are made (N,).
        predictions: name -> predicted y at the queries (N,), one line each.
        weights: name -> attention weights (N, S), one heat map each (rows sum to 1).
        truth: the true function at the queries (N,), drawn dashed.
        lang: "en" or "zh" for the fixed labels.

    Left: the points and the curves. Right: each weights matrix with a colour bar; the keys
    are sorted when `x_keys` is, so a sharp kernel shows as a narrow diagonal band.
    """
    text = _check_lang(lang)
    s, n = x_keys.shape[0], x_queries.shape[0]
    for name, w in weights.items():
        if tuple(w.shape) != (n, s):
            raise ValueError(f"weights[{name!r}]: expected ({n}, {s}), got {tuple(w.shape)}")
    for name, p in predictions.items():
        if tuple(p.shape) != (n,):
            raise ValueError(f"predictions[{name!r}]: expected ({n},), got {tuple(p.shape)}")
    fig = _constrained(4.6)
    axes = fig.subplots(1, 1 + len(weights), width_ratios=[1.25] + [1.0] * len(weights))
    ax = axes[0]
    ax.set_label("curves")
    ax.plot(x_keys.cpu().numpy(), y_keys.cpu().numpy(), "o", ms=4, alpha=0.6, label=text["keys"])
    if truth is not None:
        ax.plot(x_queries.cpu().numpy(), truth.cpu().numpy(), "k--", lw=1.5, label=text["truth"])
    for name, p in predictions.items():
        ax.plot(x_queries.cpu().numpy(), p.detach().cpu().numpy(), lw=2, label=name)
    ax.set_xlabel(text["x"], fontsize=FONT)
    ax.set_ylabel(text["y"], fontsize=FONT)
    ax.set_title(text["lookup"], fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    fig.legend(fontsize=FONT, loc="outside lower center", ncol=4, frameon=False)
    top = max(float(w.max()) for w in weights.values()) if weights else 1.0
    for i, (name, w) in enumerate(weights.items()):
        axes[i + 1].set_label(f"weights {i}")
        _heatmap(fig, axes[i + 1], w, name, text, vmax=top)
    return _styled(fig, lang)


def weights_figure(
    weights: Mapping[str, Tensor],
    *,
    title: str | None = None,
    lang: str = "en",
) -> Figure:
    """Attention weights side by side, one heat map (queries × keys) and colour bar each.

    Args:
        weights: panel title -> weights (N, S); at most four panels.
        title: above the panels.
        lang: "en" or "zh" for the axis labels.

    All panels share one colour scale from 0 to the largest weight, so a blurred map and a
    sharp one compare at a glance.
    """
    text = _check_lang(lang)
    if not 1 <= len(weights) <= 4:
        raise ValueError(f"weights: expected 1 to 4 matrices, got {len(weights)}")
    for name, w in weights.items():
        if w.dim() != 2:
            raise ValueError(f"weights[{name!r}]: expected (N, S), got {tuple(w.shape)}")
    fig = _constrained(3.6 + (0.4 if title else 0.0))
    axes = fig.subplots(1, len(weights), squeeze=False)[0]
    top = max(float(w.max()) for w in weights.values())
    for i, (name, w) in enumerate(weights.items()):
        axes[i].set_label(f"weights {i}")
        _heatmap(fig, axes[i], w, name, text, vmax=top)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    return _styled(fig, lang)


def curves_figure(
    x: Sequence[float] | Tensor,
    panels: Mapping[str, Mapping[str, Sequence[float] | Tensor]],
    *,
    xlabel: str,
    ylabel: str | Sequence[str],
    logx: bool = False,
    logy: bool = False,
    lang: str = "en",
) -> Figure:
    """Lines against a shared x: loss curves, time or memory against N.

    Args:
        x: the x values every series shares (K,).
        panels: panel title -> {series name -> values (K,)}; one to three panels.
        xlabel: under every panel; ylabel: one for all panels or one per panel.
        logx, logy: logarithmic axes (cost curves).
        lang: "en" or "zh" (the font of the labels).
    """
    _check_lang(lang)
    if not 1 <= len(panels) <= 3:
        raise ValueError(f"panels: expected 1 to 3, got {len(panels)}")
    xs = [float(t) for t in x]
    ylabels = [ylabel] * len(panels) if isinstance(ylabel, str) else list(ylabel)
    if len(ylabels) != len(panels):
        raise ValueError(f"ylabel: expected 1 or {len(panels)} labels, got {len(ylabels)}")
    fig = _constrained(4.0)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for i, (title, series) in enumerate(panels.items()):
        ax = axes[i]
        ax.set_label(f"panel {i}")
        for name, ys in series.items():
            values = [float(t) for t in ys]
            if len(values) != len(xs):
                raise ValueError(
                    f"panels[{title!r}][{name!r}]: {len(values)} values for {len(xs)} x"
                )
            ax.plot(xs, values, marker="o" if len(xs) <= 12 else None, lw=2, label=name)
        ax.set_xscale("log" if logx else "linear")
        if logx:  # ticks at the measured sizes, written out (not 2 × 10³)
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log" if logy else "linear")
        ax.set_title(title, fontsize=FONT + 1)
        ax.set_xlabel(xlabel, fontsize=FONT)
        ax.set_ylabel(ylabels[i], fontsize=FONT)
        ax.tick_params(labelsize=FONT, which="both")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=FONT, frameon=False)
    return _styled(fig, lang)
