"""Attention rollout (Abnar & Zuidema 2020) and class-token maps on images.

Dimensions: L layers, B batch, H heads, N tokens (class token first when
there is one), h × w patch grid (h·w patch tokens), I image side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.viz._lang import localize
from attnkit.viz.record import record_attention

__all__ = [
    "HEAD_FUSIONS",
    "ImageExplanation",
    "attention_rollout",
    "explain_images",
    "plot_explanations",
    "token_map",
]

HEAD_FUSIONS = ("mean", "max", "min")


def attention_rollout(
    maps: Tensor | Sequence[Tensor], *, head_fusion: str = "mean", discard_ratio: float = 0.0
) -> Tensor:
    """Roll attention through the layers: (L, B, H, N, N) or L × (B, H, N, N) -> (B, N, N).

    Per layer (Abnar & Zuidema 2020, §3): fuse the heads (mean, max or min),
    zero the `discard_ratio` fraction of smallest entries of each row (Gildenblat's
    variant; never the diagonal), add the identity for the residual connection,
    renormalise rows to sum to 1; then multiply the layers, first layer on the
    right: R = Â_L ··· Â_1. Row i of R is how much token i at the output draws
    on each input token; rows sum to 1. With one layer and no discard R = (A + I) / 2.
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    layers = list(maps)
    shapes = {tuple(a.shape) for a in layers}
    if not layers or len(shapes) != 1 or len(next(iter(shapes))) != 4:
        raise ValueError(
            f"maps must be L >= 1 maps of one shape (B, H, N, N), got shapes {sorted(shapes)}"
        )
    b, _, n, s = layers[0].shape
    if n != s:
        raise ValueError(f"rollout needs self-attention maps (B, H, N, N), got (B, H, {n}, {s})")
    eye = torch.eye(n, dtype=torch.float64, device=layers[0].device)
    rollout = eye.expand(b, n, n)
    for a in layers:
        fused = getattr(a.double(), head_fusion)(dim=1)  # (B, N, N)
        fused = fused.values if head_fusion != "mean" else fused
        drop = int(n * discard_ratio)
        if drop:
            order = fused.masked_fill(eye.bool(), float("inf")).argsort(dim=-1)  # (B, N, N)
            fused = fused.scatter(-1, order[..., :drop], 0.0)  # smallest off-diagonal -> 0
        fused = fused + eye
        fused = fused / fused.sum(-1, keepdim=True)
        rollout = fused @ rollout  # (B, N, N)
    return rollout.to(layers[0].dtype)


def token_map(rows: Tensor, grid: tuple[int, int], *, class_token: bool) -> Tensor:
    """Relevance of each patch on the grid: (..., N, N) -> (..., h, w).

    With a class token: its row (query 0) over the patch keys 1..N-1.
    Without: the mean over all query rows (for mean-pooled models).
    """
    h, w = grid
    patches = rows[..., 0, 1:] if class_token else rows.mean(-2)  # (..., h·w)
    if patches.shape[-1] != h * w:
        raise ValueError(
            f"grid {h}×{w} needs {h * w} patch tokens (+1 class token: {class_token}), "
            f"got maps with N = {rows.shape[-1]}"
        )
    return patches.unflatten(-1, (h, w))  # (..., h, w)


def query_map(weights: Tensor, query: tuple[int, int], grid: tuple[int, int]) -> Tensor:
    """Where one grid position looks: weights (B, H, P, P) over a row-major h × w grid
    (P = h·w, e.g. `SelfAttention2d`'s recorded maps) -> (B, H, h, w) for query (row, col)."""
    h, w = grid
    row, col = query
    if weights.dim() != 4 or weights.shape[-1] != h * w or weights.shape[-2] != h * w:
        raise ValueError(
            f"weights must have shape (B, H, {h * w}, {h * w}) for a {h}×{w} grid, "
            f"got {tuple(weights.shape)}"
        )
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"query {query} is outside the {h}×{w} grid")
    return weights[:, :, row * w + col].unflatten(-1, (h, w))  # (B, H, h, w)


def overlay(ax, image, heat: Tensor) -> None:
    """Draw `heat` (h, w), upsampled bilinearly and scaled to its maximum, over `image`
    (a 2-D array already at display size) on the matplotlib axes `ax`."""
    side = image.shape[-2:]
    big = F.interpolate(heat[None, None].float(), size=tuple(side), mode="bilinear")
    big = (big[0, 0] / big.max().clamp_min(1e-12)).numpy()  # (side) in [0, 1]
    ax.imshow(image, cmap="gray", vmin=0)
    ax.imshow(big, cmap="inferno", alpha=0.6, vmin=0, vmax=1)


def plot_query_attention(
    image: Tensor, maps: Tensor, query: tuple[int, int], path: str | Path, *, title: str = ""
) -> Path:
    """PNG: the input and, per head, where the query position (row, col) attends.

    image (h_img, w_img) intensities; maps (H, h, w) from `query_map`; the query
    is marked with a cross. Written atomically.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from attnkit._io import atomic_save_figure

    heads, h, w = maps.shape
    img = image.float().numpy()
    fig = Figure(figsize=(2.2 * (1 + heads), 2.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 1 + heads, squeeze=False)[0]
    axes[0].imshow(img, cmap="gray")
    axes[0].set_title("input", fontsize=9)
    for i in range(heads):
        overlay(axes[i + 1], img, maps[i])
        axes[i + 1].set_title(f"head {i}", fontsize=9)
    y = (query[0] + 0.5) * img.shape[0] / h - 0.5  # query centre in image pixels
    x = (query[1] + 0.5) * img.shape[1] / w - 0.5
    for ax in axes:
        ax.plot([x], [y], marker="x", color="cyan", markersize=9, mew=2)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title or f"attention of position {query} (cross)", fontsize=10)
    fig.tight_layout()
    return atomic_save_figure(path, fig)


@dataclass
class ImageExplanation:
    """What `explain_images` returns."""

    heads: Tensor  # (B, H, h, w) last layer's class-token (or mean) attention per head
    rollout: Tensor  # (B, h, w) attention rollout through all layers
    logits: Tensor | None  # (B, K); None for a model without a classifier


@torch.no_grad()
def explain_images(
    model: nn.Module,
    images: Tensor,
    *,
    grid: tuple[int, int],
    class_token: bool,
    prefix: str = "blocks.",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> ImageExplanation:
    """Run `model` on images (B, Ci, I, I) while recording the attention of the modules
    under `prefix` (the encoder blocks; a T2T embedding's attention is left out)."""
    model.eval()
    with record_attention(model) as rec:
        logits = model(images)
    maps = rec.stack(prefix)  # (L, B, H, N, N)
    rollout = attention_rollout(maps, head_fusion=head_fusion, discard_ratio=discard_ratio)
    return ImageExplanation(
        heads=token_map(maps[-1], grid, class_token=class_token),
        rollout=token_map(rollout, grid, class_token=class_token),
        logits=logits,
    )


def plot_explanations(
    images: Tensor,
    explanation: ImageExplanation,
    labels: Tensor | None,
    path: str | Path,
    *,
    title: str = "",
    upsample: int = 8,
    lang: str = "en",
) -> Path:
    """A PNG grid, one row per image: input | rollout | head 1 ... head H, written atomically.

    images (B, I, I) raw intensities; each map (h, w) is bilinearly upsampled
    to (I·upsample)² and laid over the image; row titles give the prediction (and the
    true label, when `labels` (B,) is given).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attnkit._io import atomic_save_figure

    b, side = images.shape[0], images.shape[-1] * upsample
    heads = explanation.heads.shape[1]
    pred = None if explanation.logits is None else explanation.logits.argmax(-1)  # (B,)
    big = F.interpolate(images[:, None].float(), size=(side, side), mode="nearest")[:, 0].numpy()
    columns = [("rollout", explanation.rollout)]
    columns += [(f"head {i}", explanation.heads[:, i]) for i in range(heads)]
    fig, axes = plt.subplots(
        b, 1 + len(columns), figsize=(1.6 * (1 + len(columns)), 1.75 * b + 0.5), squeeze=False
    )
    for r in range(b):
        ax = axes[r, 0]
        ax.imshow(big[r], cmap="gray", vmin=0)
        if pred is None:  # a model without a classifier
            ax.set_title("input", fontsize=10)
        elif labels is None:
            ax.set_title(f"predicted class {int(pred[r])}", fontsize=10)
        else:
            ok = bool(pred[r] == labels[r])
            ax.set_title(
                f"pred {int(pred[r])} / true {int(labels[r])}",
                fontsize=10,
                color="darkgreen" if ok else "crimson",
            )
        for c, (name, maps) in enumerate(columns, start=1):
            overlay(axes[r, c], big[r], maps[r])
            if r == 0:
                axes[r, c].set_title(name, fontsize=10)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    if title:
        fig.suptitle(title, fontsize=11)
    h, w = explanation.rollout.shape[-2:]
    note = (
        f"bright = more attention; each map is scaled to its own maximum; the {h}×{w} patch "
        "grid is upsampled bilinearly over the image"
    )
    # 10 pt at 110 dpi: 12.6 px, 11 px at the site's 868 px column for up to 6 columns
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=10, color="dimgray")
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    localize(fig, lang)
    plt.close(fig)
    return atomic_save_figure(path, fig, dpi=110)
