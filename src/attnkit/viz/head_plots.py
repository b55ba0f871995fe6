"""Per-head statistics as a picture: attention distance of every head, layer by layer.

The ViT paper's Fig. 7 (Dosovitskiy et al. 2021) plots each head's mean attention
distance against depth: early layers mix local and global heads, later ones are
mostly global. The same picture works for text (distance in tokens).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Protocol

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

__all__ = ["head_distance_figure"]


class HeadStatsLike(Protocol):
    """What the figure reads: `attnkit.analysis.HeadStats` has it. A protocol, not an import,
    so that viz (a lower layer) does not import analysis (DESIGN.md, "Layers")."""

    distance: Tensor  # (L, H) mean attention distance per head
    entropy: Tensor  # (L, H) mean attention entropy per head


def head_distance_figure(
    stats: HeadStatsLike,
    *,
    unit: str = "tokens",
    layer_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Scatter of mean attention distance (L, H) per head against layer, coloured by
    entropy, with the layer mean as a line. Returns a figure not registered with pyplot."""
    distance, entropy = stats.distance.float(), stats.entropy.float()  # (L, H) each
    layers, heads = distance.shape
    names = list(layer_names) if layer_names is not None else [str(i) for i in range(layers)]
    if len(names) != layers:
        raise ValueError(f"layer_names: expected {layers} names, got {len(names)}")
    width = 1.2 + 0.9 * max(layers, 6)  # inches
    fig = Figure(figsize=(width, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = torch.arange(layers, dtype=torch.float32)[:, None].expand(layers, heads)  # (L, H)
    jitter = torch.linspace(-0.18, 0.18, heads)[None, :]  # spread the heads of a layer
    points = ax.scatter(
        (x + jitter).flatten(), distance.flatten(), c=entropy.flatten(), cmap="viridis", s=28
    )
    ax.plot(range(layers), distance.mean(1), color="0.4", lw=1, label="mean over heads")
    fig.colorbar(points, ax=ax, label="entropy (nats)")
    ax.set_xticks(range(layers), names, rotation=30 if layers > 8 else 0)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean attention distance ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    wrap = int(width * 9)  # characters of a 10-pt title that fit the plot area
    ax.set_title(textwrap.fill(title or "Attention distance per head", wrap), fontsize=10)
    fig.tight_layout()
    return fig
