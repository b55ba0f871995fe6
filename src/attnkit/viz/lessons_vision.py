"""Teaching figures of the vision tutorials (03, 09): how an image becomes tokens, and which
weights channel, spatial and self-attention put on a feature map. Same conventions as
`attnkit.viz.lessons` (a page's own tensors in, a matplotlib figure out, text ≥ 11 pt)."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from attnkit.viz._lang import localize
from attnkit.viz.fonts import use_cjk_font
from attnkit.viz.lessons import _WIDTH, FONT, _figure

use_cjk_font(quiet=True)  # CJK labels (also the page's own) fall back to a CJK font

__all__ = ["channel_spatial_figure", "soft_split_figure"]


def soft_split_figure(
    image: Tensor,
    kernel_size: int,
    stride: int,
    padding: int = 0,
    *,
    windows=(0, 1),
    lang: str = "en",
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
    return localize(fig, lang)


def channel_spatial_figure(
    channel: Tensor, spatial: Tensor, attention: Tensor | None = None, *, position=None, lang="en"
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
    return localize(fig, lang)
